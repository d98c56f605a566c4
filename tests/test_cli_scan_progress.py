"""``ascend-patch scan`` shows its progress on a terminal, and only there (issue 24).

A scan of transformers (~4 000 files) ran 132 s without a word. Files done / total and
the directory being read are now shown on stderr when stderr is a terminal (a pty
here), and wiped before the report; nothing in a pipe or with ``--json``.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"
FILES_PER_PACKAGE = 20


def _command(*args: str) -> list[str]:
    cmd = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "ascend_patch_core._cli"]
    return [*cmd, "scan", *args]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="200", TERM="xterm")
    env.pop("NO_COLOR", None)
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for package in ("pkg_a", "pkg_b"):
        (root / package).mkdir(parents=True)
        for i in range(FILES_PER_PACKAGE):
            (root / package / f"m{i}.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    return root


def _scan_on_a_tty(tmp_path: Path, *args: str) -> tuple[str, str, int]:
    """Run scan with stderr on a pseudo-terminal and stdout in a pipe: (stdout, tty, status)."""
    master, slave = pty.openpty()
    try:
        process = subprocess.Popen(
            _command(*args),
            cwd=tmp_path,
            env=_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
        )
    finally:
        os.close(slave)  # the child holds it now; reading master ends when the child exits
    stdout, _ = process.communicate(timeout=120)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return stdout.decode(), b"".join(chunks).decode(), process.returncode


def test_scan_shows_files_done_and_total_on_a_terminal(tmp_path: Path, project: Path) -> None:
    """On a tty, stderr shows 'scanning N/40 files  <dir>' and wipes it; the report on stdout is unchanged."""
    stdout, tty, status = _scan_on_a_tty(tmp_path, str(project))

    assert status == 0, tty
    total = 2 * FILES_PER_PACKAGE
    assert f"scanning 0/{total} files  pkg_a" in tty, repr(tty)
    assert f"scanning {total}/{total} files" in tty, repr(tty)
    # Wiped at the end: the last thing on the terminal is a carriage return after blanks.
    assert tty.endswith("\r") and tty.rstrip("\r").split("\r")[-1].strip() == "", repr(tty)
    assert "scanning" not in stdout and f"{total} files" in stdout


def test_scan_is_quiet_in_a_pipe_and_with_json(tmp_path: Path, project: Path) -> None:
    """No progress in a pipe; with --json none either, even on a terminal."""
    piped = subprocess.run(
        _command(str(project)),
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0 and piped.stderr == ""

    stdout, tty, status = _scan_on_a_tty(tmp_path, "--json", str(project))
    assert status == 0 and tty == ""
    assert json.loads(stdout)["files_scanned"] == 2 * FILES_PER_PACKAGE
