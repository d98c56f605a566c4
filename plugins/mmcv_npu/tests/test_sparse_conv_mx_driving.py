"""SparseConv3D with DrivingSDK installed: its classes at mmcv's paths and registry entries.

DrivingSDK's sparse kernels run only on Ascend devices, and the emulator marks its
``mx_driving`` sparse classes as stand-ins, so that source is never chosen here by
itself. These tests put a test double in ``sys.modules["mx_driving"]`` (classes
deriving from mmcv's own, marked as the double's) to check what the group does with
the real library: every class path and registry entry DrivingSDK's patcher swaps
exists in mmcv 2.1.0 and gets the double's class, a layer built by type name from
the registry (as mmdet3d builds its sparse layers) is the double's, mmcv's op layer
still serves the modules mx_driving does not provide, and revert restores mmcv's.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.groups import SparseConv3D  # noqa: E402
from ascend_patch_mmcv.sparse_conv import MX_CLASSES  # noqa: E402
from ascend_patch_mmcv.sparse_conv import REGISTERED  # noqa: E402


def _double() -> types.ModuleType:
    module = types.ModuleType("mx_driving")
    for path, names in MX_CLASSES.items():
        for name in names:
            original = getattr(importlib.import_module(path), name)
            setattr(module, name, type(name, (original,), {"MX_DRIVING_DOUBLE": True}))
    return module


@pytest.fixture
def mx_double(monkeypatch):
    double = _double()
    monkeypatch.setitem(sys.modules, "mx_driving", double)
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    yield double
    _kernel_source.forget_choices()


def _registry():
    from mmengine.registry import MODELS

    return MODELS


def test_mx_driving_classes_replace_mmcvs_at_every_path_and_registry_entry(
    mx_double, isolated_patcher
):
    import mmcv.ops
    from mmcv.cnn import build_conv_layer

    before = {
        (m, n): getattr(importlib.import_module(m), n) for m in MX_CLASSES for n in MX_CLASSES[m]
    }
    exported = {
        n: getattr(mmcv.ops, n)
        for names in MX_CLASSES.values()
        for n in names
        if hasattr(mmcv.ops, n)
    }
    # mmcv.ops re-exports all but SparseConvolution (a path DrivingSDK's patcher names anyway).
    assert set(before) - {("mmcv.ops.sparse_conv", "SparseConvolution")} == {
        (m, n) for m in MX_CLASSES for n in exported if n in MX_CLASSES[m]
    }
    registered = {name: _registry().get(name) for name in REGISTERED}
    isolated_patcher.add(SparseConv3D).apply()

    for module, names in MX_CLASSES.items():
        for name in names:
            assert getattr(sys.modules[module], name) is getattr(mx_double, name), (module, name)
            if name in exported:
                assert getattr(mmcv.ops, name) is getattr(mx_double, name), name
            record = isolated_patcher.report.get(f"{module}:{name}")
            assert record.note == "kernel: mx_driving"
    for name in REGISTERED:
        assert _registry().get(name) is getattr(mx_double, name), name
    layer = build_conv_layer({"type": "SubMConv3d", "indice_key": "subm1"}, 3, 4, 3)
    assert type(layer) is mx_double.SubMConv3d
    # mmcv's op layer stays served for what mx_driving does not replace (here: its
    # SparseMaxPool3d), and is reported with the portable kernel.
    record = isolated_patcher.report.get("mmcv.ops.sparse_ops:get_indice_pairs")
    assert record.note == "kernel: portable"

    isolated_patcher.revert()
    assert {(m, n): getattr(sys.modules[m], n) for m, n in before} == before
    assert {n: getattr(mmcv.ops, n) for n in exported} == exported
    assert {name: _registry().get(name) for name in REGISTERED} == registered


def test_registry_entries_follow_the_installed_mmcv_major_version():
    from ascend_patch_mmcv.sparse_conv import mx_driving_patches

    for major, registry in (
        (1, "mmcv.cnn.bricks.registry:CONV_LAYERS"),
        (2, "mmengine.registry:MODELS"),
    ):
        targets = [p.target for p in mx_driving_patches("n", major)]
        assert len(targets) == 7 + 3
        assert [t for t in targets if "_module_dict" in t] == [
            f"{registry}._module_dict['{name}']" for name in REGISTERED
        ]


def test_emulated_mx_driving_is_not_chosen(npu_emulator, isolated_patcher):
    # The emulator's mx_driving sparse classes are stand-ins: the portable kernels serve.
    import mmcv.ops

    _kernel_source.forget_choices()
    original = mmcv.ops.SubMConv3d
    isolated_patcher.add(SparseConv3D).apply()
    assert mmcv.ops.SubMConv3d is original
    note = isolated_patcher.report.get("mmcv.ops.sparse_ops:indice_conv").note
    assert note == "kernel: portable"
    _kernel_source.forget_choices()
    assert torch.zeros(1).is_npu
