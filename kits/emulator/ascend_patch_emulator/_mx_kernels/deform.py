"""Deformable convolution: ``deform_conv2d`` / ``DeformConv2dFunction`` and
``modulated_deform_conv2d`` / ``ModulatedDeformConv2dFunction``.

mx_driving's Functions are drop-ins for mmcv's, so the arguments follow mmcv: NCHW
``x``, ``offset [N, deformable_groups * 2 * kh * kw, Hout, Wout]`` holding a ``(y,
x)`` pair per kernel tap, ``mask [N, deformable_groups * kh * kw, Hout, Wout]``
(already activated), ``weight [Cout, Cin / groups, kh, kw]``, and ``stride``,
``padding``, ``dilation`` as an int or a pair. The math is the emulator's torch_npu
reference (``_kernels.deform_conv``): the offsets are reordered into its layout
(all x, then all y, then the mask), bilinear sampling with zeros outside the map.
Computed in float32 (float64 stays), returned in ``x``'s dtype. The backward gives
gradients for x, offset, weight (and mask), the derivative of the formula.

What the wheel's Python shows, and the emulator repeats: ``deform_conv2d`` takes
``bias`` and ``im2col_step`` and uses neither; ``modulated_deform_conv2d`` takes
``bias`` and does not add it (its forward passes no bias to the kernel and its
backward returns no bias gradient), so callers add the bias themselves; it accepts
only 3x3 kernels and ``x`` and ``weight`` channel counts that are multiples of 64
(``ValueError`` otherwise), and casts ``weight`` to ``x``'s dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.utils import _pair

from .._kernels.deform_conv import deformable_conv2d
from . import MxFunction
from . import public
from . import raw_apply


__all__ = ["PUBLIC", "DeformConv2dFunction", "ModulatedDeformConv2dFunction", "deform_conv"]


def deform_conv(
    x: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    deformable_groups: int,
) -> Any:
    """The forward formula in mmcv's conventions (``mask`` None: not modulated)."""
    batch = x.shape[0]
    kh, kw = weight.shape[2], weight.shape[3]
    taps = kh * kw
    out_h, out_w = offset.shape[-2:]
    # mmcv: channel g * 2 * taps + 2 * k (+1) is the y (x) offset of tap k in group g.
    pairs = offset.reshape(batch, deformable_groups, taps, 2, out_h, out_w)
    parts = [pairs[:, :, :, 1], pairs[:, :, :, 0]]
    if mask is not None:
        parts.append(mask.reshape(batch, deformable_groups, taps, out_h, out_w))
    npu_offset = torch.stack(parts, dim=1).reshape(batch, -1, out_h, out_w)
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    out, _ = deformable_conv2d(
        x,
        weight,
        npu_offset,
        None,
        [kh, kw],
        [1, 1, sh, sw],
        [ph, ph, pw, pw],
        [1, 1, dh, dw],
        groups,
        deformable_groups,
        mask is not None,
    )
    return out.to(x.dtype)


def _gradients(ctx: Any, grad_out: Any, modulated: bool) -> tuple[Any, ...]:
    """Gradients of the saved inputs (x, offset, [mask,] weight) by autograd."""
    saved = ctx.saved_tensors
    leaves = [t.detach().requires_grad_(need) for t, need in zip(saved, ctx.needs, strict=True)]
    wanted = [leaf for leaf in leaves if leaf.requires_grad]
    if not wanted:
        return tuple(None for _ in leaves)
    with torch.enable_grad():
        if modulated:
            x, offset, mask, weight = leaves
        else:
            (x, offset, weight), mask = leaves, None
        out = deform_conv(x, offset, mask, weight, *ctx.geometry)
    found = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
    return tuple(next(found) if leaf.requires_grad else None for leaf in leaves)


class DeformConv2dFunction(MxFunction):
    """``mx_driving.DeformConv2dFunction``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Any,
        offset: Any,
        weight: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        deformable_groups: int = 1,
        bias: Any = False,
        im2col_step: Any = 32,
    ) -> Any:
        ctx.geometry = (stride, padding, dilation, groups, deformable_groups)
        ctx.needs = ctx.needs_input_grad[:3]
        ctx.save_for_backward(x, offset, weight)
        return deform_conv(x, offset, None, weight, *ctx.geometry)

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> tuple[Any, ...]:
        grad_x, grad_offset, grad_weight = _gradients(ctx, grad_out, modulated=False)
        return (grad_x, grad_offset, grad_weight, *([None] * 7))


class ModulatedDeformConv2dFunction(MxFunction):
    """``mx_driving.ModulatedDeformConv2dFunction`` (``bias`` is not added, as there)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Any,
        offset: Any,
        mask: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        deformable_groups: int = 1,
    ) -> Any:
        if weight.size(2) != 3 or weight.size(3) != 3:
            raise ValueError(
                "modulated_deform_conv2d (emulated mx_driving): only 3x3 kernels are "
                f"supported, got {tuple(weight.shape[2:])}"
            )
        if x.size(1) % 64 or weight.size(0) % 64:
            raise ValueError(
                "modulated_deform_conv2d (emulated mx_driving): input and output channels "
                f"must be multiples of 64, got {x.size(1)} and {weight.size(0)}"
            )
        ctx.geometry = (stride, padding, dilation, groups, deformable_groups)
        ctx.needs = ctx.needs_input_grad[:4]
        ctx.save_for_backward(x, offset, mask, weight)
        return deform_conv(x, offset, mask, weight, *ctx.geometry)

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> tuple[Any, ...]:
        grad_x, grad_offset, grad_mask, grad_weight = _gradients(ctx, grad_out, modulated=True)
        return (grad_x, grad_offset, grad_mask, grad_weight, *([None] * 6))


@public("deform_conv2d")
def deform_conv2d(
    x: Any,
    offset: Any,
    weight: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    deformable_groups: int = 1,
    bias: Any = False,
    im2col_step: Any = 32,
) -> Any:
    return raw_apply(
        DeformConv2dFunction,
        x,
        offset,
        weight,
        stride,
        padding,
        dilation,
        groups,
        deformable_groups,
        bias,
        im2col_step,
    )


@public("modulated_deform_conv2d")
def modulated_deform_conv2d(
    x: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    deformable_groups: int = 1,
) -> Any:
    return raw_apply(
        ModulatedDeformConv2dFunction,
        x,
        offset,
        mask,
        weight.type_as(x),
        bias,
        stride,
        padding,
        dilation,
        groups,
        deformable_groups,
    )


PUBLIC = {
    "DeformConv2dFunction": DeformConv2dFunction,
    "ModulatedDeformConv2dFunction": ModulatedDeformConv2dFunction,
    "deform_conv2d": deform_conv2d,
    "modulated_deform_conv2d": modulated_deform_conv2d,
}
