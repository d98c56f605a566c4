"""The opt-in groups (TensorIndex, FusedOptimizers) go through the core's switch, ASCEND_PATCH_ENABLE.

The plugin always declares them (``opt_in = True``); the core skips them, with a
reason that says how to turn them on, unless they are enabled by name.
"""

from __future__ import annotations

import pytest
import torch

from ascend_patch_core import Patcher
from ascend_patch_core import Status


OPT_IN = ("TensorIndex", "FusedOptimizers")
# One patch of each group, to see whether the group was built and installed.
TARGETS = {
    "TensorIndex": "torch.Tensor.__getitem__",
    "FusedOptimizers": "torch.optim.adamw.AdamW.__init__",
}
ORIGINAL_GETITEM = torch.Tensor.__getitem__


@pytest.fixture
def torch_plugin(npu_emulator, monkeypatch):
    """``run(enable)``: a patcher that loads the torch plugin as if installed, applied (and reverted)."""
    from ascend_patch_torch import plugin

    monkeypatch.delenv("ASCEND_PATCH_ENABLE", raising=False)
    patchers = []

    def run(enable=(), strict=True):
        patcher = Patcher(extra_plugins=[("torch", plugin)], strict=strict).enable(*enable)
        patchers.append(patcher)
        patcher.apply()
        return patcher

    yield run
    for patcher in patchers:
        patcher.revert()


def applied(report, group):
    record = report.get(TARGETS[group], kind="patch")
    return record.group == group and record.status is Status.APPLIED


def test_the_plugin_declares_both_groups_as_opt_in():
    from ascend_patch_torch import groups
    from ascend_patch_torch import plugin

    declared = plugin.register_patches()
    assert groups.TensorIndex in declared and groups.FusedOptimizers in declared
    assert {group.name for group in declared if group.opt_in} == set(OPT_IN)


def test_skipped_with_the_opt_in_reason_by_default(torch_plugin):
    report = torch_plugin().report
    for name in OPT_IN:
        record = report.get(name, kind="group")
        assert record.status is Status.SKIPPED
        assert record.reason == (
            f"opt-in: enable it with ASCEND_PATCH_ENABLE={name} or Patcher.enable({name!r})"
        )
        assert record.provenance.plugin == "torch"
        # The full listing gives the reason; the short table counts them per plugin.
        assert f"ASCEND_PATCH_ENABLE={name}" in report.table(verbose=True)
    assert f"({len(OPT_IN)} opt-in)" in report.table()
    assert not [r for r in report.records if r.group in OPT_IN and r.kind == "patch"]
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM
    # The default groups are not affected.
    assert report.get("torch.zeros", kind="patch").status is Status.APPLIED


def test_enabled_by_name_in_the_environment(torch_plugin, monkeypatch):
    monkeypatch.setenv("ASCEND_PATCH_ENABLE", "TensorIndex")
    report = torch_plugin().report
    assert applied(report, "TensorIndex")
    assert torch.Tensor.__getitem__ is not ORIGINAL_GETITEM
    x = torch.arange(6.0, device="npu").reshape(3, 2)
    assert x[torch.tensor([True, False, True])].tolist() == [[0.0, 1.0], [4.0, 5.0]]
    assert report.get(TARGETS["TensorIndex"]).counters.replacement_calls == 1
    assert report.get("FusedOptimizers", kind="group").status is Status.SKIPPED


def test_star_enables_both(torch_plugin, monkeypatch):
    monkeypatch.setenv("ASCEND_PATCH_ENABLE", "*")
    report = torch_plugin().report
    for name in OPT_IN:
        assert applied(report, name), name
        assert not [r for r in report.records if r.kind == "group" and r.name == name]


def test_the_legacy_name_and_the_api_enable_too(torch_plugin):
    report = torch_plugin(enable=("index", "FusedOptimizers")).report
    assert applied(report, "TensorIndex")
    assert applied(report, "FusedOptimizers")


def test_revert_restores_an_enabled_group(torch_plugin, monkeypatch):
    monkeypatch.setenv("ASCEND_PATCH_ENABLE", "TensorIndex")
    patcher = torch_plugin()
    assert torch.Tensor.__getitem__ is not ORIGINAL_GETITEM
    patcher.revert()
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM


def test_the_variable_is_read_at_each_apply_not_kept(torch_plugin, monkeypatch):
    """After revert(), an apply() without ASCEND_PATCH_ENABLE leaves the group off again."""
    monkeypatch.setenv("ASCEND_PATCH_ENABLE", "TensorIndex")
    patcher = torch_plugin()
    patcher.revert()
    monkeypatch.delenv("ASCEND_PATCH_ENABLE")
    report = patcher.apply()
    assert report.get("TensorIndex", kind="group").status is Status.SKIPPED
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM


def test_a_misspelt_name_is_reported(torch_plugin, monkeypatch):
    monkeypatch.setenv("ASCEND_PATCH_ENABLE", "TensorIdx")
    report = torch_plugin(strict=False).report
    assert any(w.startswith("ASCEND_PATCH_ENABLE names 'TensorIdx'") for w in report.warnings), (
        report.warnings
    )
    assert report.get("TensorIndex", kind="group").status is Status.SKIPPED


def _cli(*args, cwd, env=None):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
    assert script is not None, "the ascend-patch command is not installed in this environment"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    environment["ASCEND_PATCH_CACHE_DIR"] = str(Path(cwd) / "cache")
    return subprocess.run(
        [script, *args],
        cwd=cwd,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ascend_patch_run_enable_turns_an_opt_in_group_on(tmp_path):
    """ascend-patch run --enable TensorIndex applies it in the program (and only it); doctor plans the same."""
    import json

    (tmp_path / "prog.py").write_text(
        "import torch\nprint(torch.zeros(3, 2)[torch.tensor([0, 2])].shape)\n"
    )
    result = _cli(
        "run",
        "--emulate-npu",
        "--enable",
        "TensorIndex",
        "--report",
        "r.json",
        "prog.py",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "torch.Size([2, 2])" in result.stdout
    run_report = json.loads((tmp_path / "r.json").read_text())
    assert run_report["options"]["enable"] == ["TensorIndex"]
    records = run_report["processes"][0]["report"]["records"]
    groups = {r["name"]: r for r in records if r["kind"] == "group"}
    index = [r for r in records if r["kind"] == "patch" and r["group"] == "TensorIndex"]
    assert index and all(r["status"] == "applied" for r in index)
    assert groups["FusedOptimizers"]["status"] == "skipped"
    assert "opt-in" in groups["FusedOptimizers"]["reason"]

    doctor = _cli("doctor", "--json", "--enable", "TensorIndex", cwd=tmp_path)
    assert doctor.stdout, doctor.stderr
    data = json.loads(doctor.stdout)
    assert data["selection"]["enable"] == ["TensorIndex"]
    assert not [f for f in data["findings"] if f["code"] == "unknown-name"]
    torch_plugin = next(p for p in data["plugins"] if p["name"] == "torch")
    by_group = {}
    for patch in torch_plugin["patches"]:
        by_group.setdefault(patch["group"], []).append(patch)
    # The reason reads "opt-in: enable it with ...": a prefix test, as for FusedOptimizers.
    assert not any(
        (p["not_applicable_reason"] or "").startswith("opt-in") for p in by_group["TensorIndex"]
    )
    assert all(
        (p["not_applicable_reason"] or "").startswith("opt-in") for p in by_group["FusedOptimizers"]
    )


def test_doctor_warns_about_a_misspelt_enable_name(tmp_path):
    import json

    doctor = _cli("doctor", "--json", "--enable", "TensorIdx", cwd=tmp_path)
    findings = [f for f in json.loads(doctor.stdout)["findings"] if f["code"] == "unknown-name"]
    assert [f["message"] for f in findings] == [
        "--enable / ASCEND_PATCH_ENABLE names 'TensorIdx', which matches no plugin, group or "
        "patch (did you mean 'TensorIndex'?)"
    ]
