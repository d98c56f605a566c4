"""dev.py and devenv.py without nox: which sessions `dev.py test` runs, what it prints as
sessions start and end, and the layering of a session on the shared base environment."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # dev.py and devenv.py live at the top of the clone

import dev  # noqa: E402
import devenv  # noqa: E402


MMCV, SCATTER = (w for w in sorted(devenv.COMPILED, key=lambda w: w.session))
MMCV_WHEEL = "mmcv-2.1.0-cp311-cp311-linux_x86_64.whl"


def test_missing_wheels_reads_the_cache_for_the_pinned_torch(tmp_path):
    """A compiled wheel counts as cached in a folder for the pinned torch, local builds included."""
    assert devenv.missing_wheels((3, 11), tmp_path) == list(devenv.COMPILED)
    folder = tmp_path / f"torch-{devenv.torch_pin()}+cpu"
    folder.mkdir()
    (folder / MMCV_WHEEL).touch()
    assert devenv.missing_wheels((3, 11), tmp_path) == [SCATTER]
    assert devenv.missing_wheels((3, 12), tmp_path) == list(devenv.COMPILED)  # another Python
    # On a 3.10 python3 the mmcv session runs on a 3.11+ stack Python: its wheel counts.
    assert devenv.missing_wheels((3, 10), tmp_path) == [SCATTER]
    other = tmp_path / "torch-2.99.0+cpu"
    other.mkdir()
    (other / "torch_scatter-2.1.2-cp311-cp311-linux_x86_64.whl").touch()
    assert devenv.missing_wheels((3, 11), tmp_path) == [SCATTER]  # built for another torch


def test_compiled_wheel_sessions_are_ci_sessions_of_the_noxfile():
    """Each compiled wheel names a ci session the noxfile has, which installs that wheel."""
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    for wheel in devenv.COMPILED:
        assert re.search(rf'tags=\["ci"\]\)\ndef {wheel.session}\(', noxfile), wheel.session


def test_select_sessions_leaves_out_those_whose_wheel_is_not_cached():
    """`dev.py test` skips a session whose compiled wheel is missing, and says how to add it."""
    sessions = ["tests", "lint", "torch_plugin", "openmmlab_cpu_ops", "transformers_older"]
    chosen, notes = dev.select_sessions(sessions, [MMCV])
    assert chosen == ["tests", "lint", "torch_plugin", "transformers_older"]
    assert "skipping openmmlab_cpu_ops" in notes[0] and "mmcv==2.1.0" in notes[0]
    assert "python3 dev.py wheels" in notes[-1]
    assert dev.select_sessions(sessions, []) == (sessions, [])


def test_run_in_parallel_says_when_each_session_starts_and_ends(tmp_path, capsys):
    """Progress lines as it happens: start, a heartbeat while one runs long, the verdict and
    time at the end; a failed session's log is printed, a passed one's is not."""

    def runner(name: str, log: Path) -> int:
        log.write_text(f"log of {name}\n", encoding="utf-8")
        time.sleep(0.6 if name == "slow" else 0.01)
        return 1 if name == "broken" else 0

    code = dev.run_in_parallel(
        ["slow", "quick", "broken"], 2, runner=runner, logs=tmp_path, heartbeat=0.2
    )
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    assert "dev.py: [1/3] slow: started" in lines
    assert "dev.py: [2/3] quick: started" in lines
    assert any(line.startswith("dev.py: still running: slow (") for line in lines)
    # The end line carries the session's own number (as its start line) and the count done.
    assert any(
        re.match(r"dev\.py: \[2/3\] quick: passed in \d+ s \(.*; \d of 3 done\)$", line)
        for line in lines
    )
    assert any(re.match(r"dev\.py: \[\d/3\] broken: FAILED in \d+ s \(", line) for line in lines)
    assert "log of broken" in out and "log of quick" not in out
    # The start line comes before that session's end line.
    assert out.index("quick: started") < out.index("quick: passed")
    assert lines[-1] == "dev.py: 2 of 3 sessions passed"


def test_first_run_note_says_what_it_costs():
    """The up-front note names the download, the disk and the time."""
    note = dev.FIRST_RUN.format(disk=dev.FIRST_RUN_DISK_GB, minutes=dev.FIRST_RUN_MINUTES)
    assert "GB" in note and "min on 2 cores" in note and "CPU build" in note


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX venv layout")
def test_layer_puts_the_base_behind_the_session_packages(tmp_path):
    """A session sees the base's packages and commands (and runs the base's .pth files); its own win."""
    base = tmp_path / "base-site"
    extra = tmp_path / "extra"
    base.mkdir()
    extra.mkdir()
    (base / "from_base.py").write_text("WHERE = 'base'\ndef main():\n    print(WHERE)\n")
    info = base / "base_tool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: base-tool\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nbase-tool = from_base:main\n")
    (base / "shadowed.py").write_text("WHERE = 'base'\n")
    (base / "more.pth").write_text(f"{extra}\n")
    (extra / "from_pth.py").write_text("WHERE = 'pth'\n")
    session = tmp_path / "session"
    venv.EnvBuilder(with_pip=False).create(session)
    python = str(session / "bin" / "python")
    pth = devenv.layer(python, base)
    (pth.parent / "shadowed.py").write_text("WHERE = 'session'\n")
    # A session .pth that imports from the base (as the start hook of `ascend-patch run`
    # imports pluggy) runs after the layering one.
    (pth.parent / "_ascend_patch_hook.pth").write_text("import from_base\n")
    code = "import from_base, from_pth, shadowed; print(from_base.WHERE, from_pth.WHERE, shadowed.WHERE)"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["base", "pth", "session"]
    assert done.stderr == ""
    # The base's commands run on the session's interpreter (torchrun, pytest, ...).
    tool = subprocess.run([str(session / "bin" / "base-tool")], capture_output=True, text=True)
    assert (tool.returncode, tool.stdout) == (0, "base\n"), tool.stderr
    assert (session / "bin" / "base-tool").read_text().startswith(f"#!{python}\n")
