"""The torch plugin's configure_env: NPU runtime settings, only where an NPU runtime is present.

Where one is, each recommended value is set with its reason, never over a value the
user set, and removed on revert; the plugin's switch turns them all off.

The bug: ``apply()`` on a CPU machine set ``TASK_QUEUE_ENABLE`` & co., although the
plugin is meant to change nothing there. Checked in-process both ways, and through
``ascend-patch run`` the way a user sees it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from ascend_patch_torch import env
from ascend_patch_torch import plugin

from ascend_patch_core import Patcher
from ascend_patch_core import Status


NAMES = [setting.name for setting in env.RECOMMENDED]
SCRIPT = f"import os, json; print(json.dumps({{n: os.environ.get(n) for n in {NAMES!r}}}))"


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*NAMES, env.SWITCH]:
        monkeypatch.delenv(name, raising=False)


def _env_only_patcher() -> Patcher:
    only_env = types.SimpleNamespace(configure_env=plugin.configure_env)
    return Patcher(extra_plugins=[("torch", only_env)])


def test_no_npu_runtime_no_npu_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # what a CPU machine has
    assert env.recommended_env() == []
    patcher = _env_only_patcher()
    report = patcher.apply()
    try:
        assert not [r for r in report.records if r.kind == "env"]
        assert not [name for name in NAMES if name in os.environ]
    finally:
        patcher.revert()


def test_an_emulated_npu_runtime_gets_the_npu_settings(npu_emulator) -> None:
    assert [s.name for s in env.recommended_env()] == NAMES
    patcher = _env_only_patcher()
    patcher.apply()
    try:
        assert {name: os.environ.get(name) for name in NAMES} == {
            s.name: s.value for s in env.RECOMMENDED
        }
    finally:
        patcher.revert()
    assert not [name for name in NAMES if name in os.environ]


# Where an NPU runtime is (here: the emulator's): the settings, never over a user's value.
def test_recommended_values_are_set_with_their_reason_and_removed_on_revert(npu_emulator) -> None:
    patcher = _env_only_patcher()
    report = patcher.apply()
    try:
        for setting in env.RECOMMENDED:
            assert os.environ[setting.name] == setting.value
            record = report.get(setting.name, kind="env")
            assert record.status is Status.APPLIED
            assert record.reason == setting.why and setting.why
            assert record.provenance.plugin == "torch"
    finally:
        patcher.revert()
    assert not [name for name in NAMES if name in os.environ]


def test_a_value_the_user_set_is_never_overwritten(
    monkeypatch: pytest.MonkeyPatch, npu_emulator
) -> None:
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "1")
    patcher = _env_only_patcher()
    report = patcher.apply()
    try:
        assert os.environ["TASK_QUEUE_ENABLE"] == "1"
        record = report.get("TASK_QUEUE_ENABLE", kind="env")
        assert record.status is Status.SKIPPED and "TASK_QUEUE_ENABLE=1" in (record.reason or "")
    finally:
        patcher.revert()
    assert os.environ["TASK_QUEUE_ENABLE"] == "1"


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_the_switch_turns_every_recommendation_off(
    monkeypatch: pytest.MonkeyPatch, npu_emulator, value: str
) -> None:
    monkeypatch.setenv(env.SWITCH, value)
    patcher = _env_only_patcher()
    report = patcher.apply()
    try:
        assert not [r for r in report.records if r.kind == "env"]
        assert not [name for name in NAMES if name in os.environ]
    finally:
        patcher.revert()


def _run(tmp_path: Path, *options: str) -> dict[str, str | None]:
    import json

    script = tmp_path / "show_env.py"
    script.write_text(SCRIPT + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in NAMES and k != env.SWITCH}
    clean["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    cli = Path(sys.executable).with_name("ascend-patch")
    out = subprocess.run(
        [str(cli), "run", *options, str(script)],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, str | None] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_ascend_patch_run_on_a_cpu_machine_leaves_the_environment_alone(tmp_path: Path) -> None:
    from ascend_patch_torch.runtime import npu_runtime_importable

    if npu_runtime_importable():  # pragma: no cover - a machine with a real torch_npu
        pytest.skip("torch_npu is installed here: this is not a CPU machine")
    assert _run(tmp_path) == dict.fromkeys(NAMES)
    assert _run(tmp_path, "--emulate-npu") == {s.name: s.value for s in env.RECOMMENDED}
