"""Voxelization (opt-in) against mmcv's compiled CPU hard-voxelization kernel.

Runs in the nox session ``openmmlab_cpu_ops``. The patched call runs on emulated NPU
points through the emulator's mx_driving ``voxelization`` (emulated); mmcv's CPU
kernel is the reference. Voxelization is exact (no arithmetic beyond the cell
index), so the voxels, their ``(z, y, x)`` coordinates and point counts must be equal.
"""

from __future__ import annotations

import importlib.util

import pytest
from mmcv_stacks import require_stack
from mmcv_stacks import required


require_stack("mmcv-ops")

import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.groups import Voxelization  # noqa: E402


@pytest.fixture
def mx_driving(npu_emulator, monkeypatch):
    if importlib.util.find_spec("mx_driving") is None:
        # The session with mmcv's ops promises the emulator's mx_driving: missing, a failure.
        (pytest.fail if required("mmcv-ops") else pytest.skip)("the emulator serves no mx_driving")
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    yield
    _kernel_source.forget_choices()


def _points(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    xyz = torch.rand(count, 3, generator=generator) * torch.tensor([12.0, 10.0, 4.0])
    xyz -= torch.tensor([1.0, 5.0, 3.0])  # some points fall outside the range
    return torch.cat((xyz, torch.rand(count, 1, generator=generator)), dim=1)


CASES = {
    # name: (points, voxel_size, range, max_points, max_voxels)
    "roomy": (300, [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 35, 20000),
    "full-voxels": (2000, [1.0, 1.0, 1.0], [0, -4, -2, 10, 4, 1], 4, 20000),
    "voxel-budget": (2000, [0.25, 0.25, 0.5], [0, -4, -2, 10, 4, 1], 5, 50),
    "one-point": (1, [0.5, 0.5, 0.5], [-2, -6, -4, 12, 6, 2], 35, 100),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hard_voxelization_matches_mmcvs_cpu_kernel(mx_driving, isolated_patcher, case):
    from mmcv.ops import Voxelization as VoxelLayer
    from mmcv.ops import voxelize

    count, size, bounds, max_points, max_voxels = CASES[case]
    points = _points(count)
    layer = VoxelLayer(size, bounds, max_points, max_voxels)
    expected = layer(points)  # before apply(): under the emulator every tensor is "NPU"
    isolated_patcher.add(Voxelization).apply()
    actual = layer(points.to("npu"))
    direct = voxelize.voxelization(points.to("npu"), size, bounds, max_points, max_voxels)
    for got in (actual, direct):
        assert len(got) == 3
        for a, b in zip(got, expected, strict=True):
            assert a.dtype == b.dtype and torch.equal(a.cpu(), b)
    record = isolated_patcher.report.get("mmcv.ops.voxelize:voxelization")
    assert record.note == "kernel: mx_driving"
    assert record.counters.replacement_calls == 2


def test_dynamic_voxelization_stays_with_mmcv(mx_driving, isolated_patcher):
    from mmcv.ops import voxelize

    points = _points(100)
    expected = voxelize.voxelization(points, [0.5] * 3, [0, -4, -2, 10, 4, 1], -1, -1)
    isolated_patcher.add(Voxelization).apply()
    actual = voxelize.voxelization(points.to("npu"), [0.5] * 3, [0, -4, -2, 10, 4, 1], -1, -1)
    assert torch.equal(actual, expected)
    counters = isolated_patcher.report.get("mmcv.ops.voxelize:voxelization").counters
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 1)


def test_it_is_opt_in_and_installs_nothing_without_mx_driving(monkeypatch, isolated_patcher):
    monkeypatch.setitem(__import__("sys").modules, "mx_driving", None)
    _kernel_source.forget_choices()
    try:
        isolated_patcher.add(Voxelization).apply()
        assert [r for r in isolated_patcher.report if r.kind == "patch"] == []
    finally:
        _kernel_source.forget_choices()
    assert Voxelization.opt_in
