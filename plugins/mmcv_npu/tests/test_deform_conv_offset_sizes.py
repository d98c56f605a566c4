"""Offsets of another spatial size than the output (issue 22, item 13: mmdet's DyHead).

mmcv's DCNv2 kernels read each sample's offset and mask as ``[C, Ho, Wo]`` from the
start of its memory, whatever their shape (DyHead's ``spatial_conv_high`` passes the
offsets of the larger level); every kernel source here reads the same values. Fewer
values than the output needs (mmcv would read past the tensor) and a DCNv1 offset of
the wrong size (mmcv checks it) are errors. Outside DrivingSDK's domain the mx_driving
replacement serves such a call with torch_npu's kernel (the last test; needs mmcv's
ops, nox session ``openmmlab_cpu_ops``). The end-to-end check on mmdet's DyHead is
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


def test_mx_driving_replacement_runs_torch_npus_kernel_outside_its_domain(
    npu_emulator, isolated_patcher, monkeypatch
):
    """DyHead's call with 32 channels (DrivingSDK takes multiples of 64), source mx_driving.

    It used to go back to mmcv, whose NPU branch hands torch_npu the 16x16 offsets of an
    8x8 output: ``offset shape (2, 27, 16, 16) must be (2, 27, 8, 8)`` on an NPU. The
    replacement now serves it with torch_npu's kernel and the values mmcv reads.
    """
    from ascend_patch_mmcv import _kernel_source
    from ascend_patch_mmcv.groups import ModulatedDeformConv

    ops = pytest.importorskip("mmcv.ops.modulated_deform_conv")
    mx_driving = pytest.importorskip("mx_driving")  # the emulator's
    import torch_npu

    calls: dict[str, list[tuple[int, ...]]] = {"torch_npu": [], "mx_driving": []}
    for module, name, key in (
        (torch_npu, "npu_deformable_conv2d", "torch_npu"),
        (mx_driving, "modulated_deform_conv2d", "mx_driving"),
    ):
        kernel = getattr(module, name)

        def spy(*args, _kernel=kernel, _key=key, **kwargs):
            calls[_key].append(tuple(args[2].shape))  # torch_npu's offset / DrivingSDK's mask
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    monkeypatch.setenv(_kernel_source.VARIABLE, _kernel_source.MX_DRIVING)
    _kernel_source.forget_choices()
    try:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 32, 8, 8, generator=g)
        weight = torch.randn(32, 32, 3, 3, generator=g) * 0.1
        bias = torch.randn(32, generator=g)
        offset = torch.randn(2, 18, 16, 16, generator=g) * 1.5
        mask = torch.rand(2, 9, 16, 16, generator=g)
        read = (_as_mmcv_reads(offset, 18), _as_mmcv_reads(mask, 9))
        expected, expected_grads = _run(deform_conv_kernels.portable, x, *read, weight, bias)
        isolated_patcher.add(ModulatedDeformConv).apply()
        tensors = [t.to("npu").requires_grad_() for t in (x, offset, mask, weight, bias)]
        out = ops.modulated_deform_conv2d(*tensors, 1, 1, 1, 1, 1)
        out.backward(torch.ones_like(out))
    finally:
        _kernel_source.forget_choices()

    counters = isolated_patcher.report.get(
        "mmcv.ops.modulated_deform_conv:modulated_deform_conv2d"
    ).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)
    assert calls == {"torch_npu": [(2, 27, 8, 8)], "mx_driving": []}
    torch.testing.assert_close(out.detach().cpu(), expected, atol=1e-4, rtol=1e-4)
    for index in (0, 3, 4):  # input, weight, bias; the offsets' are checked above
        torch.testing.assert_close(
            tensors[index].grad.cpu(), expected_grads[index], atol=1e-4, rtol=1e-4
        )
