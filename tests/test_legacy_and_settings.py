"""The DrivingSDK patcher's 1.0 API (function patches, PatcherBuilder) and the delegated settings."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import LegacyPatch
from ascend_patch_core import Patch
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import PatcherBuilder
from ascend_patch_core import Status


def test_function_patch_runs_on_import_with_options(make_package, patcher: Patcher) -> None:
    """Patch(func, options) is a LegacyPatch: func(module, options) runs once the module is imported."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    seen = []

    def npu_f(module, options):
        seen.append(options)
        module.f = lambda: "legacy"

    legacy = Patch(npu_f, {"k": 1})
    assert isinstance(legacy, LegacyPatch)
    report = patcher.add(legacy.bound_to(f"{pkg}.core")).apply()
    assert report.get("npu_f").status is Status.PENDING
    core = __import__(f"{pkg}.core", fromlist=["f"])
    assert core.f() == "legacy"
    assert seen == [{"k": 1}]
    assert report.get("npu_f").status is Status.APPLIED


def test_function_patch_failure_is_reported_not_raised(make_package, patcher: Patcher) -> None:
    """A 1.0 function that raises is FAILED with its message; the import works.

    (AttributeError is SKIPPED, as in the DrivingSDK patcher: tests/test_mx_driving_compat_patches.py.)
    """
    pkg = make_package({"core.py": "X = 1\n"})

    def broken(module, options):
        raise RuntimeError("missing kernel")

    report = patcher.add(LegacyPatch(broken, target_module=f"{pkg}.core")).apply()
    core = __import__(f"{pkg}.core", fromlist=["X"])
    assert core.X == 1
    record = report.get("broken")
    assert record.status is Status.FAILED
    assert "missing" in (record.reason or "")


def test_patcher_builder_orders_by_priority_and_builds_an_unapplied_patcher(make_package) -> None:
    """PatcherBuilder keeps the 1.0 chain; build() returns a Patcher usable as a context manager."""
    pkg = make_package({"core.py": "ORDER = []\n"})
    calls = []

    def first(module, options):
        calls.append("first")
        module.ORDER.append("first")

    def second(module, options):
        calls.append("second")
        module.ORDER.append("second")

    builder = (
        PatcherBuilder()
        .add_module_patch(
            f"{pkg}.core", LegacyPatch(second, priority=2), LegacyPatch(first, priority=1)
        )
        .brake_at(10)
    )
    patcher = builder.build()
    assert not patcher.is_applied
    with patcher as applied:
        assert applied is patcher and patcher.is_applied
        core = __import__(f"{pkg}.core", fromlist=["ORDER"])
        assert core.ORDER == ["first", "second"]
    assert not patcher.is_applied
    assert calls == ["first", "second"]


def test_builder_expands_a_function_that_names_its_group(make_package) -> None:
    """A 1.0 function carrying __ascend_patch_group__ is replaced by that group's declarative, reversible patches."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})

    class Group(Patch):
        @classmethod
        def patches(cls, options=None):
            return [AtomicPatch(f"{pkg}.core.f", lambda: f"group-{options}")]

    def msda(module, options):  # never run: the group replaces it
        raise AssertionError("the legacy function must not run")

    msda.__ascend_patch_group__ = Group
    patcher = PatcherBuilder().add_module_patch(f"{pkg}.core", Patch(msda, "opt")).build()
    with patcher:
        core = __import__(f"{pkg}.core", fromlist=["f"])
        assert core.f() == "group-opt"
    assert core.f() == "orig"


def test_builder_rejects_non_legacy_items() -> None:
    """add_module_patch takes Patch(func) objects only."""
    with pytest.raises(TypeError):
        PatcherBuilder().add_module_patch("x", AtomicPatch("x.y", 1))  # type: ignore[arg-type]


def test_profiling_and_brake_are_validated_and_reported_not_ignored(patcher: Patcher) -> None:
    """with_profiling/brake_at validate their arguments, and the report shows each as its own record."""
    with pytest.raises(PatchDefinitionError):
        patcher.with_profiling("/tmp/prof", level=3)
    with pytest.raises(PatchDefinitionError):
        patcher.brake_at(0)
    report = patcher.with_profiling("/tmp/prof", level=1).brake_at(5).apply()
    settings = {r.target: r for r in report.records if r.kind == "setting"}
    assert any("with_profiling" in target for target in settings), settings
    assert any("brake_at(5)" in target for target in settings), settings
    assert all(r.status in (Status.PENDING, Status.APPLIED) for r in settings.values())


@pytest.mark.torch
def test_allow_internal_format_waits_for_torch_npu_and_reverts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """allow_internal_format() sets torch.npu.config when torch_npu is imported, and revert restores it."""
    import torch

    config = types.SimpleNamespace(allow_internal_format=True)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(config=config), raising=False)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    patcher = Patcher().disallow_internal_format()
    report = patcher.apply()
    assert report.get("allow_internal_format").status is Status.PENDING
    assert config.allow_internal_format is True
    fake = types.ModuleType("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    from ascend_patch_core.imports._hub import hub

    hub.notify("torch_npu", fake)  # what the finder does once torch_npu's body has run
    assert config.allow_internal_format is False
    assert patcher.report.get("allow_internal_format").status is Status.APPLIED
    patcher.revert()
    assert config.allow_internal_format is True


def test_cli_report_prints_the_plugins_and_json() -> None:
    """`ascend-patch report` applies the installed plugins and prints them; --json is machine-readable."""
    import json

    table = subprocess.run(
        [sys.executable, "-m", "ascend_patch_core._cli", "report", "-v"],
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0, table.stderr
    assert "ascend_patch_torch.plugin" in table.stdout
    raw = subprocess.run(
        [sys.executable, "-m", "ascend_patch_core._cli", "report", "--json"],
        capture_output=True,
        text=True,
    )
    data = json.loads(raw.stdout)
    assert data["schema"] == "ascend-patch-report/1"
    assert {r["name"] for r in data["records"] if r["kind"] == "plugin"} >= {
        "torch",
        "mmcv",
        "transformers",
    }


def test_precision_check_options_are_validated_when_given() -> None:
    """with_precision_check rejects unknown options at the call, naming the valid ones."""
    with pytest.raises(PatchDefinitionError, match="unknown option"):
        Patcher().with_precision_check(bogus=1)
