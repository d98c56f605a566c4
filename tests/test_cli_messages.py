"""What the commands say when something is off, run the way users run them (issue #22, item 11).

* a bad switch value: one verdict -- exit 2, one line, the same words -- from doctor,
  report, scan and run, and the same message from ``apply()``; never "strict mode";
* ``ASCEND_PATCH_EMULATED_DEVICES=99999999999``: a reason, and a bound;
* ``run --plugins torhc``: an error with "did you mean 'torch'?", without ``-v``;
* a script or scan path that cannot be reached: the OS's errno (EACCES, ENOTDIR), as
  ``python`` says it, not ENOENT;
* doctor's advice for a file in place of the cache directory and for a read-only one;
* doctor without torch: not "ok";
* run without torch_npu and without ``--emulate-npu``: one line saying the redirects are
  inactive and how to run under the emulator.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from bare_venv import make_bare_venv

from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher


BIN = Path(sys.executable).parent
CLI = BIN / "ascend-patch"


def cli(*args: str) -> list[str]:
    if CLI.exists():
        return [str(CLI), *args]
    return [sys.executable, "-m", "ascend_patch_core._cli", *args]


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(extra)
    return env


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def unprivileged(cmd: list[str]) -> list[str]:
    """``cmd`` run without root's power to ignore file permissions (EACCES is then real)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: permissions cannot be made to apply")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *cmd]


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """prog.py, which leaves a file behind when it runs."""
    path = tmp_path / "prog.py"
    path.write_text("open('ran', 'w').close()\nprint('ran')\n")
    return path


# ----------------------------------------------------------------------------- one verdict for a switch

SWITCHES = [
    ("ASCEND_PATCH_COUNT_CALLS", "maybe"),
    ("ASCEND_PATCH_STRICT", "maybe"),
    ("ASCEND_PATCH_AUTOLOAD", "sometimes"),
    ("ASCEND_PATCH_CACHE", "2"),
    ("ASCEND_PATCH_PLUGIN_TIMEOUT", "soon"),
]
COMMANDS = [
    ["doctor"],
    ["doctor", "--json"],
    ["report", "--json"],
    ["scan", "."],
    ["run", "prog.py"],
]


def apply_message(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> str:
    monkeypatch.setenv(name, value)
    patcher = Patcher(autoload=True)
    with pytest.raises(PatchDefinitionError) as raised:
        patcher.apply()
    patcher.revert()
    monkeypatch.delenv(name)
    return str(raised.value)


@pytest.mark.parametrize(("name", "value"), SWITCHES, ids=[n for n, _ in SWITCHES])
def test_a_bad_switch_gets_one_verdict_and_one_message_everywhere(
    name: str, value: str, tmp_path: Path, program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor, report, scan and run: exit 2, stdout empty, one stderr line -- apply()'s message --
    and run does not call it strict mode (COUNT_CALLS=maybe: doctor said "ok", run 1, report 2)."""
    message = apply_message(monkeypatch, name, value)
    assert f"{name}={value!r}" in message

    for command in COMMANDS:
        done = run(cli(*command), tmp_path, clean_env(tmp_path, **{name: value}))

        assert (done.returncode, done.stdout) == (2, ""), (command, done.stdout, done.stderr)
        assert done.stderr == f"ascend-patch {command[0]}: {message}\n", command
        assert "strict" not in done.stderr.replace("ASCEND_PATCH_STRICT", ""), done.stderr
    assert not (tmp_path / "ran").exists()


def test_several_bad_switches_are_named_together(tmp_path: Path) -> None:
    env = clean_env(tmp_path, ASCEND_PATCH_COUNT_CALLS="maybe", ASCEND_PATCH_CACHE="perhaps")
    done = run(cli("doctor"), tmp_path, env)

    assert done.returncode == 2
    assert "ASCEND_PATCH_COUNT_CALLS='maybe'" in done.stderr
    assert "ASCEND_PATCH_CACHE='perhaps'" in done.stderr


CONFLICTING = """
from ascend_patch_core import AtomicPatch, Patch, hookimpl


class Fast(Patch):
    conflicts_with = ("Exact",)

    @classmethod
    def patches(cls, options=None):
        return [AtomicPatch("json.dumps", lambda *a, **k: "fast")]


class Exact(Patch):
    @classmethod
    def patches(cls, options=None):
        return [AtomicPatch("json.loads", lambda *a, **k: "exact")]


@hookimpl
def register_patches():
    return [Fast, Exact]
"""


def test_an_error_apply_raises_outside_strict_mode_is_not_called_strict(
    tmp_path: Path, program: Path
) -> None:
    """apply() raises for conflicting groups whether strict or not: run says what is wrong, exit 2,
    instead of "strict mode stopped the program" and "run without --strict"."""
    site = tmp_path / "site"
    info = site / "apx_conflicting-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-conflicting\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ascend_patch]\napx_conflicting = apx_conflicting\n")
    (site / "apx_conflicting.py").write_text(CONFLICTING)
    env = clean_env(tmp_path, PYTHONPATH=str(site), ASCEND_PATCH_PLUGINS="apx_conflicting")

    done = run(cli("run", "prog.py"), tmp_path, env)

    assert done.returncode == 2 and not (tmp_path / "ran").exists(), done.stderr
    assert done.stderr.startswith("ascend-patch run: patch groups 'Fast' and 'Exact' conflict")
    assert "strict" not in done.stderr, done.stderr


# ----------------------------------------------------------------------------- run --plugins torhc


def test_run_plugins_with_a_typo_is_an_error_with_did_you_mean(
    tmp_path: Path, program: Path
) -> None:
    """--plugins torhc used to run the program with no plugin at all, silently."""
    done = run(cli("run", "--plugins", "torhc", "prog.py"), tmp_path, clean_env(tmp_path))

    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert not (tmp_path / "ran").exists()
    line = done.stderr.strip()
    assert line.startswith(
        "ascend-patch run: --plugins names 'torhc', which is not an installed plugin"
    )
    assert "(did you mean 'torch'?" in line and "torch" in line.rpartition("installed: ")[2]


def test_the_plugins_variable_with_a_typo_is_named_as_the_variable(
    tmp_path: Path, program: Path
) -> None:
    env = clean_env(tmp_path, ASCEND_PATCH_PLUGINS="torch,mmvc")
    done = run(cli("run", "prog.py"), tmp_path, env)

    assert done.returncode == 2 and not (tmp_path / "ran").exists()
    assert "ASCEND_PATCH_PLUGINS names 'mmvc'" in done.stderr
    assert "did you mean 'mmcv'?" in done.stderr


@pytest.mark.torch  # the torch plugin is idle without torch: its groups, its note
def test_run_says_a_disable_typo_without_verbose(tmp_path: Path, program: Path) -> None:
    """A --disable name that matches nothing: the program runs, and one stderr line says so."""
    done = run(cli("run", "--disable", "CudaAip", "prog.py"), tmp_path, clean_env(tmp_path))

    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    warnings = [line for line in done.stderr.splitlines() if "CudaAip" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith("ascend-patch run: warning: ")
    assert "(did you mean 'CudaApi'?)" in warnings[0]


# ----------------------------------------------------------------------------- emulated devices


@pytest.mark.torch
def test_a_huge_emulated_device_count_is_refused_with_a_reason(
    tmp_path: Path, program: Path
) -> None:
    """ASCEND_PATCH_EMULATED_DEVICES=99999999999 used to exit 2 with "--emulate-npu: " and nothing
    after it (a MemoryError building per-device state)."""
    env = clean_env(tmp_path, ASCEND_PATCH_EMULATED_DEVICES="99999999999")
    done = run(cli("run", "--emulate-npu", "prog.py"), tmp_path, env)

    assert done.returncode == 2 and not (tmp_path / "ran").exists()
    assert done.stderr.startswith("ascend-patch run: --emulate-npu: ASCEND_PATCH_EMULATED_DEVICES")
    assert "'99999999999'" in done.stderr and "at most 128" in done.stderr

    option = run(
        cli("run", "--emulate-npu", "--emulated-devices", "200", "prog.py"),
        tmp_path,
        clean_env(tmp_path),
    )
    assert option.returncode == 2
    assert "--emulated-devices must be a positive number, at most 128" in option.stderr


def test_an_emulator_error_without_a_message_still_gives_a_reason(
    tmp_path: Path, program: Path
) -> None:
    """An emulator that fails with an exception that has no text: its type is the reason."""
    site = tmp_path / "site"
    info = site / "apx_fake_emulator-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-fake-emulator\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[ascend_patch.emulator]\ntorch_npu = apx_fake_emulator:activate\n"
    )
    (site / "apx_fake_emulator.py").write_text(
        "def activate(version=None):\n    raise MemoryError\n"
    )

    done = run(
        cli("run", "--emulate-npu", "prog.py"), tmp_path, clean_env(tmp_path, PYTHONPATH=str(site))
    )

    assert done.returncode == 2 and not (tmp_path / "ran").exists()
    assert done.stderr == "ascend-patch run: --emulate-npu: MemoryError\n"


# ----------------------------------------------------------------------------- errno kept


def python_says(tmp_path: Path, script: str) -> str:
    """What python itself prints after "can't open file" for ``script``."""
    done = run(unprivileged([sys.executable, script]), tmp_path, clean_env(tmp_path))
    assert done.returncode == 2
    return done.stderr.partition("can't open file ")[2]


def test_a_script_in_a_directory_you_may_not_enter_is_permission_denied(tmp_path: Path) -> None:
    """EACCES was reported as "[Errno 2] No such file or directory"."""
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "train.py").write_text("print('ran')\n")
    locked.chmod(0o000)
    try:
        expected = python_says(tmp_path, "locked/train.py")
        done = run(unprivileged(cli("run", "locked/train.py")), tmp_path, clean_env(tmp_path))
        scanned = run(unprivileged(cli("scan", "locked/train.py")), tmp_path, clean_env(tmp_path))
    finally:
        locked.chmod(0o700)

    assert "[Errno 13] Permission denied" in expected
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"ascend-patch run: can't open file {expected}"
    assert scanned.returncode == 2
    assert "scan: cannot read 'locked/train.py': [Errno 13] Permission denied" in scanned.stderr


@pytest.mark.parametrize("kind", ["below-a-file", "symlink-loop"])
def test_a_script_that_cannot_be_reached_says_the_real_reason(tmp_path: Path, kind: str) -> None:
    """ENOTDIR and ELOOP, which root meets too: python's message, errno included."""
    if kind == "below-a-file":
        (tmp_path / "notes.txt").write_text("")
        script = "notes.txt/train.py"
    else:
        os.symlink("loop-b", tmp_path / "loop-a")
        os.symlink("loop-a", tmp_path / "loop-b")
        script = "loop-a"
    expected = run([sys.executable, script], tmp_path, clean_env(tmp_path)).stderr
    done = run(cli("run", script), tmp_path, clean_env(tmp_path))

    assert done.returncode == 2
    reason = expected.partition("can't open file ")[2]
    assert "No such file" not in reason and reason
    assert done.stderr == f"ascend-patch run: can't open file {reason}"


# ----------------------------------------------------------------------------- doctor's cache advice


def cache_findings(done: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    result = json.loads(done.stdout)
    return [f for f in result["findings"] if f["code"].startswith("cache-")]


def test_doctor_says_a_file_stands_where_the_cache_directory_should_be(tmp_path: Path) -> None:
    """It used to advise `chmod 700` on the file and call the cache "not opened safely"."""
    (tmp_path / "cachefile").write_text("not a directory\n")
    env = clean_env(tmp_path, ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cachefile"))

    done = run(cli("doctor", "--json"), tmp_path, env)

    findings = cache_findings(done)
    assert [f["code"] for f in findings] == ["cache-unwritable"], findings
    message = findings[0]["message"]
    assert f"the cache directory {tmp_path / 'cachefile'} is a file, not a directory" in message
    assert "Move that file away" in message and "ASCEND_PATCH_CACHE_DIR" in message
    assert "chmod" not in message


def test_doctor_says_a_read_only_cache_directory_is_not_writable(tmp_path: Path) -> None:
    """A directory this user cannot write was reported as an "absent" cache, without a word."""
    directory = tmp_path / "readonly"
    directory.mkdir(mode=0o500)
    env = clean_env(tmp_path, ASCEND_PATCH_CACHE_DIR=str(directory))
    try:
        done = run(unprivileged(cli("doctor", "--json")), tmp_path, env)
    finally:
        directory.chmod(0o700)

    findings = cache_findings(done)
    assert [f["code"] for f in findings] == ["cache-unwritable"], findings
    message = findings[0]["message"]
    assert f"the cache directory {directory} is not writable (Permission denied)" in message
    assert f"chmod u+w {directory}" in message


# ----------------------------------------------------------------------------- doctor without torch


@pytest.fixture(scope="module")
def no_torch_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the core, the plugins, pluggy and packaging -- no torch.

    Built in a second by linking this environment's installs in (tests/bare_venv.py).
    """
    root = tmp_path_factory.mktemp("no-torch")
    python, _ = make_bare_venv(root / "venv", ("ascend_patch_",))
    check = subprocess.run([str(python), "-c", "import torch"], capture_output=True, timeout=60)
    assert check.returncode != 0, "torch is importable in the torch-free environment"
    yield python


def test_doctor_without_torch_is_not_ok(tmp_path: Path, no_torch_python: Path) -> None:
    """No torch: an error that names what is missing and which plugins cannot apply, exit 1."""
    env = clean_env(tmp_path)
    as_json = run(
        [str(no_torch_python), "-m", "ascend_patch_core._cli", "doctor", "--json"], tmp_path, env
    )
    as_text = run([str(no_torch_python), "-m", "ascend_patch_core._cli", "doctor"], tmp_path, env)

    assert as_json.returncode == 1, as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["ok"] is False and result["environment"]["torch"]["installed"] is False
    missing = [f for f in result["findings"] if f["code"] == "torch-missing"]
    assert len(missing) == 1 and missing[0]["level"] == "error"
    assert "torch is not installed" in missing[0]["message"]
    assert (
        "of plugin 'torch'" in missing[0]["message"]
        and "pip install torch" in missing[0]["message"]
    )
    assert as_text.returncode == 1
    verdict = as_text.stdout.strip().splitlines()[-1]
    assert verdict.startswith("problems found: 1 error"), verdict


# ----------------------------------------------------------------------------- run without torch_npu

NOTE = "ascend-patch run: note: torch_npu is not installed, so the CUDA->NPU redirects are inactive"

SPAWNS_A_CHILD = """
import subprocess, sys
subprocess.run([sys.executable, "-c", "print('child ran')"], check=True)
print("parent ran")
"""


@pytest.fixture
def no_torch_npu() -> None:
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here: the redirects are active")


@pytest.mark.torch  # the torch plugin is idle without torch: its groups, its note
def test_run_without_torch_npu_says_once_that_the_redirects_are_inactive(
    tmp_path: Path, no_torch_npu: None
) -> None:
    """One stderr line, in the main process only (its children do not repeat it); stdout untouched."""
    (tmp_path / "prog.py").write_text(textwrap.dedent(SPAWNS_A_CHILD))

    done = run(cli("run", "prog.py", "--lr", "0.1"), tmp_path, clean_env(tmp_path))

    assert (done.returncode, done.stdout) == (0, "child ran\nparent ran\n"), done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith(NOTE)]
    assert len(notes) == 1, done.stderr
    assert "ascend-patch run --emulate-npu prog.py" in notes[0]
    assert done.stderr.splitlines() == notes


@pytest.mark.torch
def test_run_under_the_emulator_does_not_say_it(tmp_path: Path, no_torch_npu: None) -> None:
    (tmp_path / "prog.py").write_text("print('ran')\n")

    done = run(cli("run", "--emulate-npu", "prog.py"), tmp_path, clean_env(tmp_path))

    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    assert "torch_npu is not installed" not in done.stderr
