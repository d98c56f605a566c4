"""Offsets of another spatial size than the output (issue 22, item 13: mmdet's DyHead).

mmcv's DCNv2 kernels read each sample's offset and mask as ``[C, Ho, Wo]`` from the
start of its memory, whatever their shape (DyHead's ``spatial_conv_high`` passes the
offsets of the larger level); every kernel source here reads the same values. Fewer
values than the output needs (mmcv would read past the tensor) and a DCNv1 offset of
the wrong size (mmcv checks it) are errors. The end-to-end check on mmdet's DyHead is
test_mmdet_models_emulated.py.
"""

from __future__ import annotations

import pytest
import torch
from ascend_patch_mmcv import deform_conv_kernels


def _inputs(offset_size: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=g)  # 3x3, padding 1: an 8x8 output
    weight = torch.randn(5, 4, 3, 3, generator=g)
    bias = torch.randn(5, generator=g)
    offset = torch.randn(2, 18, offset_size, offset_size, generator=g) * 1.5
    mask = torch.rand(2, 9, offset_size, offset_size, generator=g)
    return x, offset, mask, weight, bias


def _as_mmcv_reads(tensor: torch.Tensor, channels: int) -> torch.Tensor:
    return tensor.reshape(2, -1)[:, : channels * 64].reshape(2, channels, 8, 8)


def _run(kernel, x, offset, mask, weight, bias):
    leaves = [t.clone().requires_grad_() for t in (x, offset, mask, weight, bias)]
    out = kernel(*leaves, 1, 1, 1, 1, 1)
    out.backward(torch.ones_like(out))
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("source", ["portable", "torch_npu"])
def test_a_larger_offset_is_read_as_mmcv_reads_it(npu_emulator, source):
    x, offset, mask, weight, bias = _inputs(16)
    read = (_as_mmcv_reads(offset, 18), _as_mmcv_reads(mask, 9))
    expected, expected_grads = _run(deform_conv_kernels.portable, x, *read, weight, bias)
    npu = source == "torch_npu"
    kernel = deform_conv_kernels.torch_npu_kernel if npu else deform_conv_kernels.portable
    tensors = (x, offset, mask, weight, bias)
    out, grads = _run(kernel, *(t.to("npu") if npu else t for t in tensors))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)
    # The values past what is read get zero gradients, as mmcv's zero-filled grad_offset.
    for got, want, channels in (
        (grads[1], expected_grads[1], 18),
        (grads[2], expected_grads[2], 9),
    ):
        got = got.cpu().reshape(2, -1)
        torch.testing.assert_close(
            got[:, : channels * 64], want.reshape(2, -1), atol=1e-4, rtol=1e-4
        )
        assert not got[:, channels * 64 :].any()
    for got, want in zip(
        [grads[0], *grads[3:]], [expected_grads[0], *expected_grads[3:]], strict=True
    ):
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_a_smaller_offset_is_an_error_naming_the_size_needed():
    x, offset, mask, weight, bias = _inputs(4)
    with pytest.raises(RuntimeError, match=r"output 8x8 needs 1152 .*\[N, 18, 8, 8\]"):
        deform_conv_kernels.portable(x, offset, mask, weight, bias, 1, 1, 1, 1, 1)


def test_a_dcnv1_offset_of_another_size_is_an_error_as_in_mmcv():
    x, offset, _, weight, _ = _inputs(16)
    with pytest.raises(RuntimeError, match=r"invalid offset shape \(2, 18, 16, 16\)"):
        deform_conv_kernels.portable(x, offset, None, weight, None, 1, 1, 1, 1, 1)
