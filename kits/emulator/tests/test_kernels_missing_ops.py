"""The ops that had no kernel: npu_silu_ (in place), npu_linear, npu_giou, npu_ciou, and the
explicit backward ops, which must equal autograd through the emulated forward op."""

from __future__ import annotations

import math

import pytest
import torch


def _t(*shape, seed=0, dtype=torch.float64):
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    ).to(dtype)


def _grads(op, args, wrt, grad_out, select=0):
    """``torch.autograd.grad`` of output ``select`` of ``op(*args)`` for ``args[i], i in wrt``."""
    leaves = [a.detach().requires_grad_(True) if i in wrt else a for i, a in enumerate(args)]
    out = op(*leaves)
    out = out[select] if isinstance(out, tuple) else out
    return torch.autograd.grad(out, [leaves[i] for i in wrt], grad_out)


# --- forward ops ------------------------------------------------------------------------


def test_silu_inplace_returns_its_input_with_silu_values(emulated):
    x = _t(3, 5, dtype=torch.float32)
    expected = x.double() * torch.sigmoid(x.double())
    before = x.data_ptr()
    out = torch.ops.npu.npu_silu_(x)
    assert out is x and x.data_ptr() == before
    torch.testing.assert_close(x.double(), expected, rtol=1e-6, atol=1e-6)


def test_silu_inplace_on_half_keeps_dtype(emulated):
    x = _t(8, dtype=torch.float16)
    expected = torch.nn.functional.silu(x.float()).half()
    torch.ops.npu.npu_silu_(x)
    assert x.dtype == torch.float16
    torch.testing.assert_close(x, expected)


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_is_input_at_weight_t_plus_bias(emulated, with_bias):
    x, w = _t(4, 3), _t(5, 3, seed=1)
    b = _t(5, seed=2) if with_bias else None
    expected = x @ w.T + (b if with_bias else 0)
    torch.testing.assert_close(torch.ops.npu.npu_linear(x, w, b), expected)
    torch.testing.assert_close(torch.ops.npu.npu_linear(x, w, bias=b), expected)


def test_linear_gradients_and_linear_backward(emulated):
    x, w, b, g = _t(4, 3), _t(5, 3, seed=1), _t(5, seed=2), _t(4, 5, seed=3)
    dx, dw, db = _grads(torch.ops.npu.npu_linear, (x, w, b), (0, 1, 2), g)
    torch.testing.assert_close(dx, g @ w)
    torch.testing.assert_close(dw, g.T @ x)
    torch.testing.assert_close(db, g.sum(0))
    bx, bw = torch.ops.npu.npu_linear_backward(g, x, w)
    torch.testing.assert_close(bx, dx)
    torch.testing.assert_close(bw, dw)


def _xywh_columns(n, seed, dtype=torch.float32):
    """torch_npu's test data: ``[4, n]`` boxes (cx, cy, w, h) with cx, cy near 0.5 and w, h near 1.5."""
    generator = torch.Generator().manual_seed(seed)
    rows = [i // 2 + (-1) ** (i // 2) * 0.5 * torch.rand(n, generator=generator) for i in range(4)]
    return torch.stack(rows).to(dtype)


def _giou_scalar(a, b):
    """GIoU of two (cx, cy, w, h) boxes, written out as torch_npu's CPU golden does."""
    a_x1, a_x2, a_y1, a_y2 = a[0] - a[2] / 2, a[0] + a[2] / 2, a[1] - a[3] / 2, a[1] + a[3] / 2
    b_x1, b_x2, b_y1, b_y2 = b[0] - b[2] / 2, b[0] + b[2] / 2, b[1] - b[3] / 2, b[1] + b[3] / 2
    inter = max(0.0, min(a_x2, b_x2) - max(a_x1, b_x1)) * max(
        0.0, min(a_y2, b_y2) - max(a_y1, b_y1)
    )
    outer = abs(max(a_x2, b_x2) - min(a_x1, b_x1)) * abs(max(a_y2, b_y2) - min(a_y1, b_y1))
    union = a[2] * a[3] + b[2] * b[3] - inter + 1e-16
    return inter / union - (outer - union) / outer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 10, 37])
def test_giou_matches_the_scalar_golden_as_n_by_1(emulated, dtype, n):
    boxes, gt = _xywh_columns(n, 0, dtype), _xywh_columns(n, 1, dtype)
    out = torch.ops.npu.npu_giou(boxes, gt, True, False, 0)
    assert out.shape == (n, 1) and out.dtype == dtype
    expected = torch.tensor(
        [
            [_giou_scalar(boxes[:, i].double().tolist(), gt[:, i].double().tolist())]
            for i in range(n)
        ],
        dtype=torch.float64,
    )
    tolerance = 1e-2 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("trans", "is_cross", "mode"), [(False, False, 0), (True, True, 0), (True, False, 1)]
)
def test_giou_accepts_only_what_op_plugin_accepts(emulated, trans, is_cross, mode):
    boxes = _xywh_columns(4, 0)
    with pytest.raises(RuntimeError, match="giou backward only support trans==True"):
        torch.ops.npu.npu_giou(boxes, boxes, trans, is_cross, mode)


def _ciou_golden(box1, box2, eps=1e-9):
    """torch_npu's CPU golden for npu_ciou (xywh columns); alpha is held constant."""
    b1_x1, b1_x2 = box1[0] - box1[2] / 2, box1[0] + box1[2] / 2
    b1_y1, b1_y2 = box1[1] - box1[3] / 2, box1[1] + box1[3] / 2
    b2_x1, b2_x2 = box2[0] - box2[2] / 2, box2[0] + box2[2] / 2
    b2_y1, b2_y2 = box2[1] - box2[3] / 2, box2[1] + box2[3] / 2
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * (
        torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)
    ).clamp(0)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    c2 = cw**2 + ch**2 + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi**2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / ((1 + eps) - iou + v)
    return iou - (rho2 / c2 + v * alpha)


@pytest.mark.parametrize("n", [6, 32])
def test_ciou_value_and_gradient_match_the_golden(emulated, n):
    generator = torch.Generator().manual_seed(n)
    boxes = 20 * torch.rand(4, n, generator=generator)
    gt = 20 * torch.rand(4, n, generator=generator)
    a, b = boxes.clone().requires_grad_(True), gt.clone().requires_grad_(True)
    golden = _ciou_golden(a, b)
    golden.backward(torch.ones_like(golden))
    x, y = boxes.clone().requires_grad_(True), gt.clone().requires_grad_(True)
    out = torch.ops.npu.npu_ciou(x, y, True, False, 0, True)
    assert out.shape == (1, n)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(out[0], golden.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, a.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y.grad, b.grad, rtol=1e-4, atol=1e-4)


def test_ciou_cross_is_every_gt_against_every_box(emulated):
    boxes, gt = _xywh_columns(3, 0), _xywh_columns(5, 1)
    out = torch.ops.npu.npu_ciou(boxes, gt, trans=True, is_cross=True)
    assert out.shape == (5, 3)
    for j in range(5):
        for i in range(3):
            single = torch.ops.npu.npu_ciou(boxes[:, i : i + 1], gt[:, j : j + 1], True, False)
            torch.testing.assert_close(out[j, i], single[0, 0])


def test_ciou_defaults_are_xyxy_and_cross(emulated):
    xyxy = torch.tensor([[0.0, 1.0], [0.0, 0.5], [2.0, 4.0], [2.0, 3.0]], dtype=torch.float64)
    gt = torch.tensor([[0.5], [0.0], [2.5], [3.0]], dtype=torch.float64)
    out = torch.ops.npu.npu_ciou(xyxy, gt)
    assert out.shape == (1, 2)

    def as_xywh(b):
        return torch.stack([(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]])

    expected = _ciou_golden(as_xywh(xyxy), as_xywh(gt).expand(4, 2))
    torch.testing.assert_close(out[0], expected)


# --- explicit backward ops agree with autograd through the forward op -------------------


def test_giou_backward_equals_autograd(emulated):
    boxes, gt = _xywh_columns(7, 0, torch.float64), _xywh_columns(7, 1, torch.float64)
    g = _t(7, 1, seed=5)
    expected = _grads(lambda a, b: torch.ops.npu.npu_giou(a, b, True), (boxes, gt), (0, 1), g)
    got = torch.ops.npu.npu_giou_backward(g, boxes, gt, True, False, 0)
    for left, right in zip(got, expected, strict=True):
        torch.testing.assert_close(left, right)


def test_ciou_backward_equals_autograd(emulated):
    boxes, gt = _xywh_columns(7, 0, torch.float64), _xywh_columns(7, 1, torch.float64)
    g = _t(1, 7, seed=5)
    op = lambda a, b: torch.ops.npu.npu_ciou(a, b, True, False, 0, True)  # noqa: E731
    expected = _grads(op, (boxes, gt), (0, 1), g)
    got = torch.ops.npu.npu_ciou_backward(g, boxes, gt, None, True, False, 0)
    for left, right in zip(got, expected, strict=True):
        torch.testing.assert_close(left, right)


def test_silu_backward_equals_autograd(emulated):
    x, g = _t(3, 4), _t(3, 4, seed=1)
    (expected,) = _grads(torch.ops.npu.npu_silu, (x,), (0,), g)
    s = torch.sigmoid(x)
    torch.testing.assert_close(expected, g * s * (1 + x * (1 - s)))
    got = torch.ops.npu.npu_silu_backward(g, x, torch.ops.npu.npu_silu(x))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rotary_mul_backward_equals_autograd(emulated, mode, dtype):
    x, r1, r2 = (
        _t(2, 3, 4, 8, dtype=dtype),
        _t(1, 3, 1, 8, seed=1, dtype=dtype),
        _t(1, 3, 1, 8, seed=2, dtype=dtype),
    )
    g = _t(2, 3, 4, 8, seed=3, dtype=dtype)
    op = lambda a, b, c: torch.ops.npu.npu_rotary_mul(a, b, c, mode)  # noqa: E731
    expected = _grads(op, (x, r1, r2), (0, 1, 2), g)
    got = torch.ops.npu.npu_rotary_mul_backward(g, x, r1, r2, mode)
    assert [t.shape for t in got] == [x.shape, r1.shape, r2.shape]
    for left, right in zip(got, expected, strict=True):
        torch.testing.assert_close(left, right)


@pytest.mark.parametrize("sample_num", [0, 2])
@pytest.mark.parametrize("roi_end_mode", [0, 3])
def test_roi_alignbk_is_the_adjoint_of_roi_align(emulated, roi_end_mode, sample_num):
    """npu_roi_align has no derivative in torch_npu (its contrib module calls npu_roi_alignbk),
    and it is linear in the features: <g, roi_align(f)> == <roi_alignbk(g), f> for every f."""
    shape = (2, 3, 6, 7)
    rois = torch.tensor([[0.0, 0.5, 0.5, 4.0, 5.0], [1.0, 1.0, 0.0, 6.0, 3.5]])
    g = _t(2, 3, 2, 3, seed=1)
    got = torch.ops.npu.npu_roi_alignbk(g, rois, list(shape), 3, 2, 0.5, sample_num, roi_end_mode)
    assert got.shape == shape and got.dtype == g.dtype and got.abs().sum() > 0
    for seed in range(3):
        features = _t(*shape, seed=10 + seed)
        pooled = torch.ops.npu.npu_roi_align(features, rois, 0.5, 2, 3, sample_num, roi_end_mode)
        torch.testing.assert_close((g * pooled).sum(), (got * features).sum())


def test_roi_align_of_a_zero_size_aligned_roi_with_adaptive_sampling_is_zeros(emulated):
    """An aligned roi of zero size gets no sample per bin (adaptive sampling): its bins are
    0, as in mmcv and torchvision, not a ZeroDivisionError of the emulator's own."""
    features = _t(1, 2, 6, 7)
    rois = torch.tensor([[0.0, 2.0, 3.0, 2.0, 3.0], [0.0, 0.5, 0.5, 4.0, 5.0]])
    pooled = torch.ops.npu.npu_roi_align(features, rois, 1.0, 2, 2, 0, 3)
    assert not pooled[0].any() and pooled[1].abs().sum() > 0


def test_roi_alignbk_takes_pooled_sizes_from_the_gradient(emulated):
    """torch_npu's contrib ROIAlign passes output_size (h, w) as (pooled_width, pooled_height)."""
    rois = torch.tensor([[0.0, 0.5, 0.5, 4.0, 5.0]])
    g = _t(1, 2, 2, 3, seed=1)
    named = torch.ops.npu.npu_roi_alignbk(g, rois, [1, 2, 6, 7], 3, 2, 1.0, 2, 0)
    swapped = torch.ops.npu.npu_roi_alignbk(g, rois, [1, 2, 6, 7], 2, 3, 1.0, 2, 0)
    torch.testing.assert_close(named, swapped)


def test_roi_alignbk_of_an_empty_gradient_is_zeros(emulated):
    got = torch.ops.npu.npu_roi_alignbk(
        torch.zeros(0, 3, 2, 2), torch.zeros(0, 5), [1, 3, 4, 4], 2, 2, 1.0, 2, 0
    )
    assert got.shape == (1, 3, 4, 4) and not got.any()


@pytest.mark.parametrize("modulated", [True, False])
def test_deformable_conv2dbk_equals_autograd(emulated, modulated):
    x, w = _t(1, 4, 5, 5, dtype=torch.float32), _t(2, 4, 3, 3, seed=1, dtype=torch.float32)
    offset = 0.3 * _t(1, (3 if modulated else 2) * 9, 5, 5, seed=2, dtype=torch.float32)
    bias = _t(2, seed=3, dtype=torch.float32)
    args = ([3, 3], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], 1, 1, modulated)

    def op(a, b, c, d):
        return torch.ops.npu.npu_deformable_conv2d(a, b, c, d, *args)

    out, columns = op(x, w, offset, bias)
    g = _t(*out.shape, seed=4, dtype=torch.float32)
    expected = _grads(op, (x, w, offset, bias), (0, 1, 2, 3), g)
    got = torch.ops.npu.npu_deformable_conv2dbk(x, g, columns, w, offset, *args)
    assert len(got) == 4
    for left, right in zip(got, expected, strict=True):
        torch.testing.assert_close(left, right, rtol=1e-5, atol=1e-5)


def _fa_inputs(layout):
    shapes = {"BNSD": (2, 2, 5, 4), "BSND": (2, 5, 2, 4), "BSH": (2, 5, 8), "SBH": (5, 2, 8)}
    q = _t(*shapes[layout])
    return q, _t(*shapes[layout], seed=1), _t(*shapes[layout], seed=2)


def _has_sink(version):
    return not version.startswith("2.1.")


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
def test_fusion_attention_grad_equals_autograd(emulated, layout):
    q, k, v = _fa_inputs(layout)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    options = {"atten_mask": mask, "scale": 0.5}

    def op(a, b, c):
        return torch.ops.npu.npu_fusion_attention(a, b, c, 2, layout, **options)

    dy = _t(*q.shape, seed=3)
    expected = _grads(op, (q, k, v), (0, 1, 2), dy)
    forward = op(q, k, v)
    got = torch.ops.npu.npu_fusion_attention_grad(
        q,
        k,
        v,
        dy,
        2,
        layout,
        atten_mask=mask,
        scale_value=0.5,
        softmax_max=forward[1],
        softmax_sum=forward[2],
        attention_in=forward[0],
    )
    assert len(got) == (5 if _has_sink(emulated.version) else 4)
    for left, right in zip(got[:3], expected, strict=True):
        torch.testing.assert_close(left, right)
    assert got[3].numel() == 0


def test_fusion_attention_grad_with_pse_and_dropout_replays_the_forward(emulated):
    q, k, v = _fa_inputs("BNSD")
    pse = _t(1, 2, 5, 5, seed=4)
    dy = _t(*q.shape, seed=5)

    def op(a, b, c, p):
        return torch.ops.npu.npu_fusion_attention(a, b, c, 2, "BNSD", pse=p, keep_prob=0.7)

    torch.manual_seed(3)
    forward = op(q, k, v, pse)
    assert forward[4] != 0
    torch.manual_seed(3)
    expected = _grads(op, (q, k, v, pse), (0, 1, 2, 3), dy)
    got = torch.ops.npu.npu_fusion_attention_grad(
        q,
        k,
        v,
        dy,
        2,
        "BNSD",
        pse=pse,
        keep_prob=0.7,
        seed=forward[4],
        offset=forward[5],
        numels=forward[6],
    )
    for left, right in zip(got[:4], expected, strict=True):
        torch.testing.assert_close(left, right)
