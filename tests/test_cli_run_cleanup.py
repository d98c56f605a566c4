"""``ascend-patch run --report`` leaves nothing in the temporary directory, however the run ends.

Runs that ended by SIGTERM, SIGKILL or ``os._exit`` (no exit handlers) left an empty
``/tmp/ascend-patch-run-*`` directory each: it was made at start for the children's
reports and removed by an exit handler. It is now made only by the first child that
reports, and that child starts a watcher that removes it when the main process ends.
Each test points ``TMPDIR`` at a directory of its own and looks there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"


def _env(tmp_path: Path, scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env.update(
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        TMPDIR=str(scratch),
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    return env


def _run(tmp_path: Path, program: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "prog.py").write_text(program)
    report = tmp_path / "run.json"
    done = subprocess.run(
        [str(CLI), "run", "--report", str(report), "prog.py"],
        env=_env(tmp_path, scratch),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, scratch, report


def _left_behind(scratch: Path, *, wait: float = 0.0) -> list[str]:
    """What is left in the temporary directory (after up to ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        left = sorted(p.name for p in scratch.iterdir())
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


ENDINGS = {
    "os._exit": ("import os\nos._exit(3)\n", 3),
    "SIGTERM": ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", -signal.SIGTERM),
    "SIGKILL": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", -signal.SIGKILL),
    "normal": ("print('done')\n", 0),
}


@pytest.mark.parametrize(("program", "status"), list(ENDINGS.values()), ids=list(ENDINGS))
def test_no_directory_is_left_whatever_ends_the_run(
    tmp_path: Path, program: str, status: int
) -> None:
    done, scratch, report = _run(tmp_path, program)

    assert done.returncode == status, done.stderr
    assert _left_behind(scratch) == []
    assert report.exists() == (status == 0)  # only a run that ran its exit handlers reports


# A child python (patched by the start hook) reports at its exit, then the main process
# dies without exit handlers.
WITH_CHILD = """
import os, signal, subprocess, sys
subprocess.run([sys.executable, "-c", "print('child')"], check=True)
parts = [p for p in os.listdir(os.environ["TMPDIR"]) if p.startswith("ascend-patch-run-")]
print(len(parts), flush=True)
{ending}
"""


@pytest.mark.parametrize(
    "ending", ["os._exit(0)", "os.kill(os.getpid(), signal.SIGKILL)", "sys.exit(0)"]
)
def test_the_childrens_reports_do_not_outlive_the_run(tmp_path: Path, ending: str) -> None:
    """A child reported (its directory exists while the main process runs); the main
    process then ends however it ends: the directory goes with it."""
    done, scratch, report = _run(tmp_path, WITH_CHILD.format(ending=ending))

    assert done.stdout.split() == ["child", "1"], done.stderr
    assert _left_behind(scratch, wait=30) == []
    if ending == "sys.exit(0)":
        roles = [p["role"] for p in json.loads(report.read_text())["processes"]]
        assert roles == ["main", "child"]


def test_a_child_whose_main_process_is_gone_leaves_nothing(tmp_path: Path) -> None:
    """A child that outlives the main process (started, then the main one exits at once)
    writes no report: nobody is left to read it."""
    program = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(2)'])\n"
    )
    done, scratch, _ = _run(tmp_path, program)

    assert done.returncode == 0, done.stderr
    time.sleep(4)  # the child has ended by now
    assert _left_behind(scratch) == []
