"""``mmcv._ext`` RoI pooling: the portable functions against mmcv 2.1.0's compiled ones.

``roi_align_forward/backward`` are compared with mmcv's compiled CPU kernels (the
real ``mmcv._ext`` of the ``openmmlab_cpu_ops`` session), called with the same
preallocated outputs, every pool mode, ``aligned``, fixed and adaptive sampling,
rois partly or wholly outside the map, degenerate and empty roi sets, half
precision and non-contiguous inputs. mmcv has no CPU ``roi_pool`` kernel: that one is
compared with a line-by-line transcription of mmcv's CUDA kernel (below), which is
the definition the portable function follows.

Tolerances: float32 1e-5 (the same sums in another order); float16 1e-2 (mmcv's
kernel computes in half, the portable one in float32).
"""

from __future__ import annotations

import math

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import roi  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext.registry import IMPLEMENTATIONS  # noqa: E402


F32 = {"atol": 1e-5, "rtol": 1e-5}
F16 = {"atol": 1e-2, "rtol": 1e-2}


def _rois(count, batch=2, seed=0, extent=(80.0, 64.0)):
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * torch.tensor(extent) * 1.2 - 8
    size = torch.rand(count, 2, generator=generator) * 40
    index = torch.randint(0, batch, (count, 1), generator=generator).float()
    return torch.cat((index, corner, corner + size), 1)


def _edge_rois():
    return torch.tensor(
        [
            [0, -10.0, -10.0, 5.0, 5.0],  # partly outside (top left)
            [1, 70.0, 50.0, 100.0, 90.0],  # partly outside (bottom right)
            [0, 3.0, 3.0, 3.0, 3.0],  # a point
            [1, 10.0, 4.0, 10.0, 30.0],  # a vertical line
            [0, 200.0, 200.0, 260.0, 240.0],  # wholly outside
            [1, 0.0, 0.0, 79.0, 63.0],  # the whole map
        ]
    )


def _align(module, x, rois, pooled, scale, ratio, mode, aligned, grad=None):
    shape = (rois.shape[0], x.shape[1], *pooled)
    output = x.new_zeros(shape)
    argmax_y = x.new_zeros(shape) if mode == 0 else x.new_zeros(0)
    argmax_x = x.new_zeros(shape) if mode == 0 else x.new_zeros(0)
    module.roi_align_forward(
        x,
        rois,
        output,
        argmax_y,
        argmax_x,
        aligned_height=pooled[0],
        aligned_width=pooled[1],
        spatial_scale=scale,
        sampling_ratio=ratio,
        pool_mode=mode,
        aligned=aligned,
    )
    if grad is None:
        grad = torch.randn(shape, generator=torch.Generator().manual_seed(7)).to(x.dtype)
    grad_input = x.new_zeros(x.shape)
    module.roi_align_backward(
        grad,
        rois,
        argmax_y,
        argmax_x,
        grad_input,
        aligned_height=pooled[0],
        aligned_width=pooled[1],
        spatial_scale=scale,
        sampling_ratio=ratio,
        pool_mode=mode,
        aligned=aligned,
    )
    return output, argmax_y, argmax_x, grad_input


def _same(expected, actual, tol):
    for name, e, a in zip(
        ("output", "argmax_y", "argmax_x", "grad_input"), expected, actual, strict=True
    ):
        torch.testing.assert_close(a, e, **tol, msg=lambda m, n=name: f"{n}: {m}")


def test_registered_under_mmcvs_names():
    for name in (
        "roi_align_forward",
        "roi_align_backward",
        "roi_pool_forward",
        "roi_pool_backward",
    ):
        assert IMPLEMENTATIONS[name] is getattr(roi, name)


@pytest.mark.parametrize("mode", [0, 1], ids=["max", "avg"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "legacy"])
@pytest.mark.parametrize("ratio", [0, 2], ids=["adaptive", "ratio2"])
@pytest.mark.parametrize("rois", ["random", "edges", "one", "empty"])
def test_roi_align_matches_mmcvs_cpu_kernel(mode, aligned, ratio, rois):
    x = torch.randn(2, 5, 16, 20, generator=torch.Generator().manual_seed(1))
    boxes = {
        "random": _rois(40),
        "edges": _edge_rois(),
        "one": _rois(1),
        "empty": torch.zeros(0, 5),
    }[rois]
    args = (x, boxes, (7, 6), 0.25, ratio, mode, aligned)
    _same(_align(compiled, *args), _align(roi, *args), F32)


@pytest.mark.parametrize("ratio", [0, 2], ids=["adaptive", "ratio2"])
def test_roi_align_max_ties_record_the_first_sample(ratio):
    # A flat map: every sample of a bin ties; mmcv keeps the first (strictly greater).
    x = torch.full((1, 2, 8, 8), 3.0)
    x[0, 1] = -20000.0  # below the kernel's starting maximum: no sample wins
    boxes = torch.tensor([[0, 0.0, 0.0, 28.0, 28.0], [0, 4.0, 8.0, 20.0, 12.0]])
    args = (x, boxes, (2, 3), 0.25, ratio, 0, True)
    _same(_align(compiled, *args), _align(roi, *args), F32)


def test_roi_align_scale_one_and_square_bins():
    x = torch.randn(1, 3, 9, 9, generator=torch.Generator().manual_seed(2))
    boxes = _rois(12, batch=1, extent=(9.0, 9.0)) / torch.tensor([1, 4, 4, 4, 4.0])
    for mode in (0, 1):
        args = (x, boxes, (2, 2), 1.0, 0, mode, True)
        _same(_align(compiled, *args), _align(roi, *args), F32)


@pytest.mark.parametrize("mode", [0, 1], ids=["max", "avg"])
def test_roi_align_half(mode):
    """Half in, half out; compared with mmcv's kernel on the same values in float32.

    mmcv's half kernel also computes the sample positions in half, which moves them by
    up to a few hundredths of a pixel: the portable one keeps them in float32, so the
    float32 kernel is the closer reference for both.
    """
    x = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(3)).half()
    boxes = _rois(10, extent=(48.0, 48.0)).half()
    args = ((3, 3), 0.25, 2, mode, True)
    grad = torch.randn(10, 4, 3, 3, generator=torch.Generator().manual_seed(11)).half()
    expected = _align(compiled, x.float(), boxes.float(), *args, grad.float())
    actual = _align(roi, x, boxes, *args, grad)
    assert all(a.dtype == torch.half for a in actual if a.numel())
    _same(expected, [a.float() for a in actual], F16)
    # mmcv's own half kernel runs on these inputs too (it dispatches half on the CPU).
    assert _align(compiled, x, boxes, *args, grad)[0].dtype == torch.half


@pytest.mark.parametrize("mode", [0, 1], ids=["max", "avg"])
def test_roi_align_non_contiguous_inputs(mode):
    base = torch.randn(2, 16, 20, 5, generator=torch.Generator().manual_seed(4))
    x = base.permute(0, 3, 1, 2)  # NCHW view of channels-last memory
    boxes = _rois(20)
    rois_view = torch.cat((boxes, boxes), 1)[:, ::2]  # strided rows
    rois_view[:] = boxes
    assert not x.is_contiguous() and not rois_view.is_contiguous()
    grad = torch.randn(20, 7, 7, 5, generator=torch.Generator().manual_seed(5)).permute(0, 3, 1, 2)
    expected = _align(
        compiled, x.contiguous(), boxes, (7, 7), 0.25, 0, mode, True, grad.contiguous()
    )
    actual = _align(roi, x, rois_view, (7, 7), 0.25, 0, mode, True, grad)
    _same(expected, actual, F32)


def test_roi_align_accumulates_into_grad_input():
    x = torch.randn(1, 2, 8, 8)
    boxes = _rois(5, batch=1, extent=(32.0, 32.0))
    grad = torch.randn(5, 2, 2, 2)
    start = torch.randn(1, 2, 8, 8)
    results = []
    for module in (compiled, roi):
        grad_input = start.clone()
        module.roi_align_backward(
            grad, boxes, x.new_zeros(0), x.new_zeros(0), grad_input, 2, 2, 0.25, 2, 1, True
        )
        results.append(grad_input)
    torch.testing.assert_close(results[1], results[0], **F32)


def test_roi_align_negative_aligned_roi_raises_as_mmcv():
    x = torch.randn(1, 2, 8, 8)
    boxes = torch.tensor([[0, 5.0, 5.0, 2.0, 2.0]])
    for module in (compiled, roi):
        with pytest.raises(RuntimeError, match="non-negative size"):
            _align(module, x, boxes, (2, 2), 1.0, 0, 1, True)


@pytest.mark.parametrize("source", ["torch_npu", "portable"])
def test_roi_align_on_npu_tensors(npu_emulator, monkeypatch, source):
    """On (emulated) NPU tensors: torch_npu's npu_roi_align for avg pooling, else portable."""
    import torch_npu

    monkeypatch.setenv(_kernel_source.VARIABLE, f"roi_align={source}")
    _kernel_source.forget_choices()
    calls = []
    for name in ("npu_roi_align", "npu_roi_alignbk"):
        kernel = getattr(torch_npu, name)
        monkeypatch.setattr(
            torch_npu, name, lambda *a, _k=kernel, _n=name, **k: calls.append(_n) or _k(*a, **k)
        )
    try:
        x = torch.randn(2, 3, 12, 10, generator=torch.Generator().manual_seed(6))
        boxes = torch.cat((_rois(6, extent=(40.0, 48.0)), _edge_rois()[:4]))
        for mode, aligned, ratio in ((1, True, 0), (1, False, 2), (0, True, 2)):
            args = (boxes, (3, 4), 0.25, ratio, mode, aligned)
            grad = torch.randn(boxes.shape[0], 3, 3, 4, generator=torch.Generator().manual_seed(8))
            expected = _align(compiled, x, *args, grad)
            actual = _align(roi, x.to("npu"), boxes.to("npu"), *args[1:], grad.to("npu"))
            _same(expected, [a.cpu() for a in actual], F32)
        # Only the average pooling without a zero-size aligned roi takes torch_npu's kernel.
        expected_calls = ["npu_roi_align", "npu_roi_alignbk"] if source == "torch_npu" else []
        assert calls == expected_calls
    finally:
        _kernel_source.forget_choices()


# --------------------------------------------------------------------------------- RoIPool


def _roi_pool_cuda_kernel(x, rois, pooled, scale):
    """mmcv's ``roi_pool_forward_cuda_kernel``, one output element at a time."""
    ph_count, pw_count = pooled
    _, channels, height, width = x.shape
    out = torch.zeros(rois.shape[0], channels, ph_count, pw_count, dtype=x.dtype)
    argmax = torch.zeros(out.shape, dtype=torch.int)
    for n, box in enumerate(rois.tolist()):
        b = int(box[0])
        x1, y1 = box[1] * scale, box[2] * scale
        x2, y2 = (box[3] + 1) * scale, (box[4] + 1) * scale
        roi_w, roi_h = x2 - x1, y2 - y1
        if roi_w <= 0 or roi_h <= 0:
            continue
        bin_w, bin_h = roi_w / pw_count, roi_h / ph_count
        for c in range(channels):
            for ph in range(ph_count):
                for pw in range(pw_count):
                    bx1 = min(max(math.floor(pw * bin_w + x1), 0), width)
                    by1 = min(max(math.floor(ph * bin_h + y1), 0), height)
                    bx2 = min(max(math.ceil((pw + 1) * bin_w + x1), 0), width)
                    by2 = min(max(math.ceil((ph + 1) * bin_h + y1), 0), height)
                    empty = by2 <= by1 or bx2 <= bx1
                    best, where = (0.0 if empty else -math.inf), -1
                    for h in range(by1, by2):
                        for w in range(bx1, bx2):
                            if x[b, c, h, w] > best:
                                best, where = float(x[b, c, h, w]), h * width + w
                    out[n, c, ph, pw], argmax[n, c, ph, pw] = best, where
    return out, argmax


def _roi_pool_backward_reference(grad, rois, argmax, shape):
    grad_input = torch.zeros(shape)
    for n, c, ph, pw in torch.cartesian_prod(*(torch.arange(s) for s in grad.shape)).tolist():
        where = int(argmax[n, c, ph, pw])
        if where != -1:
            grad_input[int(rois[n, 0]), c].view(-1)[where] += grad[n, c, ph, pw]
    return grad_input


@pytest.mark.parametrize("rois", ["random", "edges", "one", "empty"])
def test_roi_pool_matches_mmcvs_cuda_kernel_transcribed(rois):
    x = torch.randn(2, 3, 16, 20, generator=torch.Generator().manual_seed(9))
    boxes = {
        "random": _rois(15),
        "edges": torch.cat((_edge_rois(), torch.tensor([[0, 30.0, 30.0, 20.0, 20.0]]))),
        "one": _rois(1),
        "empty": torch.zeros(0, 5),
    }[rois]
    pooled, scale = (3, 4), 0.25
    expected, expected_argmax = _roi_pool_cuda_kernel(x, boxes, pooled, scale)
    output = x.new_zeros(expected.shape)
    argmax = torch.zeros(expected.shape, dtype=torch.int)
    roi.roi_pool_forward(
        x, boxes, output, argmax, pooled_height=3, pooled_width=4, spatial_scale=scale
    )
    torch.testing.assert_close(output, expected, **F32)
    torch.testing.assert_close(argmax, expected_argmax)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(10))
    grad_input = torch.zeros_like(x)
    roi.roi_pool_backward(
        grad, boxes, argmax, grad_input, pooled_height=3, pooled_width=4, spatial_scale=scale
    )
    torch.testing.assert_close(
        grad_input, _roi_pool_backward_reference(grad, boxes, argmax, x.shape), **F32
    )


def test_roi_pool_ties_take_the_first_pixel():
    x = torch.ones(1, 1, 4, 4)
    output, argmax = torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1, dtype=torch.int)
    roi.roi_pool_forward(x, torch.tensor([[0, 1.0, 1.0, 2.0, 2.0]]), output, argmax, 1, 1, 1.0)
    assert (float(output), int(argmax)) == (1.0, 5)


def test_through_mmcvs_roi_align_function(monkeypatch):
    """mmcv's own RoIAlign (its autograd Function, its calls) on these functions."""
    import importlib
    import types

    roi_align_module = importlib.import_module("mmcv.ops.roi_align")

    x = torch.randn(2, 4, 12, 10, generator=torch.Generator().manual_seed(12))
    boxes = _rois(9, extent=(40.0, 48.0))
    results = []
    for ext_module in (compiled, types.SimpleNamespace(**{n: getattr(roi, n) for n in dir(roi)})):
        monkeypatch.setattr(roi_align_module, "ext_module", ext_module)
        for pool_mode in ("avg", "max"):
            leaf = x.clone().requires_grad_(True)
            layer = roi_align_module.RoIAlign((3, 2), 0.25, 2, pool_mode, aligned=True)
            out = layer(leaf, boxes)
            out.backward(torch.ones_like(out))
            results.append((out.detach(), leaf.grad))
    for (out_a, grad_a), (out_b, grad_b) in zip(results[:2], results[2:], strict=True):
        torch.testing.assert_close(out_b, out_a, **F32)
        torch.testing.assert_close(grad_b, grad_a, **F32)
