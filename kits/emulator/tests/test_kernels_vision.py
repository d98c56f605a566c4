"""Detection ops and deformable convolution against explicit scalar formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


def _randn(shape, seed, dtype=torch.float64):
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    ).to(dtype)


def _boxes(count, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator, dtype=torch.float64) * 10
    size = torch.rand(count, 2, generator=generator, dtype=torch.float64) * 6
    return torch.cat([corner, corner + size], 1).to(dtype)


def _overlap(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h


def _area(a):
    return max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])


@settings(max_examples=30, deadline=None)
@given(
    boxes=st.integers(1, 6),
    gts=st.integers(1, 6),
    mode=st.sampled_from([0, 1]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_iou_is_transposed_against_box_iou(emulated, assert_close, boxes, gts, mode, dtype, seed):
    import torch_npu

    b, g = _boxes(boxes, seed, dtype), _boxes(gts, seed + 1, dtype)
    out = torch_npu.npu_iou(b, g, mode)
    assert out.shape == (gts, boxes) and out.dtype == dtype
    expected = torch.zeros(gts, boxes, dtype=torch.float64)
    for i, gt in enumerate(g.double().tolist()):
        for j, box in enumerate(b.double().tolist()):
            inter = _overlap(gt, box)
            denominator = _area(gt) if mode == 1 else _area(gt) + _area(box) - inter
            # A box rounded to zero area (float16) overlaps nothing: 0, as the kernel
            # (which clamps the denominator away from zero) gives.
            expected[i, j] = inter / denominator if denominator > 0 else 0.0
    assert_close(out, expected)


def _greedy_nms(boxes, scores, limit, iou_limit, score_limit):
    order = sorted(
        (i for i in range(len(scores)) if scores[i] > score_limit), key=lambda i: -scores[i]
    )
    kept = []
    for i in order:
        if len(kept) == limit:
            break
        ious = []
        for j in kept:
            inter = _overlap(boxes[i], boxes[j])
            union = _area(boxes[i]) + _area(boxes[j]) - inter
            ious.append(inter / union if union > 0 else 0.0)
        if all(value <= iou_limit for value in ious):
            kept.append(i)
    return kept


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(1, 10),
    limit=st.integers(1, 10),
    iou_limit=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
    score_limit=st.sampled_from([0.0, 0.2, 0.5]),
    pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_nms_v4_is_greedy_tensorflow_nms(emulated, count, limit, iou_limit, score_limit, pad, seed):
    import torch_npu

    boxes = _boxes(count, seed)
    scores = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).float() / count
    selected, valid = torch_npu.npu_nms_v4(
        boxes, scores, limit, torch.tensor(iou_limit), torch.tensor(score_limit), pad
    )
    # The thresholds are float32 0-d tensors, so the reference compares with their float32 values.
    thresholds = float(torch.tensor(iou_limit)), float(torch.tensor(score_limit))
    expected = _greedy_nms(boxes.double().tolist(), scores.tolist(), limit, *thresholds)
    assert selected.dtype == valid.dtype == torch.int32 and valid.dim() == 0
    assert valid.item() == len(expected)
    assert selected[: len(expected)].tolist() == expected
    assert len(selected) == (limit if pad else len(expected))
    assert not selected[len(expected) :].any()


def _bilinear_roi(feature, y, x):
    height, width = feature.shape
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_high = y_low = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_high = x_low = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    f = feature.tolist()
    return (
        hy * hx * f[y_low][x_low]
        + hy * lx * f[y_low][x_high]
        + ly * hx * f[y_high][x_low]
        + ly * lx * f[y_high][x_high]
    )


def _roi_align_reference(x, rois, scale, ph, pw, sampling, aligned):
    out = torch.zeros(rois.shape[0], x.shape[1], ph, pw, dtype=torch.float64)
    for r, (b, x1, y1, x2, y2) in enumerate(rois.double().tolist()):
        shift = 0.5 if aligned else 0.0
        sw, sh, ew, eh = (
            x1 * scale - shift,
            y1 * scale - shift,
            x2 * scale - shift,
            y2 * scale - shift,
        )
        rw, rh = ew - sw, eh - sh
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = sampling if sampling > 0 else math.ceil(rh / ph)
        gw = sampling if sampling > 0 else math.ceil(rw / pw)
        count = max(gh * gw, 1)
        for c in range(x.shape[1]):
            feature = x[int(b), c].double()
            for i in range(ph):
                for j in range(pw):
                    total = 0.0
                    for iy in range(gh):
                        yy = sh + i * bh + (iy + 0.5) * bh / gh
                        for ix in range(gw):
                            xx = sw + j * bw + (ix + 0.5) * bw / gw
                            total += _bilinear_roi(feature, yy, xx)
                    out[r, c, i, j] = total / count
    return out


@settings(max_examples=25, deadline=None)
@given(
    channels=st.integers(1, 2),
    height=st.integers(1, 6),
    width=st.integers(1, 6),
    rois=st.integers(1, 3),
    pooled=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    sampling=st.integers(0, 2),
    aligned=st.booleans(),
    scale=st.sampled_from([1.0, 0.5]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_roi_align_matches_the_explicit_formula(
    emulated,
    assert_close,
    channels,
    height,
    width,
    rois,
    pooled,
    sampling,
    aligned,
    scale,
    dtype,
    seed,
):
    import torch_npu

    x = _randn((2, channels, height, width), seed, dtype)
    generator = torch.Generator().manual_seed(seed + 1)
    corners = (
        torch.rand(rois, 4, generator=generator)
        * torch.tensor([width, height, width, height])
        / scale
    )
    boxes = torch.cat(
        [corners[:, :2].minimum(corners[:, 2:]) - 1, corners[:, :2].maximum(corners[:, 2:])], 1
    )
    batch = torch.randint(0, 2, (rois, 1), generator=generator).float()
    roi_tensor = torch.cat([batch, boxes], 1).to(dtype)
    out = torch_npu.npu_roi_align(
        x, roi_tensor, scale, pooled[0], pooled[1], sampling, 3 if aligned else 0
    )
    expected = _roi_align_reference(x, roi_tensor, scale, pooled[0], pooled[1], sampling, aligned)
    assert out.shape == (rois, channels, *pooled) and out.dtype == dtype
    assert_close(out, expected)


def test_roi_align_known_values(emulated):
    """The torch_npu test's own example: a 2x2 average over a ramp."""
    import torch_npu

    x = torch.arange(16.0).view(1, 1, 4, 4)
    out = torch_npu.npu_roi_align(x, torch.tensor([[0.0, 0.0, 0.0, 3.0, 3.0]]), 1.0, 2, 2, 2, 0)
    assert torch.allclose(out, torch.tensor([[[[3.75, 5.25], [9.75, 11.25]]]]))
    with pytest.raises(RuntimeError, match="roi_end_mode 1 is not emulated"):
        torch_npu.npu_roi_align(x, torch.tensor([[0.0, 0.0, 0.0, 3.0, 3.0]]), 1.0, 2, 2, 2, 1)


def _bilinear_deform(feature, h, w):
    height, width = feature.shape
    if h <= -1 or h >= height or w <= -1 or w >= width:
        return 0.0
    h_low, w_low = math.floor(h), math.floor(w)
    h_high, w_high = h_low + 1, w_low + 1
    lh, lw = h - h_low, w - w_low
    hh, hw = 1 - lh, 1 - lw
    f = feature.tolist()

    def at(y, x):
        return f[y][x] if 0 <= y < height and 0 <= x < width else 0.0

    return (
        hh * hw * at(h_low, w_low)
        + hh * lw * at(h_low, w_high)
        + lh * hw * at(h_high, w_low)
        + lh * lw * at(h_high, w_high)
    )


def _deform_conv_reference(x, weight, offset_tv, mask, bias, stride, pad, dilation, groups, dg):
    """DCNv2 with mmcv/torchvision's interleaved (dy, dx) offsets, in scalar loops."""
    n_, cin = x.shape[:2]
    cout, cin_g, kh, kw = weight.shape
    out_h, out_w = offset_tv.shape[2:]
    out = torch.zeros(n_, cout, out_h, out_w, dtype=torch.float64)
    per_dg = cin // dg
    cout_g = cout // groups
    for n in range(n_):
        for c in range(cin):
            g = c // per_dg
            feature = x[n, c].double()
            for i in range(kh):
                for j in range(kw):
                    k = i * kw + j
                    for ho in range(out_h):
                        for wo in range(out_w):
                            dy = offset_tv[n, 2 * (g * kh * kw + k), ho, wo].item()
                            dx = offset_tv[n, 2 * (g * kh * kw + k) + 1, ho, wo].item()
                            y = ho * stride[0] - pad[0] + i * dilation[0] + dy
                            xx = wo * stride[1] - pad[1] + j * dilation[1] + dx
                            value = (
                                _bilinear_deform(feature, y, xx)
                                * mask[n, g * kh * kw + k, ho, wo].item()
                            )
                            group = c // cin_g
                            for co in range(group * cout_g, (group + 1) * cout_g):
                                out[n, co, ho, wo] += (
                                    weight[co, c - group * cin_g, i, j].item() * value
                                )
    if bias is not None:
        out += bias.double().view(1, -1, 1, 1)
    return out


@settings(max_examples=15, deadline=None)
@given(
    size=st.tuples(st.integers(2, 5), st.integers(2, 5)),
    kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pad=st.tuples(st.integers(0, 1), st.integers(0, 1)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    groups=st.sampled_from([1, 2]),
    dg=st.sampled_from([1, 2]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_deformable_conv2d_reorders_mmcv_offsets(
    emulated, assert_close, size, kernel, stride, pad, dilation, groups, dg, with_bias, seed
):
    import torch_npu

    height, width = size
    kh, kw = kernel
    out_h = (height + 2 * pad[0] - ((kh - 1) * dilation[0] + 1)) // stride[0] + 1
    out_w = (width + 2 * pad[1] - ((kw - 1) * dilation[1] + 1)) // stride[1] + 1
    if out_h < 1 or out_w < 1:
        return
    cin, cout = 2, 2
    x = _randn((1, cin, height, width), seed, torch.float32)
    weight = _randn((cout, cin // groups, kh, kw), seed + 1, torch.float32)
    bias = _randn((cout,), seed + 2, torch.float32) if with_bias else None
    taps = dg * kh * kw
    offset_tv = _randn((1, 2 * taps, out_h, out_w), seed + 3, torch.float32)
    mask = torch.sigmoid(_randn((1, taps, out_h, out_w), seed + 4, torch.float32))
    # torch_npu's contrib module: x offsets first, then y offsets, then the mask.
    index = list(range(2 * taps))
    offset = torch.cat([offset_tv[:, index[1::2] + index[::2]], mask], 1)
    out, columns = torch_npu.npu_deformable_conv2d(
        x,
        weight,
        offset,
        bias,
        [kh, kw],
        [1, 1, *stride],
        [pad[0], pad[0], pad[1], pad[1]],
        dilation=[1, 1, *dilation],
        groups=groups,
        deformable_groups=dg,
    )
    expected = _deform_conv_reference(
        x, weight, offset_tv, mask, bias, stride, pad, dilation, groups, dg
    )
    assert out.dtype == torch.float32 and columns.shape == (1, cin, out_h * kh, out_w * kw)
    assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_deformable_conv2d_without_modulation_and_gradients(emulated):
    import torch_npu

    x = _randn((1, 2, 4, 4), 0).requires_grad_()
    weight = _randn((2, 2, 3, 3), 1).requires_grad_()
    offset = (0.3 * _randn((1, 18, 4, 4), 2)).requires_grad_()
    bias = _randn((2,), 3).requires_grad_()

    def conv(a, w, o, b):
        return torch_npu.npu_deformable_conv2d(
            a, w, o, b, [3, 3], [1, 1, 1, 1], [1, 1, 1, 1], modulated=False
        )[0]

    assert torch.autograd.gradcheck(conv, (x, weight, offset, bias), fast_mode=True)
    zero = torch.zeros(1, 18, 4, 4, dtype=torch.float64)
    plain = torch.nn.functional.conv2d(x, weight, bias, padding=1)
    assert torch.allclose(conv(x, weight, zero, bias), plain)
    with pytest.raises(RuntimeError, match="offset shape"):
        conv(x, weight, zero[:, :9], bias)
    with pytest.raises(RuntimeError, match="4 elements"):
        torch_npu.npu_deformable_conv2d(
            x, weight, zero, bias, [3, 3], [1, 1], [1, 1, 1, 1], modulated=False
        )
