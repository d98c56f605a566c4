"""The 1.0 names of plugin groups (``msda``, ``index`` ...) are attributes of ascend_patch_core."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ascend_patch_core
from ascend_patch_core import Patch
from ascend_patch_core import PatcherBuilder


def test_a_plugins_legacy_name_is_a_core_attribute_carrying_its_group():
    index = ascend_patch_core.index  # the torch plugin's TensorIndex group
    group = index.__ascend_patch_group__
    assert issubclass(group, Patch) and group.legacy_name == "index"
    assert index.__name__ == "index"
    # Patch(index) in a 1.0 builder adds the group itself, not a function patch.
    patcher = PatcherBuilder().add_module_patch("torch", Patch(index)).build()
    try:
        records = list(patcher.apply())
    finally:
        patcher.revert()
    assert records and all(r.group == group.name for r in records)
    assert not [r for r in records if r.kind == "legacy"]


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_legacy_name"):
        ascend_patch_core.no_such_legacy_name  # noqa: B018
    assert not hasattr(ascend_patch_core, "no_such_legacy_name")


def test_a_1_0_script_imports_the_mmcv_names_from_the_core():
    script = (
        "from ascend_patch_core import PatcherBuilder, Patch, msda, dc, mdc\n"
        "b = PatcherBuilder().add_module_patch('mmcv', Patch(msda), Patch(dc), Patch(mdc))\n"
        "print(sorted(f.__ascend_patch_group__.name for f in (msda, dc, mdc)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    names = ["DeformConv", "ModulatedDeformConv", "MultiScaleDeformableAttention"]
    assert out.stdout.strip() == repr(names)


MMCV_1_0_NAMES = {
    "msda": "MultiScaleDeformableAttention",
    "dc": "DeformConv",
    "mdc": "ModulatedDeformConv",
    "spconv3d": "SparseConv3D",
    "voxelization": "Voxelization",
    "stream": "Stream",
    "ddp": "DDP",
    "optimizer_hooks": "OptimizerHooks",
    "optimizer_wrapper": "OptimizerWrapper",
    "pseudo_sampler": "PseudoSampler",
    "resnet_add_relu": "ResNetAddRelu",
    "resnet_maxpool": "ResNetMaxPool",
    "resnet_fp16": "ResNetFP16",
    "nuscenes_dataset": "NuScenesDataset",
    "nuscenes_metric": "NuScenesMetric",
}


def test_every_1_0_name_of_the_mmcv_plugin_names_its_group():
    """The DrivingSDK patcher's 1.0 function names of OpenMMLab patches, each to our group."""
    for name, group in MMCV_1_0_NAMES.items():
        assert getattr(ascend_patch_core, name).__ascend_patch_group__.name == group, name
