"""The emulated mx_driving kernels against independent computations: mmcv's pure-PyTorch
deformable-attention math (grid_sample), naive loops on tiny inputs, torch's own ops, and
float64 gradchecks, forward and gradients, called with the wheel's argument conventions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(scope="module")
def mx(emulated):
    import mx_driving

    return mx_driving


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- MSDA


def msda_grid_sample(value, shapes, locations, weights):
    """mmcv's ``multi_scale_deformable_attn_pytorch``, written out: grid_sample per level."""
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


def msda_inputs(dtype=torch.float64, seed=0):
    g = _generator(seed)
    shapes = torch.tensor([[4, 5], [2, 3]])
    starts = torch.tensor([0, 20])
    bs, heads, dims, queries, points = 2, 2, 3, 4, 2
    value = torch.randn(bs, 26, heads, dims, generator=g, dtype=dtype)
    # Some locations fall outside [0, 1]: the zero padding is part of the contract.
    locations = torch.rand(bs, queries, heads, 2, points, 2, generator=g, dtype=dtype) * 1.3 - 0.15
    weights = torch.rand(bs, queries, heads, 2, points, generator=g, dtype=dtype).softmax(-1)
    return value, shapes, starts, locations, weights


def test_msda_forward_matches_mmcv_pytorch_math(mx):
    value, shapes, starts, locations, weights = msda_inputs()
    out = mx.multi_scale_deformable_attn(value, shapes, starts, locations, weights)
    assert out.shape == (2, 4, 6) and out.dtype == torch.float64
    torch.testing.assert_close(out, msda_grid_sample(value, shapes, locations, weights))
    same = mx.MultiScaleDeformableAttnFunction.apply(value, shapes, starts, locations, weights)
    torch.testing.assert_close(same, out)


def test_msda_gradients_match_mmcv_math_and_gradcheck(mx):
    inputs = msda_inputs()
    value, shapes, starts, locations, weights = (
        t.clone().requires_grad_(t.is_floating_point()) for t in inputs
    )
    out = mx.multi_scale_deformable_attn(value, shapes, starts, locations, weights)
    reference = [t.detach().clone().requires_grad_() for t in (value, locations, weights)]
    expected = msda_grid_sample(reference[0], shapes, reference[1], reference[2])
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (value, locations, weights), grad)
    theirs = torch.autograd.grad(expected, reference, grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)

    def function(v, loc, w):
        return mx.MultiScaleDeformableAttnFunction.apply(v, shapes, starts, loc, w)

    # Locations away from pixel centres, where bilinear sampling is differentiable.
    v, _, _, _, w = msda_inputs(seed=3)
    loc = (torch.rand(2, 4, 2, 2, 2, 2, generator=_generator(4), dtype=torch.float64) * 0.8) + 0.1
    assert torch.autograd.gradcheck(
        function, (v.requires_grad_(), loc.requires_grad_(), w.requires_grad_())
    )


def test_msda_half_and_float_inputs_keep_their_dtype(mx):
    value, shapes, starts, locations, weights = msda_inputs(torch.float32)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        given = [t.to(dtype) for t in (value, locations, weights)]
        # The reference sees the same (rounded) inputs, in float64.
        expected = msda_grid_sample(given[0].double(), shapes, *(t.double() for t in given[1:]))
        out = mx.multi_scale_deformable_attn(given[0], shapes, starts, given[1], given[2])
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


def test_msda_refuses_empty_inputs(mx):
    value, shapes, starts, locations, weights = msda_inputs()
    with pytest.raises(RuntimeError, match="empty"):
        mx.multi_scale_deformable_attn(value[:0], shapes, starts, locations, weights)


# --------------------------------------------------------------------------- deformable conv


def _bilinear_zero(image, y, x):
    """mmcv's deformable-conv sample of ``image [C, H, W]`` at (y, x): zero beyond -1..H/W."""
    channels, height, width = image.shape
    if y <= -1 or y >= height or x <= -1 or x >= width:
        return image.new_zeros(channels)
    y0, x0 = math.floor(y), math.floor(x)
    total = image.new_zeros(channels)
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < height and 0 <= xx < width:
                total = total + image[:, yy, xx] * wy * wx
    return total


def naive_deform_conv(x, offset, weight, mask, stride, padding, dilation, groups, dg):
    """A loop over outputs and taps of mmcv's DCN definition (offset pairs are (y, x))."""
    batch, cin, _, _ = x.shape
    cout, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[-2:]
    out = x.new_zeros(batch, cout, out_h, out_w)
    per_group, per_dg = cin // groups, cin // dg
    outs_per_group = cout // groups
    for n in range(batch):
        for oy in range(out_h):
            for ox in range(out_w):
                columns = x.new_zeros(cin, kh, kw)
                for g in range(dg):
                    for i in range(kh):
                        for j in range(kw):
                            k = i * kw + j
                            dy = float(offset[n, g * 2 * kh * kw + 2 * k, oy, ox])
                            dx = float(offset[n, g * 2 * kh * kw + 2 * k + 1, oy, ox])
                            y = oy * stride - padding + i * dilation + dy
                            xx = ox * stride - padding + j * dilation + dx
                            part = x[n, g * per_dg : (g + 1) * per_dg]
                            sample = _bilinear_zero(part, y, xx)
                            if mask is not None:
                                sample = sample * mask[n, g * kh * kw + k, oy, ox]
                            columns[g * per_dg : (g + 1) * per_dg, i, j] = sample
                for o in range(cout):
                    group = o // outs_per_group
                    block = columns[group * per_group : (group + 1) * per_group]
                    out[n, o, oy, ox] = (weight[o] * block).sum()
    return out


def _dcn_inputs(cin, cout, k, dg, groups, modulated, seed=0, size=5, stride=1, padding=1):
    g = _generator(seed)
    x = torch.randn(1, cin, size, size, generator=g, dtype=torch.float64)
    out_size = (size + 2 * padding - k) // stride + 1
    offset = torch.randn(1, dg * 2 * k * k, out_size, out_size, generator=g, dtype=torch.float64)
    weight = torch.randn(cout, cin // groups, k, k, generator=g, dtype=torch.float64) * 0.3
    mask = (
        torch.rand(1, dg * k * k, out_size, out_size, generator=g, dtype=torch.float64)
        if modulated
        else None
    )
    return x, offset, weight, mask


@pytest.mark.parametrize(("dg", "groups", "stride"), [(1, 1, 1), (2, 2, 2)])
def test_deform_conv2d_matches_a_naive_loop(mx, dg, groups, stride):
    x, offset, weight, _ = _dcn_inputs(4, 4, 3, dg, groups, False, stride=stride)
    out = mx.deform_conv2d(x, offset, weight, stride, 1, 1, groups, dg)
    expected = naive_deform_conv(x, offset, weight, None, stride, 1, 1, groups, dg)
    torch.testing.assert_close(out, expected)
    same = mx.DeformConv2dFunction.apply(x, offset, weight, stride, 1, 1, groups, dg, False, 32)
    torch.testing.assert_close(same, expected)
    single = mx.deform_conv2d(x.float(), offset.float(), weight.float(), stride, 1, 1, groups, dg)
    assert single.dtype == torch.float32
    torch.testing.assert_close(single.double(), expected, rtol=1e-4, atol=1e-4)


def test_deform_conv2d_gradcheck(mx):
    x, offset, weight, _ = _dcn_inputs(2, 2, 2, 1, 1, False, size=3, padding=0)
    offset = offset * 0.3 + 0.25  # away from integer sample points

    def function(a, b, c):
        return mx.DeformConv2dFunction.apply(a, b, c, 1, 0, 1, 1, 1, False, 32)

    assert torch.autograd.gradcheck(
        function, (x.requires_grad_(), offset.requires_grad_(), weight.requires_grad_())
    )


def test_modulated_deform_conv2d_matches_a_naive_loop_and_ignores_bias(mx):
    x, offset, weight, mask = _dcn_inputs(64, 64, 3, 1, 1, True, size=3)
    bias = torch.randn(64, dtype=torch.float64)
    out = mx.modulated_deform_conv2d(x, offset, mask, weight, bias, 1, 1, 1, 1, 1)
    expected = naive_deform_conv(x, offset, weight, mask, 1, 1, 1, 1, 1)
    # The wheel's forward hands no bias to its kernel: the emulator adds none either.
    torch.testing.assert_close(out, expected)
    same = mx.ModulatedDeformConv2dFunction.apply(x, offset, mask, weight, None, 1, 1, 1, 1, 1)
    torch.testing.assert_close(same, expected)


def test_modulated_deform_conv2d_gradients(mx):
    x, offset, weight, mask = _dcn_inputs(64, 64, 3, 1, 1, True, size=3, seed=2)
    offset = offset * 0.3 + 0.25
    leaves = [t.requires_grad_() for t in (x, offset, mask, weight)]

    def function(a, b, c, d):
        return mx.ModulatedDeformConv2dFunction.apply(a, b, c, d, None, 1, 1, 1, 1, 1)

    assert torch.autograd.gradcheck(function, tuple(leaves), fast_mode=True)


def test_modulated_deform_conv2d_keeps_the_wheels_limits(mx):
    x, offset, weight, mask = _dcn_inputs(4, 4, 3, 1, 1, True)
    with pytest.raises(ValueError, match="multiples of 64"):
        mx.modulated_deform_conv2d(x, offset, mask, weight)
    x, offset, weight, mask = _dcn_inputs(64, 64, 2, 1, 1, True)
    with pytest.raises(ValueError, match="3x3"):
        mx.modulated_deform_conv2d(x, offset, mask, weight)


# --------------------------------------------------------------------------- add_relu, max_pool


def test_npu_add_relu_forward_and_gradients(mx):
    g = _generator(5)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    out = mx.npu_add_relu(x, y)
    torch.testing.assert_close(out, torch.relu(x + y))
    assert torch.autograd.gradcheck(mx.npu_add_relu, (x, y))
    half = mx.npu_add_relu(x.detach().half(), y.detach().half())
    assert half.dtype == torch.float16


def test_npu_max_pool2d_matches_torch_and_has_no_backward(mx):
    x = torch.randn(2, 16, 9, 7, generator=_generator(6))
    torch.testing.assert_close(mx.npu_max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1))
    half = x.half()
    torch.testing.assert_close(mx.npu_max_pool2d(half, 3, 2, 1), F.max_pool2d(half, 3, 2, 1))
    out = mx.npu_max_pool2d(x.requires_grad_(), 3, 2, 1)
    with pytest.raises(NotImplementedError):
        out.sum().backward()


@pytest.mark.parametrize(
    ("shape", "dtype", "pool", "message"),
    [
        ((2, 16, 9, 7), torch.float32, (2, 2, 0), "only kernel_size=3, stride=2, padding=1"),
        ((2, 16, 9, 7), torch.float32, (3, 1, 1), "only kernel_size=3, stride=2, padding=1"),
        ((2, 3, 9, 7), torch.float32, (3, 2, 1), "3 channels; at most 1024, a multiple of 8"),
        ((2, 8, 9, 7), torch.float16, (3, 2, 1), "a multiple of 16"),
        ((2, 2048, 4, 4), torch.float32, (3, 2, 1), "2048 channels"),
        ((16, 9, 7), torch.float32, (3, 2, 1), "must be 4-D float32 or float16"),
        ((2, 16, 9, 7), torch.float64, (3, 2, 1), "must be 4-D float32 or float16"),
    ],
)
def test_npu_max_pool2d_refuses_what_the_wheel_refuses(mx, shape, dtype, pool, message):
    with pytest.raises(RuntimeError, match=message):
        mx.npu_max_pool2d(torch.zeros(shape, dtype=dtype), *pool)


# --------------------------------------------------------------------------- scatter


def naive_scatter(src, index, dim, size, reduce):
    """Loops: every element of ``src`` goes to slot ``index`` (1-d index lies along ``dim``)."""
    moved = src.movedim(dim, 0)
    out = moved.new_zeros(size, *moved.shape[1:])
    count = torch.zeros(size, *moved.shape[1:])
    for i in range(moved.shape[0]):
        out[int(index[i])] += moved[i]
        count[int(index[i])] += 1
    if reduce == "mean":
        out = out / count.clamp(min=1)
    return out.movedim(0, dim)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reduce", ["add", "mean"])
def test_scatter_add_and_mean_match_loops_with_gradients(mx, dim, reduce):
    g = _generator(7)
    src = torch.randn(5, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    extent = src.shape[dim]
    index = torch.randint(0, 3, (extent,), generator=g).int()
    kernel = getattr(mx, f"scatter_{reduce}")
    out = kernel(src, index, None, dim, 4)
    torch.testing.assert_close(out, naive_scatter(src.detach(), index, dim, 4, reduce))
    assert torch.autograd.gradcheck(lambda s: kernel(s, index, None, dim, 4), (src,))
    # dim_size None: one past the largest index; float32 in, float32 out.
    single = kernel(src.detach().float(), index, None, dim, None)
    assert single.dtype == torch.float32 and single.shape[dim] == int(index.max()) + 1


def test_scatter_add_takes_an_index_shaped_like_src(mx):
    src = torch.arange(12.0).view(3, 4)
    index = torch.tensor([[0, 1, 0, 1], [1, 1, 0, 0], [2, 0, 2, 0]])
    expected = torch.zeros(3, 4).scatter_add_(0, index, src)
    torch.testing.assert_close(mx.scatter_add(src, index.int()), expected)
    torch.testing.assert_close(mx.scatter_add(src.half(), index.int()), expected.half())


def test_scatter_max_values_argmax_and_gradients(mx):
    updates = torch.tensor([[1.0, 5.0], [3.0, 5.0], [2.0, -1.0], [3.0, 0.0], [-4.0, -2.0]])
    indices = torch.tensor([0, 0, 2, 0, 2], dtype=torch.int32)
    values, argmax = mx.scatter_max(updates, indices)
    # Slot 1 is empty: value 0, argmax = the row count; ties go to the first row.
    torch.testing.assert_close(values, torch.tensor([[3.0, 5.0], [0.0, 0.0], [2.0, -1.0]]))
    assert argmax.dtype == torch.int32
    assert argmax.tolist() == [[1, 0], [5, 5], [2, 2]]
    leaf = updates.double().requires_grad_()
    out, _ = mx.scatter_max(leaf, indices)
    out.backward(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64))
    expected = torch.zeros(5, 2, dtype=torch.float64)
    expected[1, 0], expected[0, 1], expected[2, 0], expected[2, 1] = 1, 2, 5, 6
    torch.testing.assert_close(leaf.grad, expected)
    g = _generator(8)
    distinct = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    slots = torch.tensor([0, 2, 2, 1, 0, 2], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda u: mx.scatter_max(u, slots)[0], (distinct,))


def test_scatter_max_with_out_takes_its_values_into_the_max(mx):
    updates = torch.tensor([[1.0], [4.0], [2.0]])
    out = torch.tensor([[3.0], [3.0], [9.0]])
    values, argmax = mx.scatter_max(updates, torch.tensor([0, 1, 1], dtype=torch.int32), out)
    torch.testing.assert_close(values, torch.tensor([[3.0], [4.0], [9.0]]))
    assert argmax.tolist() == [[3], [1], [3]]


def test_the_torch_plugins_scatter_reaches_these_kernels_and_agrees_with_its_torch_path(
    emulated,
):
    compat = pytest.importorskip("ascend_patch_torch.served.torch_scatter")
    from ascend_patch_emulator import CallRecorder

    g = _generator(9)
    src = torch.randn(7, 3, generator=g)
    index = torch.randint(0, 4, (7,), generator=g)
    with CallRecorder() as recorder:
        on_npu = {
            "sum": compat.scatter_sum(src.to("npu"), index.to("npu"), 0),
            "mean": compat.scatter_mean(src.to("npu"), index.to("npu"), 0, dim_size=5),
            "max": compat.scatter_max(src.to("npu"), index.to("npu"), 0),
        }
    reached = {c.op for c in recorder.calls if c.library == "mx_driving"}
    assert reached == {"scatter_add", "scatter_mean", "scatter_max"}
    # CPU tensors take the plugin's own torch path: the independent computation.
    torch.testing.assert_close(on_npu["sum"], compat.scatter_sum(src, index, 0))
    torch.testing.assert_close(on_npu["mean"], compat.scatter_mean(src, index, 0, dim_size=5))
    values, arg = on_npu["max"]
    expected_values, expected_arg = compat.scatter_max(src, index, 0)
    torch.testing.assert_close(values, expected_values)
    assert arg.tolist() == expected_arg.tolist()


# --------------------------------------------------------------------------- voxelization


def naive_hard_voxelize(points, voxel_size, coors_range, max_points, max_voxels, layout):
    """mmcv's hard voxelization as a loop over the points in order (float32 arithmetic)."""
    size = torch.tensor(voxel_size, dtype=torch.float32)
    low = torch.tensor(coors_range[:3], dtype=torch.float32)
    grid = torch.round((torch.tensor(coors_range[3:], dtype=torch.float32) - low) / size).long()
    voxel_of: dict[tuple[int, ...], int] = {}
    voxels = torch.zeros(max_voxels, max_points, points.shape[1])
    counts = [0] * max_voxels
    coors: list[list[int]] = []
    for point in points:
        cell = torch.floor((point[:3] - low) / size).long()
        if bool(((cell < 0) | (cell >= grid)).any()):
            continue
        key = tuple(cell.tolist())
        if key not in voxel_of:
            if len(voxel_of) >= max_voxels:
                continue
            voxel_of[key] = len(voxel_of)
            coors.append(list(key) if layout == "XYZ" else list(key)[::-1])
        number = voxel_of[key]
        if counts[number] < max_points:
            voxels[number, counts[number]] = point
            counts[number] += 1
    found = len(voxel_of)
    return (
        found,
        voxels[:found],
        torch.tensor(coors, dtype=torch.int32).view(-1, 3),
        torch.tensor(counts[:found], dtype=torch.int32),
    )


@pytest.mark.parametrize(("max_points", "max_voxels", "layout"), [(3, 40, "XYZ"), (2, 6, "ZYX")])
def test_hard_voxelization_matches_a_loop(mx, max_points, max_voxels, layout):
    g = _generator(10)
    points = torch.rand(80, 4, generator=g) * torch.tensor([4.4, 3.2, 2.2, 1.0]) - 0.2
    voxel_size, coors_range = [1.0, 0.8, 1.0], [0.0, 0.0, 0.0, 4.0, 3.2, 2.0]
    got = mx.voxelization(points, voxel_size, coors_range, max_points, max_voxels, True, layout)
    expected = naive_hard_voxelize(points, voxel_size, coors_range, max_points, max_voxels, layout)
    assert got[0] == expected[0]
    for a, b in zip(got[1:], expected[1:], strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_voxelization_module_uses_training_and_testing_caps(mx):
    points = torch.rand(60, 3, generator=_generator(11)) * 4
    layer = mx.Voxelization([1.0, 1.0, 1.0], [0, 0, 0, 4, 4, 4], 2, (5, 9))
    assert layer(points)[0] == 5
    layer.eval()
    count, voxels, coors, per_voxel = layer(points)
    assert count == 9 and voxels.shape == (9, 2, 3) and coors.shape == (9, 3)
    assert int(per_voxel.max()) <= 2


def test_dynamic_voxelization_says_it_has_no_kernel(mx):
    with pytest.raises(NotImplementedError, match="dynamic voxelization"):
        mx.voxelization(torch.rand(5, 3), [1.0, 1.0, 1.0], [0, 0, 0, 4, 4, 4])


# --------------------------------------------------------------------------- focal loss


def naive_focal_loss(logit, target, gamma, alpha, weight):
    """mmcv's sigmoid focal loss element by element, with ``math``."""
    rows, classes = logit.shape
    out = torch.zeros(rows, classes, dtype=torch.float64)
    for n in range(rows):
        for c in range(classes):
            p = 1 / (1 + math.exp(-float(logit[n, c])))
            if int(target[n]) == c:
                value = -alpha * (1 - p) ** gamma * math.log(p)
            else:
                value = -(1 - alpha) * p**gamma * math.log(1 - p)
            if weight is not None and int(target[n]) < classes:
                value *= float(weight[int(target[n])])
            out[n, c] = value
    return out


@pytest.mark.parametrize("with_weight", [False, True])
def test_sigmoid_focal_loss_matches_the_formula_with_gradients(mx, with_weight):
    g = _generator(12)
    logit = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 2, 3, 1, 2])  # 3 = background
    weight = torch.rand(3, generator=g, dtype=torch.float64) + 0.5 if with_weight else None
    expected = naive_focal_loss(logit.detach(), target, 1.5, 0.3, weight)
    none = mx.sigmoid_focal_loss(logit, target, 1.5, 0.3, weight, "none")
    torch.testing.assert_close(none, expected)
    torch.testing.assert_close(
        mx.sigmoid_focal_loss(logit, target, 1.5, 0.3, weight, "sum"), expected.sum()
    )
    torch.testing.assert_close(
        mx.sigmoid_focal_loss(logit, target, 1.5, 0.3, weight, "mean"), expected.sum() / 5
    )
    for reduction in ("none", "mean"):
        assert torch.autograd.gradcheck(
            lambda x, r=reduction: mx.sigmoid_focal_loss(x, target, 1.5, 0.3, weight, r),
            (logit,),
        )
    single = mx.sigmoid_focal_loss(logit.detach().float(), target)
    assert single.dtype == torch.float32 and single.dim() == 0


def test_sigmoid_focal_loss_checks_its_arguments_as_the_wheel(mx):
    logit = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="int64"):
        mx.sigmoid_focal_loss(logit, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="reduction"):
        mx.sigmoid_focal_loss(logit, torch.zeros(4, dtype=torch.long), 2.0, 0.25, None, "avg")
