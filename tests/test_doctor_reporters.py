"""Doctor's Environment comes from reporters (entry-point group ``ascend_patch.doctor``).

The core knows Python, torch and its own variables; the torch plugin reports the NPU
stack (torch_npu, CANN, NPUs, the runtime's variables) and the emulator kit its
variable. Run as users meet it: ``ascend-patch doctor`` in a subprocess.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


CLI = Path(sys.executable).parent / "ascend-patch"
REPO = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        NO_COLOR="1",
        ASCEND_PATCH_CACHE_DIR=str(tmp_path / "cache"),
        PATH=f"{tmp_path / 'no-tools'}{os.pathsep}/usr/bin:/bin",  # no npu-smi
        **extra,
    )
    return env


def _doctor(cmd: list[str], env: dict[str, str], cwd: Path, *args: str) -> tuple[Any, str]:
    json_run = subprocess.run(
        [*cmd, "doctor", "--json", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    text_run = subprocess.run(
        [*cmd, "doctor", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert json_run.stdout, json_run.stderr
    return json.loads(json_run.stdout), text_run.stdout


def _environment_rows(text: str) -> list[str]:
    """The first word of each line of the Environment table."""
    lines = text.splitlines()
    rest = lines[lines.index("Environment") + 1 :]
    return [line.split()[0] for line in itertools.takewhile(str.strip, rest)]


def test_with_the_torch_plugin_and_the_emulator_doctor_reports_the_npu_stack(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ascend_patch_torch")
    pytest.importorskip("ascend_patch_emulator")
    result, text = _doctor([str(CLI)], _env(tmp_path), tmp_path)

    environment = result["environment"]
    assert {"python", "torch", "torch_npu", "cann", "npu", "variables"} <= set(environment)
    assert environment["torch_npu"]["installed"] is False
    variables = {v["name"]: v["meaning"] for v in environment["variables"]}
    assert "HCCL_CONNECT_TIMEOUT" in variables  # the torch plugin's
    assert "ASCEND_PATCH_EMULATED_DEVICES" in variables  # the emulator's
    assert "ASCEND_PATCH_DISABLE" in variables  # the core's
    assert _environment_rows(text) == [
        "python",
        "torch",
        "torch_npu",
        "CANN",
        "NPUs",
        "start",
        "metadata",
    ]
    if environment["torch"]["installed"]:
        codes = [f["code"] for f in result["findings"]]
        assert "no-torch-npu" in codes
    assert not [f for f in result["findings"] if f["code"] == "doctor-reporter"]


def test_the_core_alone_says_nothing_of_an_npu_stack_it_cannot_see(tmp_path: Path) -> None:
    """Only the core (no plugin, no kit): Python, torch and the core's variables; no NPU rows."""
    import packaging
    import pluggy

    # A sys.path with the core and its two dependencies only: no site-packages, so no
    # installed distribution (no plugin, no kit, no torch) is visible.
    deps = tmp_path / "deps"
    deps.mkdir()
    for module in (pluggy, packaging):
        (deps / module.__name__).symlink_to(Path(module.__file__ or "").parent)
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(REPO), str(deps)]))
    cmd = [
        sys.executable,
        "-S",
        "-c",
        "import sys; from ascend_patch_core._cli.commands import main; sys.exit(main())",
    ]
    result, text = _doctor(cmd, env, tmp_path)

    environment = result["environment"]
    assert set(environment) == {"python", "torch", "variables"}
    assert environment["torch"]["installed"] is False
    assert {v["name"] for v in environment["variables"]} == {
        "ASCEND_PATCH_DISABLE",
        "ASCEND_PATCH_ENABLE",
        "ASCEND_PATCH_PLUGINS",
        "ASCEND_PATCH_AUTOLOAD",
        "ASCEND_PATCH_STRICT",
        "ASCEND_PATCH_PLUGIN_TIMEOUT",
        "ASCEND_PATCH_RUN",
    }
    assert _environment_rows(text) == ["python", "torch", "start", "metadata"]
    codes = {f["code"] for f in result["findings"]}
    assert not codes & {"no-torch-npu", "cann-missing", "torch-missing", "doctor-reporter"}


def test_a_broken_reporter_is_a_warning_and_the_others_still_report(tmp_path: Path) -> None:
    pytest.importorskip("ascend_patch_torch")
    site = tmp_path / "site"
    info = site / "apx_reporter-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apx-reporter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ascend_patch.doctor]\napx_broken = apx_reporter_mod\n")
    (site / "apx_reporter_mod.py").write_text(
        "def facts(environment, try_import):\n    raise RuntimeError('no facts today')\n"
    )
    result, _ = _doctor([str(CLI)], _env(tmp_path, PYTHONPATH=str(site)), tmp_path)

    messages = [f["message"] for f in result["findings"] if f["code"] == "doctor-reporter"]
    assert len(messages) == 1
    assert "'apx_broken'" in messages[0] and "apx-reporter 1.0" in messages[0]
    assert "RuntimeError: no facts today" in messages[0]
    assert "torch_npu" in result["environment"]  # the torch plugin still reported
