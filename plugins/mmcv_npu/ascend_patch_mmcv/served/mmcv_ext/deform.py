"""``mmcv._ext`` deformable convolution: DCNv1 (``deform_conv_*``) and DCNv2 (``modulated_*``).

Arguments and in-place conventions are mmcv 2.1.0's (``mmcv/ops/deform_conv.py`` and
``modulated_deform_conv.py`` allocate the outputs and call these). What mmcv's CPU
kernels write, and so what these write:

* ``deform_conv_forward`` / ``modulated_deform_conv_forward``: ``output`` (plus
  ``bias`` when ``with_bias``);
* ``deform_conv_backward_input``: adds into ``gradInput`` and overwrites
  ``gradOffset``;
* ``deform_conv_backward_parameters``: adds ``scale`` times the weight gradient into
  ``gradWeight``;
* ``modulated_deform_conv_backward``: adds into ``grad_input``, ``grad_weight`` and
  (``with_bias``) ``grad_bias``; overwrites ``grad_offset`` and ``grad_mask``.

``columns`` and ``ones`` are mmcv's scratch buffers (its kernels resize them
locally; the caller never reads them back) and are ignored; so is ``im2col_step``,
which only tiles mmcv's kernel over the batch -- the result does not depend on it.
Inputs are 4-D (mmcv's Python raises for others; its CPU kernel's 3-D branch fails
its own shape check).

The convolution is :mod:`ascend_patch_mmcv.deform_conv_kernels`: on NPU tensors
DrivingSDK's kernel within its domain, else ``torch_npu.npu_deformable_conv2d``,
else the portable PyTorch kernel (op ``deform_conv2d`` / ``modulated_deform_conv2d``
of :mod:`ascend_patch_mmcv._kernel_source`); on other tensors the portable kernel. The
backward functions recompute the forward with gradients enabled and take
``torch.autograd.grad`` of it (each backward function recomputes once). The portable
kernel computes half and bfloat16 in float32 and rounds once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import _kernel_source
from ... import deform_conv_kernels
from .registry import implements


__all__ = [
    "deform_conv_backward_input",
    "deform_conv_backward_parameters",
    "deform_conv_forward",
    "modulated_deform_conv_backward",
    "modulated_deform_conv_forward",
]

DCN_OP = "deform_conv2d"
MDCN_OP = "modulated_deform_conv2d"


def _on_npu(*tensors: Any) -> bool:
    return all(getattr(t, "is_npu", False) is True for t in tensors)


def _kernel(input: Any, offset: Any, weight: Any, modulated: bool) -> Callable[..., Any]:
    if not _on_npu(input, offset):
        return deform_conv_kernels.portable
    source = _kernel_source.choose(MDCN_OP if modulated else DCN_OP)
    if source == _kernel_source.MX_DRIVING and deform_conv_kernels.mx_driving_supports(
        input, weight, modulated
    ):
        return deform_conv_kernels.mx_driving_kernel
    if source == _kernel_source.PORTABLE:
        return deform_conv_kernels.portable
    return deform_conv_kernels.torch_npu_kernel


class _Geometry:
    """Stride, padding and dilation as ``(h, w)`` pairs, groups and deformable groups."""

    def __init__(
        self,
        stride: tuple[int, int],
        pad: tuple[int, int],
        dilation: tuple[int, int],
        group: int,
        deformable_group: int,
    ) -> None:
        self.arguments = (stride, pad, dilation, int(group), int(deformable_group))


def _dcn(
    input: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any,
    geometry: _Geometry,
    modulated: bool,
) -> Any:
    import torch

    kernel = _kernel(input, offset, weight, modulated)
    if kernel is deform_conv_kernels.portable and input.dtype in (torch.half, torch.bfloat16):
        # Half on the CPU: sample and sum in float32, round once (mmcv's kernel is half).
        wide = [t.float() if t is not None else None for t in (input, offset, mask, weight, bias)]
        x, off, msk, w, b = wide
        return kernel(x, off, msk, w, b, *geometry.arguments).to(input.dtype)
    return kernel(input, offset, mask, weight, bias, *geometry.arguments)


def _grads(
    wanted: tuple[bool, ...],
    grad_output: Any,
    input: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any,
    geometry: _Geometry,
    modulated: bool,
) -> list[Any]:
    """Gradients of the convolution for the ``wanted`` of input, offset, mask, weight, bias."""
    import torch

    tensors = [input, offset, mask, weight, bias]
    leaves = [
        t.detach().requires_grad_(want) if t is not None else None
        for t, want in zip(tensors, wanted, strict=True)
    ]
    with torch.enable_grad():
        x, offset_leaf, mask_leaf, weight_leaf, bias_leaf = leaves
        out = _dcn(x, offset_leaf, mask_leaf, weight_leaf, bias_leaf, geometry, modulated)
    asked = [leaf for leaf, want in zip(leaves, wanted, strict=True) if want]
    found = torch.autograd.grad(out, asked, grad_output.to(out.dtype), allow_unused=True)
    found_iter = iter(found)
    results = []
    for leaf, want in zip(leaves, wanted, strict=True):
        grad = next(found_iter) if want else None
        if want and grad is None:
            grad = torch.zeros_like(leaf)
        results.append(grad)
    return results


def _dcn_geometry(
    kW: int,
    kH: int,
    dW: int,
    dH: int,
    padW: int,
    padH: int,
    dilationW: int,
    dilationH: int,
    group: int,
    deformable_group: int,
) -> _Geometry:
    return _Geometry(
        (int(dH), int(dW)),
        (int(padH), int(padW)),
        (int(dilationH), int(dilationW)),
        group,
        deformable_group,
    )


#: What the functions call on NPU tensors (docs/mmcv-plugin.md's table of _ext names).
_DCN_NPU = "mx_driving deform_conv2d (3x3, channels a multiple of 64); else torch_npu npu_deformable_conv2d"
_MDCN_NPU = (
    "mx_driving modulated_deform_conv2d (3x3, channels a multiple of 64); "
    "else torch_npu npu_deformable_conv2d"
)


@implements(
    "deform_conv_forward",
    npu=_DCN_NPU,
)
def deform_conv_forward(
    input: Any,
    weight: Any,
    offset: Any,
    output: Any,
    columns: Any,
    ones: Any,
    kW: int,
    kH: int,
    dW: int,
    dH: int,
    padW: int,
    padH: int,
    dilationW: int,
    dilationH: int,
    group: int,
    deformable_group: int,
    im2col_step: int,
) -> None:
    """DCNv1 into ``output [N, Cout, Ho, Wo]``."""
    geometry = _dcn_geometry(
        kW, kH, dW, dH, padW, padH, dilationW, dilationH, group, deformable_group
    )
    output.copy_(_dcn(input, offset, None, weight, None, geometry, False))


@implements(
    "deform_conv_backward_input",
    npu=_DCN_NPU,
)
def deform_conv_backward_input(
    input: Any,
    offset: Any,
    gradOutput: Any,
    gradInput: Any,
    gradOffset: Any,
    weight: Any,
    columns: Any,
    kW: int,
    kH: int,
    dW: int,
    dH: int,
    padW: int,
    padH: int,
    dilationW: int,
    dilationH: int,
    group: int,
    deformable_group: int,
    im2col_step: int,
) -> None:
    """Adds the input gradient into ``gradInput``; writes the offset gradient."""
    geometry = _dcn_geometry(
        kW, kH, dW, dH, padW, padH, dilationW, dilationH, group, deformable_group
    )
    grad_in, grad_off, *_ = _grads(
        (True, True, False, False, False),
        gradOutput,
        input,
        offset,
        None,
        weight,
        None,
        geometry,
        False,
    )
    gradInput += grad_in.to(gradInput.dtype)
    gradOffset.copy_(grad_off)


@implements(
    "deform_conv_backward_parameters",
    npu=_DCN_NPU,
)
def deform_conv_backward_parameters(
    input: Any,
    offset: Any,
    gradOutput: Any,
    gradWeight: Any,
    columns: Any,
    ones: Any,
    kW: int,
    kH: int,
    dW: int,
    dH: int,
    padW: int,
    padH: int,
    dilationW: int,
    dilationH: int,
    group: int,
    deformable_group: int,
    scale: float,
    im2col_step: int,
) -> None:
    """Adds ``scale`` times the weight gradient into ``gradWeight``."""
    geometry = _dcn_geometry(
        kW, kH, dW, dH, padW, padH, dilationW, dilationH, group, deformable_group
    )
    weight = gradWeight.new_zeros(gradWeight.shape)
    found = _grads(
        (False, False, False, True, False),
        gradOutput,
        input,
        offset,
        None,
        weight.to(input.dtype),
        None,
        geometry,
        False,
    )[3]
    gradWeight += (found * scale).to(gradWeight.dtype)


def _mdcn_geometry(
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    group: int,
    deformable_group: int,
) -> _Geometry:
    return _Geometry(
        (int(stride_h), int(stride_w)),
        (int(pad_h), int(pad_w)),
        (int(dilation_h), int(dilation_w)),
        group,
        deformable_group,
    )


@implements(
    "modulated_deform_conv_forward",
    npu=_MDCN_NPU,
)
def modulated_deform_conv_forward(
    input: Any,
    weight: Any,
    bias: Any,
    ones: Any,
    offset: Any,
    mask: Any,
    output: Any,
    columns: Any,
    kernel_h: int,
    kernel_w: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    group: int,
    deformable_group: int,
    with_bias: bool,
) -> None:
    """DCNv2 into ``output [N, Cout, Ho, Wo]`` (plus ``bias`` when ``with_bias``)."""
    geometry = _mdcn_geometry(
        stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group
    )
    out = _dcn(input, offset, mask, weight, bias if with_bias else None, geometry, True)
    output.copy_(out)


@implements(
    "modulated_deform_conv_backward",
    npu=_MDCN_NPU,
)
def modulated_deform_conv_backward(
    input: Any,
    weight: Any,
    bias: Any,
    ones: Any,
    offset: Any,
    mask: Any,
    columns: Any,
    grad_input: Any,
    grad_weight: Any,
    grad_bias: Any,
    grad_offset: Any,
    grad_mask: Any,
    grad_output: Any,
    kernel_h: int,
    kernel_w: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    group: int,
    deformable_group: int,
    with_bias: bool,
) -> None:
    """Adds input, weight (and bias) gradients; writes the offset and mask gradients."""
    geometry = _mdcn_geometry(
        stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group
    )
    with_bias = bool(with_bias)
    found = _grads(
        (True, True, True, True, with_bias),
        grad_output,
        input,
        offset,
        mask,
        weight,
        bias if with_bias else None,
        geometry,
        True,
    )
    grad_input += found[0].to(grad_input.dtype)
    grad_offset.copy_(found[1])
    grad_mask.copy_(found[2])
    grad_weight += found[3].to(grad_weight.dtype)
    if with_bias:
        grad_bias += found[4].to(grad_bias.dtype)
