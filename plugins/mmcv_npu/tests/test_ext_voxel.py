"""``mmcv._ext`` voxel family against mmcv 2.1.0's compiled CPU kernels and explicit references.

Runs in the nox session ``openmmlab_cpu_ops``. References:

- hard and dynamic voxelization: mmcv's compiled CPU kernels (``mmcv._ext``), called
  with the same preallocated outputs; voxelization is exact (a cell index, copies), so
  every output must be equal.
- dynamic point-to-voxel scatter: mmcv has no CPU kernel; the reference is an
  explicit per-voxel loop in this file (tiny inputs) following mmcv's CUDA launcher:
  voxels in lexicographic order of their coordinates, rows with a negative coordinate
  dropped, max/sum/mean, and the max gradient going to the lowest point index that
  holds the maximum. Tolerance 1e-6 (float32 sums in another order).

mmcv's own Python (``mmcv.ops.voxelize``, ``mmcv.ops.scatter_points``) is run with its
``ext_module`` replaced by the family's functions, so the calls (keywords, allocated
outputs) are mmcv's.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import voxel  # noqa: E402


OURS = SimpleNamespace(**{name: getattr(voxel, name) for name in voxel.__all__})


@pytest.fixture
def with_ours(monkeypatch):
    """mmcv's op modules calling this family instead of the compiled extension."""
    from mmcv.ops import scatter_points
    from mmcv.ops import voxelize

    monkeypatch.setattr(voxelize, "ext_module", OURS)
    monkeypatch.setattr(scatter_points, "ext_module", OURS)


def _points(count: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    xyz = torch.rand(count, 3, generator=generator) * torch.tensor([12.0, 10.0, 4.0])
    xyz -= torch.tensor([1.0, 5.0, 3.0])  # some points fall outside the range
    return torch.cat((xyz, torch.rand(count, 1, generator=generator)), dim=1).to(dtype)


def _on_cell_edges() -> torch.Tensor:
    """Points exactly on cell boundaries and on the range's low and high faces."""
    grid = torch.tensor(
        [[x, y, z] for x in (0.0, 0.5, 1.0, 10.0) for y in (-4.0, 0.0, 4.0) for z in (-2.0, 1.0)]
    )
    return torch.cat((grid, torch.arange(len(grid), dtype=torch.float32)[:, None]), 1)


CASES = {
    # name: (points, voxel_size, range, max_points, max_voxels)
    "roomy": (_points(300), [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 35, 20000),
    "full-voxels": (_points(2000), [1.0, 1.0, 1.0], [0, -4, -2, 10, 4, 1], 4, 20000),
    "voxel-budget": (_points(2000), [0.25, 0.25, 0.5], [0, -4, -2, 10, 4, 1], 5, 50),
    "one-point": (_points(1), [0.5, 0.5, 0.5], [-2, -6, -4, 12, 6, 2], 35, 100),
    "empty": (_points(0), [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 5, 10),
    "all-outside": (_points(50) + 100, [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 5, 10),
    "duplicates": (_points(20).repeat(5, 1), [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 3, 100),
    "cell-edges": (_on_cell_edges(), [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 2, 100),
    "pillars": (_points(3000, seed=3), [0.16, 0.16, 4.0], [0, -5, -3, 11, 5, 1], 32, 300),
    "fp16": (_points(500, dtype=torch.float16), [0.5, 0.5, 0.5], [0, -4, -2, 10, 4, 1], 5, 200),
    "fp64": (_points(500, dtype=torch.float64), [0.3, 0.3, 0.3], [0, -4, -2, 10, 4, 1], 5, 200),
    "non-contiguous": (
        _points(400, seed=2).t().contiguous().t(),
        [0.5] * 3,
        [0, -4, -2, 10, 4, 1],
        5,
        500,
    ),
}


def _hard(function, points, size, bounds, max_points, max_voxels):
    voxels = points.new_zeros((max_voxels, max_points, points.shape[1]))
    coors = torch.zeros((max_voxels, 3), dtype=torch.int)
    num_points = torch.zeros((max_voxels,), dtype=torch.int)
    voxel_num = torch.zeros((), dtype=torch.long)
    function(
        points,
        torch.tensor(size, dtype=torch.float),
        torch.tensor(bounds, dtype=torch.float),
        voxels,
        coors,
        num_points,
        voxel_num,
        max_points=max_points,
        max_voxels=max_voxels,
        NDim=3,
        deterministic=True,
    )
    return voxels, coors, num_points, voxel_num


@pytest.mark.parametrize("case", list(CASES))
def test_hard_voxelize_equals_mmcvs_cpu_kernel(case):
    points, size, bounds, max_points, max_voxels = CASES[case]
    expected = _hard(compiled.hard_voxelize_forward, points, size, bounds, max_points, max_voxels)
    actual = _hard(voxel.hard_voxelize_forward, points, size, bounds, max_points, max_voxels)
    for name, a, b in zip(
        ("voxels", "coors", "num_points", "voxel_num"), actual, expected, strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("case", list(CASES))
def test_dynamic_voxelize_equals_mmcvs_cpu_kernel(case):
    points, size, bounds, _, _ = CASES[case]
    coors = {}
    for key, function in (
        ("mmcv", compiled.dynamic_voxelize_forward),
        ("ours", voxel.dynamic_voxelize_forward),
    ):
        coors[key] = points.new_zeros((points.shape[0], 3), dtype=torch.int)
        function(
            points,
            torch.tensor(size, dtype=torch.float),
            torch.tensor(bounds, dtype=torch.float),
            coors[key],
            NDim=3,
        )
    assert torch.equal(coors["ours"], coors["mmcv"])


def test_mmcvs_voxelization_layer_runs_on_the_family(with_ours):
    from mmcv.ops import Voxelization

    points = _points(3000, seed=5)
    expected_hard = Voxelization([0.25, 0.25, 0.5], [0, -4, -2, 10, 4, 1], 5, 100)
    expected_dynamic = Voxelization([0.25, 0.25, 0.5], [0, -4, -2, 10, 4, 1], -1)
    compiled_results = _hard(
        compiled.hard_voxelize_forward, points, [0.25, 0.25, 0.5], [0, -4, -2, 10, 4, 1], 5, 100
    )
    count = int(compiled_results[3])
    for got, want in zip(expected_hard(points), compiled_results[:3], strict=True):
        assert torch.equal(got, want[:count])
    coors = points.new_zeros((points.shape[0], 3), dtype=torch.int)
    compiled.dynamic_voxelize_forward(
        points,
        torch.tensor([0.25, 0.25, 0.5]),
        torch.tensor([0.0, -4, -2, 10, 4, 1]),
        coors,
        NDim=3,
    )
    assert torch.equal(expected_dynamic(points), coors)


def test_non_deterministic_flag_gives_the_deterministic_voxels():
    points, size, bounds, max_points, max_voxels = CASES["voxel-budget"]
    expected = _hard(compiled.hard_voxelize_forward, points, size, bounds, max_points, max_voxels)
    voxels = points.new_zeros((max_voxels, max_points, 4))
    coors = torch.zeros((max_voxels, 3), dtype=torch.int)
    num_points = torch.zeros((max_voxels,), dtype=torch.int)
    voxel_num = torch.zeros((), dtype=torch.long)
    voxel.hard_voxelize_forward(
        points, torch.tensor(size), torch.tensor(bounds, dtype=torch.float), voxels, coors, num_points,
        voxel_num, max_points, max_voxels, 3, False,
    )  # fmt: skip
    for a, b in zip((voxels, coors, num_points, voxel_num), expected, strict=True):
        assert torch.equal(a, b)


@pytest.fixture
def emulated_mx(npu_emulator, monkeypatch):
    if importlib.util.find_spec("mx_driving") is None:
        pytest.skip("the emulator serves no mx_driving module")
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    yield
    _kernel_source.forget_choices()


@pytest.mark.parametrize("case", ["roomy", "full-voxels", "voxel-budget", "one-point", "empty"])
def test_hard_voxelize_on_npu_tensors_uses_mx_driving_and_matches(emulated_mx, case, monkeypatch):
    """Emulated NPU: the mx_driving kernel (emulated) computes what mmcv's CPU kernel does."""
    points, size, bounds, max_points, max_voxels = CASES[case]
    expected = _hard(compiled.hard_voxelize_forward, points, size, bounds, max_points, max_voxels)
    calls = []
    import mx_driving

    original = mx_driving.voxelization
    monkeypatch.setattr(
        mx_driving, "voxelization", lambda *a, **k: calls.append(a) or original(*a, **k)
    )
    actual = _hard(
        voxel.hard_voxelize_forward, points.to("npu"), size, bounds, max_points, max_voxels
    )
    for a, b in zip(actual, expected, strict=True):
        assert torch.equal(a.cpu(), b)
    assert len(calls) == (1 if points.shape[0] else 0)
    assert _kernel_source.choose("hard_voxelize_forward") == _kernel_source.MX_DRIVING


# --- dynamic scatter: an explicit reference --------------------------------------------------


def _scatter_reference(feats, coors, reduce):
    """Per-voxel loop (tiny inputs): mmcv's CUDA launcher's results, gradients by autograd."""
    rows = {}
    for i, row in enumerate(coors.tolist()):
        if min(row) >= 0:
            rows.setdefault(tuple(row), []).append(i)
    keys = sorted(rows)
    reduced = []
    for key in keys:
        members = feats[rows[key]]
        if reduce == "max":
            reduced.append(members.max(dim=0).values)
        elif reduce == "sum":
            reduced.append(members.sum(dim=0))
        else:
            reduced.append(members.sum(dim=0) / len(rows[key]))
    out_coors = torch.tensor(keys, dtype=coors.dtype).reshape(-1, coors.shape[1])
    out = torch.stack(reduced) if reduced else feats.new_zeros((0, feats.shape[1]))
    return out, out_coors, rows, keys


def _scatter_inputs(count, seed, with_negative=True, ties=False):
    generator = torch.Generator().manual_seed(seed)
    coors = torch.randint(0, 3, (count, 3), generator=generator, dtype=torch.int32)
    if with_negative and count:
        coors[::7, 1] = -1
    feats = torch.randn(count, 5, generator=generator)
    if ties and count:
        feats = feats.round()  # equal maxima inside a voxel
    return feats, coors


@pytest.mark.parametrize("reduce", ["max", "sum", "mean"])
@pytest.mark.parametrize(
    ("count", "seed", "ties"), [(60, 0, False), (60, 1, True), (1, 2, False), (200, 3, True)]
)
def test_dynamic_scatter_matches_the_reference(with_ours, reduce, count, seed, ties):
    from mmcv.ops import dynamic_scatter

    feats, coors = _scatter_inputs(count, seed, ties=ties)
    leaf = feats.clone().requires_grad_(True)
    out, out_coors = dynamic_scatter(leaf, coors, reduce)
    expected, expected_coors, rows, keys = _scatter_reference(feats, coors, reduce)
    assert torch.equal(out_coors, expected_coors)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    cotangent = torch.randn_like(out)
    out.backward(cotangent)
    grad = torch.zeros_like(feats)
    for v, key in enumerate(keys):
        members = rows[key]
        if reduce == "sum":
            grad[members] = cotangent[v]
        elif reduce == "mean":
            grad[members] = cotangent[v] / len(members)
        else:  # the lowest-numbered point holding the maximum takes the gradient
            for channel in range(feats.shape[1]):
                winner = next(i for i in members if feats[i, channel] == expected[v, channel])
                grad[winner, channel] = cotangent[v, channel]
    torch.testing.assert_close(leaf.grad, grad, atol=1e-6, rtol=1e-6)


def test_dynamic_scatter_outputs_and_edge_cases():
    feats, coors = _scatter_inputs(40, 4)
    _, voxel_coors, point2voxel, counts = voxel.dynamic_point_to_voxel_forward(feats, coors, "mean")
    assert (point2voxel.dtype, counts.dtype, voxel_coors.dtype) == (
        torch.int32,
        torch.int32,
        torch.int32,
    )
    assert torch.equal(point2voxel[::7], torch.full_like(point2voxel[::7], -1))
    assert int(counts.sum()) == int((point2voxel >= 0).sum())
    # empty input: clones and empty maps, as mmcv's launcher
    empty = voxel.dynamic_point_to_voxel_forward(feats[:0], coors[:0], "max")
    assert [tuple(t.shape) for t in empty] == [(0, 5), (0, 3), (0,), (0,)]
    # every row invalid: no voxel
    none = voxel.dynamic_point_to_voxel_forward(feats, torch.full_like(coors, -1), "sum")
    assert none[0].shape == (0, 5) and torch.equal(
        none[2], torch.full((40,), -1, dtype=torch.int32)
    )
    grad = torch.ones_like(feats)
    voxel.dynamic_point_to_voxel_backward(grad, none[0], feats, none[0], none[2], none[3], "sum")
    assert torch.equal(grad, torch.zeros_like(feats))
    with pytest.raises(RuntimeError, match="reduce type"):
        voxel.dynamic_point_to_voxel_forward(feats, coors, "min")


def test_dynamic_scatter_on_non_contiguous_and_fp64_inputs(with_ours):
    from mmcv.ops import DynamicScatter

    feats, coors = _scatter_inputs(80, 5)
    wide = feats.double().t().contiguous().t()
    layer = DynamicScatter([0.5] * 3, [0, 0, 0, 1, 1, 1], average_points=False)
    out, out_coors = layer(wide, coors.t().contiguous().t())
    expected, expected_coors, _, _ = _scatter_reference(feats.double(), coors, "max")
    assert out.dtype == torch.float64
    assert torch.equal(out_coors, expected_coors) and torch.equal(out, expected)


@pytest.mark.parametrize("seed", range(12))
def test_random_configurations_with_points_on_cell_boundaries(seed):
    """Random voxel sizes (inexact ones too), ranges, dtypes and budgets: still bit-equal."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    size = [pick([0.05, 0.075, 0.1, 0.16, 0.25, 0.3, 1.0]) for _ in range(3)]
    low = (torch.rand(3, generator=g) * -5).tolist()
    bounds = low + [v + float(torch.rand(1, generator=g)) * 6 + 0.5 for v in low]
    count = pick([1, 100, 1000])
    points = torch.rand(count, 4, generator=g) * torch.tensor([8.0, 8, 8, 1]) - torch.tensor(
        [6.0, 6, 6, 0]
    )
    snapped = count // 3  # exactly on cell boundaries (and outside the grid)
    cells = torch.randint(-2, 40, (snapped, 3), generator=g).float()
    points[:snapped, :3] = torch.tensor(low) + cells * torch.tensor(size)
    points = points.to(pick([torch.float32, torch.float64, torch.float16]))
    max_points, max_voxels = pick([1, 3, 35]), pick([1, 10, 5000])
    expected = _hard(compiled.hard_voxelize_forward, points, size, bounds, max_points, max_voxels)
    actual = _hard(voxel.hard_voxelize_forward, points, size, bounds, max_points, max_voxels)
    for a, b in zip(actual, expected, strict=True):
        assert torch.equal(a, b)
    coors = {}
    for key, function in (
        ("mmcv", compiled.dynamic_voxelize_forward),
        ("ours", voxel.dynamic_voxelize_forward),
    ):
        coors[key] = torch.zeros((count, 3), dtype=torch.int)
        function(
            points, torch.tensor(size), torch.tensor(bounds, dtype=torch.float), coors[key], NDim=3
        )
    assert torch.equal(coors["ours"], coors["mmcv"])
