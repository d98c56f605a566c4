"""``mmcv._ext`` point-cloud family against mmcv 2.1.0's CPU kernel and explicit references.

Runs in the nox session ``openmmlab_cpu_ops``. mmcv 2.1.0 has a CPU kernel only for
``points_in_boxes_cpu_forward``: it is the reference there and, through its
all-pairs flags, for ``points_in_boxes_part/all`` (the CUDA kernels apply the same
test; ``part`` keeps the first box). Every other function is compared with an
explicit reference written in this file after mmcv's CUDA kernels (naive loops on
tiny inputs, or the formula in PyTorch with autograd for gradients):

- furthest point sampling: start at 0, take the largest squared distance to the
  chosen set, first of equal maxima; ``temp`` left holding those distances;
- gather/group/three_interpolate: indexing, gradients by autograd, backward adds into
  the given buffer;
- assign_score_withk: the kernel's formula, gradients by autograd; ``aggregate``
  ignored as there.

Ball query, knn and three_nn are in ``test_ext_points_neighbours.py``; their
mx_driving paths are here, with the others. Tolerances: indices and flags exact;
float32 values 1e-5 (sums in another order). mmcv's own Python (``mmcv.ops.*``) runs
on the family where it can run on CPU (its ``ext_module`` replaced), so the calls are
mmcv's own.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import points as family  # noqa: E402


TOL = {"atol": 1e-5, "rtol": 1e-5}
OURS = SimpleNamespace(**{name: getattr(family, name) for name in family.__all__})


@pytest.fixture
def with_ours(monkeypatch):
    """mmcv's op modules calling this family instead of the compiled extension."""
    for name in (
        "points_in_boxes",
        "furthest_point_sample",
        "ball_query",
        "knn",
        "gather_points",
        "group_points",
        "three_nn",
        "three_interpolate",
        "assign_score_withk",
    ):
        monkeypatch.setattr(importlib.import_module(f"mmcv.ops.{name}"), "ext_module", OURS)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# --- points in boxes -------------------------------------------------------------------


def _scene(batch, boxes, points, seed=0):
    g = _gen(seed)
    centre = torch.rand(batch, boxes, 3, generator=g) * 20 - 10
    size = torch.rand(batch, boxes, 3, generator=g) * 4 + 0.5
    heading = torch.rand(batch, boxes, 1, generator=g) * 6.3 - 3.15
    cloud = torch.rand(batch, points, 3, generator=g) * 24 - 12
    return torch.cat((centre, size, heading), 2), cloud


def _on_faces():
    """One box and points on its faces, edges, corners and just inside/outside."""
    box = torch.tensor([[[1.0, 2.0, -1.0, 2.0, 4.0, 2.0, 0.0]]])
    xs = (0.0, 0.5, 1.0, 1.5, 2.0, 2.0001, 1.9999)
    ys = (0.0, 2.0, 4.0, 3.9999)
    zs = (-1.0, 0.0, 1.0, -1.0001, 1.0001)
    cloud = torch.tensor([[[x, y, z] for x in xs for y in ys for z in zs]])
    rotated = box.clone()
    rotated[..., 6] = 0.7
    return torch.cat((box, rotated), 1), cloud


def _cpu_flags(boxes, cloud):
    """mmcv's compiled kernel: ``[B, M, T]`` flags."""
    flags = torch.zeros(boxes.shape[0], boxes.shape[1], cloud.shape[1], dtype=torch.int)
    for b in range(boxes.shape[0]):
        compiled.points_in_boxes_cpu_forward(
            boxes[b].float().contiguous(), cloud[b].float().contiguous(), flags[b]
        )
    return flags.transpose(1, 2)


SCENES = {
    "random": _scene(2, 12, 500),
    "one-box": _scene(1, 1, 200, seed=1),
    "faces": _on_faces(),
    "no-points": _scene(2, 3, 0),
    "no-boxes": _scene(2, 0, 50),
    "overlapping": (
        torch.tensor([[[0, 0, 0, 4, 4, 4, 0.0], [1, 1, 0, 4, 4, 4, 0.3]]]),
        _scene(1, 1, 300, seed=2)[1] / 3,
    ),
}


@pytest.mark.parametrize("scene", list(SCENES))
def test_points_in_boxes_cpu_equals_mmcvs_kernel(scene, with_ours):
    from mmcv.ops import points_in_boxes_cpu

    boxes, cloud = SCENES[scene]
    expected = _cpu_flags(boxes, cloud)
    assert torch.equal(points_in_boxes_cpu(cloud, boxes), expected)
    # a non-contiguous scene, as given to the _ext function after mmcv's .contiguous()
    out = torch.zeros(boxes.shape[1], cloud.shape[1], dtype=torch.int)
    family.points_in_boxes_cpu_forward(
        boxes[0].t().contiguous().t(), cloud[0].t().contiguous().t(), out
    )
    assert torch.equal(out, expected[0].t())


@pytest.mark.parametrize("scene", list(SCENES))
def test_points_in_boxes_part_and_all_follow_the_cpu_flags(scene):
    boxes, cloud = SCENES[scene]
    flags = _cpu_flags(boxes, cloud)
    part = torch.full(cloud.shape[:2], -1, dtype=torch.int)
    family.points_in_boxes_part_forward(boxes, cloud, part)
    first = torch.where(flags.any(2), flags.argmax(2).int(), -1) if flags.shape[2] else part
    assert torch.equal(part, first)
    every = torch.zeros(*cloud.shape[:2], boxes.shape[1], dtype=torch.int)
    family.points_in_boxes_all_forward(boxes, cloud, every)
    assert torch.equal(every, flags)


def test_points_in_boxes_keeps_the_callers_defaults():
    boxes, cloud = SCENES["random"]
    part = torch.full(cloud.shape[:2], -7, dtype=torch.int)
    family.points_in_boxes_part_forward(boxes, cloud, part)
    flags = _cpu_flags(boxes, cloud)
    assert torch.equal(part[~flags.any(2)], torch.full_like(part[~flags.any(2)], -7))


# --- furthest point sampling ---------------------------------------------------------------


def _fps_reference(distance, count, m):
    """Naive loop: ``distance(i, k)`` the squared distance, first of equal maxima."""
    temp = [1e10] * count
    chosen, picks = 0, [0]
    for _ in range(1, m):
        best, best_i = -1.0, 0
        for k in range(count):
            temp[k] = min(temp[k], distance(chosen, k))
            if temp[k] > best:
                best, best_i = temp[k], k
        chosen = best_i
        picks.append(chosen)
    return picks, temp


def _fps_call(function, data, m):
    b, n = data.shape[:2]
    idx = torch.zeros(b, m, dtype=torch.int32)
    temp = torch.full((b, n), 1e10)
    function(data, temp, idx, b=b, n=n, m=m)
    return idx, temp


@pytest.mark.parametrize(("b", "n", "m"), [(2, 40, 10), (1, 1, 1), (1, 5, 8), (3, 64, 64)])
def test_furthest_point_sampling_matches_the_reference(b, n, m):
    xyz = torch.rand(b, n, 3, generator=_gen(n))
    xyz[:, n // 2 :] = xyz[:, : n - n // 2].clone()  # duplicates: equal maxima occur
    idx, temp = _fps_call(family.furthest_point_sampling_forward, xyz, m)
    for batch in range(b):
        p = xyz[batch].tolist()

        def d(i, k, p=p):
            return float(
                torch.tensor(p[k][0] - p[i][0]) ** 2
                + torch.tensor(p[k][1] - p[i][1]) ** 2
                + torch.tensor(p[k][2] - p[i][2]) ** 2
            )

        picks, expected_temp = _fps_reference(d, n, m)
        assert idx[batch].tolist() == picks
        if m > 1:
            torch.testing.assert_close(temp[batch], torch.tensor(expected_temp), **TOL)


def test_furthest_point_sampling_with_dist_through_mmcv(with_ours):
    from mmcv.ops import furthest_point_sample_with_dist

    xyz = torch.rand(2, 30, 3, generator=_gen(3))
    dist = torch.cdist(xyz, xyz) ** 2
    idx = furthest_point_sample_with_dist(dist, 12)
    for batch in range(2):
        picks, _ = _fps_reference(lambda i, k, b=batch: float(dist[b, i, k]), 30, 12)
        assert idx[batch].tolist() == picks
    assert idx.dtype == torch.int32
    # the plain version on the same points picks the same as with their distance matrix
    plain, _ = _fps_call(family.furthest_point_sampling_forward, xyz, 12)
    with_dist, _ = _fps_call(family.furthest_point_sampling_with_dist_forward, dist, 12)
    assert torch.equal(plain[:, :3], with_dist[:, :3])


def test_furthest_point_sampling_m_zero_writes_nothing_and_no_points_gives_zeros():
    idx = torch.full((1, 0), 5, dtype=torch.int32)
    family.furthest_point_sampling_forward(
        torch.rand(1, 4, 3), torch.full((1, 4), 1e10), idx, 1, 4, 0
    )
    assert idx.shape == (1, 0)
    idx = torch.full((2, 3), 5, dtype=torch.int32)
    family.furthest_point_sampling_forward(torch.rand(2, 0, 3), torch.zeros(2, 0), idx, 2, 0, 3)
    assert idx.tolist() == [[0, 0, 0], [0, 0, 0]]
    idx.fill_(5)
    family.furthest_point_sampling_with_dist_forward(
        torch.rand(2, 0, 0), torch.zeros(2, 0), idx, 2, 0, 3
    )
    assert idx.tolist() == [[0, 0, 0], [0, 0, 0]]


def _knn_call(cloud, centres, k, **spelling):
    b, n, m = cloud.shape[0], cloud.shape[1], centres.shape[1]
    idx = torch.zeros(b, m, k, dtype=torch.int32)
    dist2 = torch.zeros(b, m, k)
    if spelling.get("second"):
        family.knn_forward(
            b=cloud,
            n=centres,
            m=idx,
            nsample=dist2,
            xyz_tensor=b,
            new_xyz_tensor=n,
            idx_tensor=m,
            dist2_tensor=k,
        )
    elif spelling.get("positional"):
        family.knn_forward(cloud, centres, idx, dist2, b, n, m, k)
    else:  # mmcv/ops/knn.py's call
        family.knn_forward(cloud, centres, idx, dist2, b=b, n=n, m=m, nsample=k)
    return idx, dist2


# --- gathers and interpolation (forward and backward through mmcv's Functions) -------------


def _grads(output, leaves):
    cotangent = torch.randn(output.shape, generator=_gen(7))
    return torch.autograd.grad(output, leaves, cotangent), cotangent


def test_gather_points_forward_backward(with_ours):
    from mmcv.ops import gather_points

    features = torch.randn(2, 4, 30, generator=_gen(1), requires_grad=True)
    idx = torch.randint(0, 30, (2, 12), generator=_gen(2), dtype=torch.int32)
    idx[:, :4] = 3  # repeated indices: the gradient adds up
    out = gather_points(features, idx)
    expected = features.gather(2, idx.long().unsqueeze(1).expand(2, 4, 12))
    torch.testing.assert_close(out, expected, **TOL)
    (got,), cotangent = _grads(out, [features])
    (want,) = torch.autograd.grad(expected, [features], cotangent)
    torch.testing.assert_close(got, want, **TOL)


def test_group_points_forward_backward(with_ours):
    from mmcv.ops import grouping_operation

    features = torch.randn(2, 3, 25, generator=_gen(3), requires_grad=True)
    idx = torch.randint(0, 25, (2, 6, 5), generator=_gen(4), dtype=torch.int32)
    out = grouping_operation(features, idx)
    expected = torch.stack([features[b][:, idx[b].long()] for b in range(2)])
    torch.testing.assert_close(out, expected, **TOL)
    (got,), cotangent = _grads(out, [features])
    (want,) = torch.autograd.grad(expected, [features], cotangent)
    torch.testing.assert_close(got, want, **TOL)


def test_three_interpolate_forward_backward(with_ours):
    from mmcv.ops import three_interpolate

    features = torch.randn(2, 4, 10, generator=_gen(5), requires_grad=True)
    idx = torch.randint(0, 10, (2, 15, 3), generator=_gen(6), dtype=torch.int32)
    weight = torch.rand(2, 15, 3, generator=_gen(7))
    out = three_interpolate(features, idx, weight)
    expected = sum(
        weight[:, :, k].unsqueeze(1)
        * torch.stack([features[b][:, idx[b, :, k].long()] for b in range(2)])
        for k in range(3)
    )
    torch.testing.assert_close(out, expected, **TOL)
    (got,), cotangent = _grads(out, [features])
    (want,) = torch.autograd.grad(expected, [features], cotangent)
    torch.testing.assert_close(got, want, **TOL)


def test_backwards_add_into_the_given_buffer():
    grad_points = torch.ones(1, 2, 5)
    family.gather_points_backward(
        torch.ones(1, 2, 3), torch.tensor([[0, 0, 4]], dtype=torch.int32), grad_points, 1, 2, 5, 3
    )
    assert grad_points[0, 0].tolist() == [3.0, 1.0, 1.0, 1.0, 2.0]


# --- assign_score_withk ----------------------------------------------------------------------


def _paconv_inputs(b=2, n0=12, n1=6, m=3, k=4, o=5, invalid=False):
    g = _gen(11)
    points = torch.randn(b, n0, m, o, generator=g, requires_grad=True)
    centers = torch.randn(b, n0, m, o, generator=g, requires_grad=True)
    scores = torch.rand(b, n1, k, m, generator=g, requires_grad=True)
    knn_idx = torch.randint(0, n0, (b, n1, k), generator=g)
    if invalid:
        knn_idx[0, 1, 2] = n0  # out of range: contributes nothing
    return scores, points, centers, knn_idx


def _paconv_reference(scores, points, centers, knn_idx):
    b = knn_idx.shape[0]
    valid = ((knn_idx >= 0) & (knn_idx < points.shape[1])).float()
    safe = knn_idx.clamp(0, points.shape[1] - 1)
    batch = torch.arange(b).reshape(b, 1, 1)
    neighbour = points[batch, safe]  # [B, N1, K, M, O]
    centre = centers[batch[..., 0], safe[..., 0]]  # [B, N1, M, O]
    value = (scores.unsqueeze(-1) * (neighbour - centre.unsqueeze(2))).sum(3)  # [B, N1, K, O]
    return (value * valid.unsqueeze(-1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("aggregate", ["sum", "avg", "max"])
@pytest.mark.parametrize("invalid", [False, True])
def test_assign_score_withk_forward_backward(with_ours, aggregate, invalid):
    from mmcv.ops import assign_score_withk

    scores, points, centers, knn_idx = _paconv_inputs(invalid=invalid)
    out = assign_score_withk(scores, points, centers, knn_idx, aggregate)
    expected = _paconv_reference(scores, points, centers, knn_idx)
    torch.testing.assert_close(out, expected, **TOL)
    got, cotangent = _grads(out, [scores, points, centers])
    want = torch.autograd.grad(expected, [scores, points, centers], cotangent)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL)


# --- emulated NPU: the portable kernels run (mx_driving's are stand-ins there) ---------------


def test_npu_tensors_run_on_the_portable_kernels(npu_emulator, monkeypatch):
    from ascend_patch_mmcv import _kernel_source

    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    try:
        cloud = torch.rand(1, 40, 3, generator=_gen(9))
        centres = cloud[:, :8].contiguous()
        cpu_idx, cpu_d = _knn_call(cloud, centres, 4)
        npu_idx, npu_d = _knn_call(cloud.to("npu"), centres.to("npu"), 4)
        assert torch.equal(npu_idx.cpu(), cpu_idx) and torch.equal(npu_d.cpu(), cpu_d)
        fps_cpu, _ = _fps_call(family.furthest_point_sampling_forward, cloud, 10)
        fps_npu, _ = _fps_call(family.furthest_point_sampling_forward, cloud.to("npu"), 10)
        assert torch.equal(fps_npu.cpu(), fps_cpu)
        assert _kernel_source.choose("knn_forward") == _kernel_source.PORTABLE
    finally:
        _kernel_source.forget_choices()


# --- the mx_driving paths, with test doubles of mx_driving's public functions ----------------
# The emulator's mx_driving has no kernel for these ops (stand-ins), so the doubles below
# stand for DrivingSDK's functions with the results its Python wrappers document (shapes,
# layouts); they check the glue -- argument order, transposes, what is written where --
# not the NPU kernels, which need an Ascend machine.


@pytest.fixture
def mx_doubles(npu_emulator, monkeypatch):
    from ascend_patch_mmcv import _kernel_source

    mx_driving = pytest.importorskip("mx_driving")
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    calls = []

    def double(name, function):
        def record(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)

        monkeypatch.setattr(mx_driving, name, record)
        _kernel_source.forget_choices()  # choose again: the name has a "kernel" now

    yield double, calls
    _kernel_source.forget_choices()


def test_mx_driving_paths_write_mmcvs_outputs(mx_doubles):
    double, calls = mx_doubles
    cloud = torch.rand(2, 30, 3, generator=_gen(21))
    centres = cloud[:, :6].contiguous()
    fps_expected, _ = _fps_call(family.furthest_point_sampling_forward, cloud, 7)
    knn_expected = _knn_call(cloud, centres, 4)
    nn_dist, nn_idx = torch.zeros(2, 30, 3), torch.zeros(2, 30, 3, dtype=torch.int32)
    family.three_nn_forward(cloud, centres, nn_dist, nn_idx, 2, 30, 6)
    boxes, scene = SCENES["random"]
    part_expected = torch.full(scene.shape[:2], -1, dtype=torch.int)
    family.points_in_boxes_part_forward(boxes, scene, part_expected)
    all_expected = torch.zeros(*scene.shape[:2], boxes.shape[1], dtype=torch.int)
    family.points_in_boxes_all_forward(boxes, scene, all_expected)

    # mx_driving's results: fps [B, m] int32; knn [B, k, npoint]; three_nn (sqrt dist, idx)
    double("furthest_point_sampling", lambda xyz, m: fps_expected.clone())
    double("knn", lambda k, xyz, centre, transposed: knn_expected[0].transpose(1, 2).contiguous())
    double("three_nn", lambda target, source: (nn_dist.sqrt(), nn_idx.clone()))
    double("npu_points_in_box", lambda b, p: part_expected.clone())
    double("npu_points_in_box_all", lambda b, p: all_expected.clone())
    fps, _ = _fps_call(family.furthest_point_sampling_forward, cloud.to("npu"), 7)
    knn_idx, knn_d2 = _knn_call(cloud.to("npu"), centres.to("npu"), 4)
    got_dist, got_idx = torch.zeros(2, 30, 3), torch.zeros(2, 30, 3, dtype=torch.int32)
    family.three_nn_forward(cloud.to("npu"), centres.to("npu"), got_dist, got_idx, 2, 30, 6)
    part = torch.full(scene.shape[:2], -1, dtype=torch.int)
    family.points_in_boxes_part_forward(boxes.to("npu"), scene.to("npu"), part)
    every = torch.zeros(*scene.shape[:2], boxes.shape[1], dtype=torch.int)
    family.points_in_boxes_all_forward(boxes.to("npu"), scene.to("npu"), every)
    assert calls == [
        "furthest_point_sampling",
        "knn",
        "three_nn",
        "npu_points_in_box",
        "npu_points_in_box_all",
    ]
    assert torch.equal(fps, fps_expected)
    assert torch.equal(knn_idx, knn_expected[0]) and torch.equal(knn_d2, knn_expected[1])
    assert torch.equal(got_idx, nn_idx) and torch.equal(got_dist, nn_dist)  # dist2 gathered exactly
    assert torch.equal(part, part_expected) and torch.equal(every, all_expected)


def test_mx_driving_paths_of_group_and_interpolate(mx_doubles):
    double, calls = mx_doubles
    features = torch.randn(2, 3, 20, generator=_gen(22))
    idx = torch.randint(0, 20, (2, 5, 4), generator=_gen(23), dtype=torch.int32)
    grouped = torch.zeros(2, 3, 5, 4)
    family.group_points_forward(features, idx, grouped, 2, 3, 20, 5, 4)
    tri_idx = torch.randint(0, 20, (2, 7, 3), generator=_gen(24), dtype=torch.int32)
    weight = torch.rand(2, 7, 3, generator=_gen(25))
    interpolated = torch.zeros(2, 3, 7)
    family.three_interpolate_forward(features, tri_idx, weight, interpolated, 2, 3, 20, 7)
    double("group_points", lambda f, i: grouped.clone())
    double("three_interpolate", lambda f, i, w: interpolated.clone())
    out = torch.zeros(2, 3, 5, 4)
    family.group_points_forward(features.to("npu"), idx.to("npu"), out, 2, 3, 20, 5, 4)
    out2 = torch.zeros(2, 3, 7)
    family.three_interpolate_forward(features.to("npu"), tri_idx, weight, out2, 2, 3, 20, 7)
    assert calls == ["group_points", "three_interpolate"]
    assert torch.equal(out, grouped) and torch.equal(out2, interpolated)


@pytest.mark.parametrize("seed", range(8))
def test_points_on_rotated_box_faces_equal_mmcvs_kernel(seed):
    """Points placed on the faces of random (rotated) boxes: the strict/non-strict edges."""
    g = _gen(seed)
    count = 8
    boxes = torch.cat(
        (
            torch.rand(count, 3, generator=g) * 4 - 2,
            torch.rand(count, 3, generator=g) * 2 + 0.1,
            (torch.rand(count, 1, generator=g) * 6.3 - 3.15) * (seed % 2),
        ),
        1,
    )
    owner = boxes[torch.randint(0, count, (300,), generator=g)]
    local = torch.rand(300, 3, generator=g) * 2 - 1
    face = torch.randint(0, 3, (300,), generator=g)
    local[torch.arange(300), face] = local[torch.arange(300), face].sign()
    lx, ly, lz = (
        local[:, 0] * owner[:, 3] / 2,
        local[:, 1] * owner[:, 4] / 2,
        (local[:, 2] + 1) * owner[:, 5] / 2,
    )
    cos, sin = torch.cos(owner[:, 6]), torch.sin(owner[:, 6])
    cloud = torch.stack(
        (owner[:, 0] + lx * cos - ly * sin, owner[:, 1] + lx * sin + ly * cos, owner[:, 2] + lz), 1
    )
    expected = torch.zeros(count, 300, dtype=torch.int)
    compiled.points_in_boxes_cpu_forward(boxes, cloud, expected)
    actual = torch.zeros(count, 300, dtype=torch.int)
    family.points_in_boxes_cpu_forward(boxes, cloud, actual)
    assert torch.equal(actual, expected)
