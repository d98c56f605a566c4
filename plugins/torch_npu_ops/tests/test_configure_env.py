"""The torch plugin's configure_env: recommended NPU settings, never over a value the user set."""

from __future__ import annotations

import os
import types

import pytest
from ascend_patch_torch import env
from ascend_patch_torch import plugin

from ascend_patch_core import Patcher
from ascend_patch_core import Status


NAMES = [setting.name for setting in env.RECOMMENDED]


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch, npu_emulator: object) -> None:
    # The settings are offered only where an NPU runtime is (here: the emulator's).
    for name in [*NAMES, env.SWITCH]:
        monkeypatch.delenv(name, raising=False)


def env_only_patcher() -> Patcher:
    """A patcher loading just the torch plugin's configure_env hook (not its patches)."""
    only_env = types.SimpleNamespace(configure_env=plugin.configure_env)
    return Patcher(extra_plugins=[("torch", only_env)])


def test_recommended_values_are_set_with_their_reason_and_removed_on_revert() -> None:
    patcher = env_only_patcher()
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


def test_a_value_the_user_set_is_never_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "1")
    patcher = env_only_patcher()
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
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(env.SWITCH, value)
    patcher = env_only_patcher()
    report = patcher.apply()
    try:
        assert not [r for r in report.records if r.kind == "env"]
        assert not [name for name in NAMES if name in os.environ]
    finally:
        patcher.revert()
