"""Where the commands' output cannot go, they say so in one line, as Unix tools do.

A closed pipe (``doctor --json | head``) is covered in tests/test_cli_scan.py and
tests/test_cli_doctor.py: a quiet exit with status 141. Here: a full device
(``> /dev/full``) and a standard output closed before start (``>&-``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


COMMANDS = [["doctor"], ["doctor", "--json"], ["report", "--json"], ["scan", "."], ["--version"]]
CLI = shutil.which("ascend-patch", path=str(Path(sys.executable).parent)) or "ascend-patch"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    return env


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_full_device_is_one_line_and_status_1(command: list[str], tmp_path: Path) -> None:
    """`ascend-patch doctor > /dev/full`: 'cannot write the output: No space left on device'."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [CLI, *command], stdout=full, stderr=subprocess.PIPE, text=True,
            cwd=tmp_path, env=_env(tmp_path), timeout=120,
        )  # fmt: skip

    assert done.returncode == 1
    assert done.stderr.startswith(f"ascend-patch {command[0]}".replace(" --version", "") + ": ")
    assert "cannot write the output: No space left on device" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_closed_standard_output_is_one_line_and_status_1(
    command: list[str], tmp_path: Path
) -> None:
    """`ascend-patch doctor >&-`: no traceback, one line naming the closed output."""
    done = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", CLI, *command], stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env=_env(tmp_path), timeout=120,
    )  # fmt: skip

    assert done.returncode == 1
    assert "cannot write the output: standard output is closed" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
