"""The emulator's sampling kernels on positions that are NaN, infinite or huge.

Multi-scale deformable attention (mx_driving), deformable convolution
(``npu_deformable_conv2d``, which mx_driving's deform convs reuse) and RoIAlign
(``npu_roi_align`` / ``npu_roi_alignbk``).

Issue 22, item 12: ``mx_driving.multi_scale_deformable_attn`` raised ``index
-9223372036854775808 is out of bounds`` for a NaN sampling location (NaN cast to an
index) where mmcv's path returns a value. The rule now (docs/emulator.md,
"Non-finite sampling positions"): DrivingSDK's kernel, like mmcv's CUDA kernel, counts a
point only strictly inside ``(-1, w) x (-1, h)`` in pixels; any other point, NaN and
infinities included, adds exactly 0 and gets zero gradients. The oracle is mmcv's
pure-PyTorch math (grid_sample, written out in test_mx_driving_kernels.py) on the same
inputs with every such point moved far outside the map, where grid_sample itself gives
0: values and all three gradients must agree, and ours must be finite wherever mmcv's
own result on the raw inputs is.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


SETTINGS = settings(max_examples=60, deadline=None)
SPECIAL = [math.nan, math.inf, -math.inf, 1e30, -1e30, 3e38, -0.25, 1.25]


@pytest.fixture(scope="module")
def mx(emulated):
    import mx_driving

    return mx_driving


def _grid_sample_msda(value, shapes, locations, weights):
    """mmcv's ``multi_scale_deformable_attn_pytorch``: grid_sample per level."""
    import torch.nn.functional as F

    bs, _, heads, dims = value.shape
    _, queries, _, levels, points, _ = locations.shape
    split = value.split([int(h) * int(w) for h, w in shapes.tolist()], dim=1)
    grids = 2 * locations - 1
    sampled = []
    for level, (h, w) in enumerate(shapes.tolist()):
        v = split[level].flatten(2).transpose(1, 2).reshape(bs * heads, dims, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(
            F.grid_sample(v, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    attention = weights.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * attention).sum(-1)
    return out.view(bs, heads * dims, queries).transpose(1, 2).contiguous()


def _counted(locations, shapes):
    """Which points the kernel counts: strictly inside (-1, w) x (-1, h) in pixels."""
    hw = shapes.to(locations.dtype)
    x = locations[..., 0] * hw[:, 1].view(1, 1, 1, -1, 1) - 0.5
    y = locations[..., 1] * hw[:, 0].view(1, 1, 1, -1, 1) - 0.5
    w, h = hw[:, 1].view(1, 1, 1, -1, 1), hw[:, 0].view(1, 1, 1, -1, 1)
    return (x > -1) & (y > -1) & (x < w) & (y < h)


@st.composite
def _msda_case(draw):
    levels = draw(st.integers(1, 2))
    shapes = [(draw(st.integers(1, 4)), draw(st.integers(1, 4))) for _ in range(levels)]
    bs, heads, dims = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    queries, points = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    count = bs * queries * heads * levels * points * 2
    coordinate = st.one_of(st.floats(-0.3, 1.3, allow_nan=False), st.sampled_from(SPECIAL))
    coordinates = draw(st.lists(coordinate, min_size=count, max_size=count))
    seed = draw(st.integers(0, 2**16))
    return shapes, (bs, heads, dims, queries, points), coordinates, seed


@SETTINGS
@given(case=_msda_case())
def test_msda_nonfinite_and_far_points_add_zero_with_zero_gradients(mx, case):
    shapes_list, (bs, heads, dims, queries, points), coordinates, seed = case
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(shapes_list)
    levels = len(shapes_list)
    starts = torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))
    keys = int(shapes.prod(1).sum())
    value = torch.randn(bs, keys, heads, dims, generator=g, dtype=torch.float64)
    locations = torch.tensor(coordinates, dtype=torch.float64).view(
        bs, queries, heads, levels, points, 2
    )
    weights = torch.rand(bs, queries, heads, levels, points, generator=g, dtype=torch.float64)
    grad = torch.randn(bs, queries, heads * dims, generator=g, dtype=torch.float64)

    leaves = [t.clone().requires_grad_() for t in (value, locations, weights)]
    out = mx.multi_scale_deformable_attn(leaves[0], shapes, starts, leaves[1], leaves[2])
    ours = torch.autograd.grad(out, leaves, grad)

    counted = _counted(locations, shapes)
    moved = torch.where(counted.unsqueeze(-1), locations, torch.full_like(locations, 10.0))
    oracle = [t.clone().requires_grad_() for t in (value, moved, weights)]
    expected = _grid_sample_msda(oracle[0], shapes, oracle[1], oracle[2])
    theirs = torch.autograd.grad(expected, oracle, grad)

    torch.testing.assert_close(out.detach(), expected.detach())
    for name, a, b in zip(("value", "locations", "weights"), ours, theirs, strict=True):
        torch.testing.assert_close(a, b, msg=lambda m, n=name: f"gradient of {n}: {m}")
    assert not ours[1][~counted].any(), "an uncounted point got a location gradient"
    assert not ours[2][~counted].any(), "an uncounted point got a weight gradient"

    # Finite wherever mmcv's own result on the raw (non-finite) inputs is.
    raw = [t.clone().requires_grad_() for t in (value, locations, weights)]
    theirs_raw = _grid_sample_msda(raw[0], shapes, raw[1], raw[2])
    raw_grads = torch.autograd.grad(theirs_raw, raw, grad)
    assert torch.isfinite(out[torch.isfinite(theirs_raw)]).all()
    for a, b in zip(ours, raw_grads, strict=True):
        assert torch.isfinite(a[torch.isfinite(b)]).all()
    assert all(torch.isfinite(a).all() for a in ours)


@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf, 1e30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_msda_a_nonfinite_location_is_a_zero_sample_not_an_index_error(mx, special, dtype):
    # The shape: one bad location among good ones, float32 and half.
    g = torch.Generator().manual_seed(0)
    shapes, starts = torch.tensor([[4, 5]]), torch.tensor([0])
    value = torch.randn(1, 20, 1, 8, generator=g).to(dtype)
    locations = torch.rand(1, 2, 1, 1, 2, 2, generator=g).to(dtype)
    weights = torch.rand(1, 2, 1, 1, 2, generator=g).to(dtype)
    bad = locations.clone()
    bad[0, 0, 0, 0, 1, 0] = special  # query 0, point 1: x
    out = mx.multi_scale_deformable_attn(value, shapes, starts, bad, weights)
    # The same as that point's attention weight being 0.
    dropped = weights.clone()
    dropped[0, 0, 0, 0, 1] = 0
    expected = mx.multi_scale_deformable_attn(value, shapes, starts, locations, dropped)
    torch.testing.assert_close(out, expected)
    assert torch.isfinite(out).all()


def test_msda_an_uncounted_point_reads_nothing_and_its_weight_does_not_matter(mx):
    # The kernel zeroes an uncounted point's weight (NaN here) and reads none of its
    # corners: pixel (0, 0), where its clamped corners would land, holds inf.
    shapes, starts = torch.tensor([[2, 2]]), torch.tensor([0])
    value = torch.arange(1.0, 5.0, dtype=torch.float64).view(1, 4, 1, 1)
    value[0, 0] = math.inf
    # Point 0 off the map (pixel x = -6.5), point 1 exactly on pixel (1, 1) = value 4.
    locations = torch.tensor([[[[[[-3.0, 0.25], [0.75, 0.75]]]]]], dtype=torch.float64)
    weights = torch.tensor([[[[[math.nan, 0.5]]]]], dtype=torch.float64)
    out = mx.multi_scale_deformable_attn(value, shapes, starts, locations, weights)
    torch.testing.assert_close(out, torch.tensor([[[2.0]]], dtype=torch.float64))


# --------------------------------------------------------------------- deformable conv


@st.composite
def _deform_case(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    height, width = draw(st.integers(kh, 5)), draw(st.integers(kw, 5))
    dg = draw(st.sampled_from([1, 2]))
    out_h, out_w = height - kh + 1, width - kw + 1
    count = dg * kh * kw * out_h * out_w * 2
    value = st.one_of(st.floats(-2.0, 2.0, allow_nan=False), st.sampled_from(SPECIAL))
    offsets = draw(st.lists(value, min_size=count, max_size=count))
    return (kh, kw, height, width, dg), offsets, draw(st.booleans()), draw(st.integers(0, 2**16))


@SETTINGS
@given(case=_deform_case())
def test_deformable_conv2d_nonfinite_offsets_sample_zero_with_zero_gradients(emulated, case):
    """A NaN, infinite or far offset samples 0, as mmcv's kernels (whose ``h > -1 && ...``
    test NaN fails): the same as a finite offset far off the map, values and gradients."""
    import torch_npu

    (kh, kw, height, width, dg), offsets, modulated, seed = case
    g = torch.Generator().manual_seed(seed)
    out_h, out_w = height - kh + 1, width - kw + 1
    x = torch.randn(1, 2 * dg, height, width, generator=g, dtype=torch.float64)
    weight = torch.randn(3, 2 * dg, kh, kw, generator=g, dtype=torch.float64)
    xy = torch.tensor(offsets, dtype=torch.float64).view(1, 2 * dg * kh * kw, out_h, out_w)
    mask = torch.rand(1, dg * kh * kw, out_h, out_w, generator=g, dtype=torch.float64)
    # A tap is off the map when its x or y offset is not a usable number.
    pairs = xy.view(1, 2, dg * kh * kw, out_h, out_w)
    unusable = (~torch.isfinite(pairs) | (pairs.abs() > 100)).any(1, keepdim=True)
    far = torch.where(unusable.expand_as(pairs), torch.full_like(pairs, 1e4), pairs)
    grad = torch.randn(1, 3, out_h, out_w, generator=g, dtype=torch.float64)

    def run(offset_xy):
        offset = (
            torch.cat([offset_xy.reshape(1, -1, out_h, out_w), mask], 1)
            if modulated
            else (offset_xy.reshape(1, -1, out_h, out_w))
        )
        leaves = [t.clone().requires_grad_() for t in (x, weight, offset)]
        out, _ = torch_npu.npu_deformable_conv2d(
            leaves[0], leaves[1], leaves[2], None, [kh, kw], [1, 1, 1, 1], [0, 0, 0, 0],
            deformable_groups=dg, modulated=modulated,
        )  # fmt: skip
        return out, torch.autograd.grad(out, leaves, grad)

    out, grads = run(xy)
    expected, expected_grads = run(far)
    torch.testing.assert_close(out, expected)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b)
    assert all(torch.isfinite(t).all() for t in (out, *grads))
    assert not grads[2][:, : 2 * dg * kh * kw].view_as(pairs)[unusable.expand_as(pairs)].any()


def test_mx_deform_conv2d_with_a_nan_offset_runs_and_samples_zero(mx):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 5, 5, generator=g)
    weight = torch.randn(2, 2, 3, 3, generator=g)
    offset = torch.randn(1, 18, 3, 3, generator=g)
    bad = offset.clone()
    bad[0, 4, 1, 1] = math.nan  # tap 2's y offset at output (1, 1)
    far = offset.clone()
    far[0, 4, 1, 1] = 1e4
    torch.testing.assert_close(mx.deform_conv2d(x, bad, weight), mx.deform_conv2d(x, far, weight))


# --------------------------------------------------------------------------- RoIAlign


@pytest.mark.parametrize("roi_end_mode", [0, 3])
@pytest.mark.parametrize("sample_num", [0, 2])
def test_roi_align_rois_with_nonfinite_or_huge_corners_pool_zeros(
    emulated, roi_end_mode, sample_num
):
    """A NaN or infinite roi corner used to raise (``math.ceil`` of NaN, an index of
    INT64_MIN); a roi too big for the kernels' 32-bit sample count gets none: 0."""
    import torch_npu

    features = torch.randn(2, 3, 6, 7, generator=torch.Generator().manual_seed(0))
    good = [0.0, 1.0, 1.0, 4.0, 5.0]
    bad = [
        [1.0, math.nan, 1.0, 4.0, 5.0],
        [1.0, 0.0, 0.0, math.inf, 3.0],
        [0.0, -math.inf, 1.0, 2.0, 4.0],
        [0.0, 1e30, 1.0, 2e30, 4.0],
    ]
    rois = torch.tensor([good, *bad])
    out = torch_npu.npu_roi_align(features, rois, 1.0, 2, 2, sample_num, roi_end_mode)
    alone = torch_npu.npu_roi_align(features, rois[:1], 1.0, 2, 2, sample_num, roi_end_mode)
    torch.testing.assert_close(out[:1], alone)
    assert torch.isfinite(out).all()
    if sample_num == 0:
        assert not out[1:].any()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    back = torch.ops.npu.npu_roi_alignbk(
        grad, rois, list(features.shape), 2, 2, 1.0, sample_num, roi_end_mode
    )
    assert torch.isfinite(back).all()


def test_roi_align_refuses_a_batch_index_that_names_no_image(emulated):
    import torch_npu

    features = torch.zeros(2, 1, 4, 4)
    for index in (2.0, -1.0, math.nan):
        with pytest.raises(RuntimeError, match="batch index"):
            torch_npu.npu_roi_align(
                features, torch.tensor([[index, 0.0, 0.0, 2.0, 2.0]]), 1.0, 2, 2, 2, 0
            )


def _graph_nodes(tensor):
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def test_roi_align_backward_graph_does_not_grow_with_the_rois(emulated):
    """Issue 22, item 13: TridentNet's backward ran > 300 s under the emulator. The kernel
    wrote each roi's slice of its output in a loop; npu_roi_alignbk differentiates that,
    and every slice write's backward copies the whole output gradient: quadratic in the
    rois. Counted here, not timed: the graph the backward walks has as many nodes for 64
    rois as for 2."""
    from ascend_patch_emulator._kernels import recording
    from ascend_patch_emulator._kernels.detection import roi_align

    def nodes(count):
        g = torch.Generator().manual_seed(count)
        corners = torch.rand(count, 4, generator=g) * 12
        boxes = torch.cat(
            [corners[:, :2].minimum(corners[:, 2:]), corners[:, :2].maximum(corners[:, 2:])], 1
        )
        rois = torch.cat([torch.zeros(count, 1), boxes], 1)
        with recording():
            features = torch.randn(1, 4, 16, 16, requires_grad=True)
            return _graph_nodes(roi_align(features, rois, 1.0, 7, 7, 0, 0))

    assert nodes(64) == nodes(2)


def test_roi_align_reads_nothing_for_a_sample_beyond_the_map(emulated):
    # Pixel (0, 0) holds inf; the roi's samples all lie more than a pixel off the map.
    import torch_npu

    features = torch.ones(1, 1, 4, 4)
    features[0, 0, 0, 0] = math.inf
    rois = torch.tensor([[0.0, -9.0, -9.0, -5.0, -5.0], [0.0, 2.0, 2.0, 3.0, 3.0]])
    out = torch_npu.npu_roi_align(features, rois, 1.0, 2, 2, 2, 0)
    torch.testing.assert_close(out[0], torch.zeros(1, 2, 2))
    torch.testing.assert_close(out[1], torch.ones(1, 2, 2))
