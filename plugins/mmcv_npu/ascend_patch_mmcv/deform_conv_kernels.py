"""Deformable convolution (DCNv1 and the modulated DCNv2) in mmcv's conventions, three ways.

All take mmcv's arguments -- ``input [N, C, H, W]``, ``offset [N, 2*dg*kh*kw, Ho, Wo]``
with interleaved ``(dy, dx)`` pairs per kernel tap, ``mask [N, dg*kh*kw, Ho, Wo]``
(modulated only), ``weight [Cout, C/groups, kh, kw]``, ``bias`` or None, and ``stride``,
``padding``, ``dilation`` as ints or pairs -- and return ``[N, Cout, Ho, Wo]``,
differentiable in input, offset, mask, weight and bias:

* :func:`portable` -- PyTorch only: every tap's bilinear sample of every channel in one
  ``embedding_bag`` over the channels-last map (no loop over positions), then one
  grouped matrix product; autograd gives the backward. Sampling follows mmcv's
  kernels: a point at or beyond one pixel outside the map gives 0, corners outside the
  map count as 0.
* :func:`torch_npu_kernel` -- ``torch_npu.npu_deformable_conv2d``, whose offsets are all
  x then all y (then the mask); its backward is ``npu_deformable_conv2dbk``.
* :func:`mx_driving_kernel` -- DrivingSDK's ``modulated_deform_conv2d`` /
  ``deform_conv2d``, within their domain (:func:`mx_driving_supports`).

Sampling positions: a point at or beyond one pixel outside the map -- NaN and
infinities included, whose comparisons all fail in mmcv's kernels too -- gives 0 and
zero offset gradients.

Offsets of another spatial size than the output (:func:`offsets_at_output_size`):
mmcv's DCNv1 refuses them (``invalid spatial size of offset``) and so do these; its
DCNv2 kernels do not check, they read each sample's offset and mask as ``[C, Ho, Wo]``
from the start of its memory. mmdet's DyHead relies on that (its ``spatial_conv_high``
runs on the next, smaller level with the offsets of the current one), so for DCNv2
every kernel here gets the same values: the first ``C * Ho * Wo`` of each sample, in
order; fewer than that is an error (mmcv would read past the tensor).
"""

from __future__ import annotations

from typing import Any

from . import _kernel_source


__all__ = [
    "mx_driving_kernel",
    "mx_driving_supports",
    "offsets_at_output_size",
    "output_size",
    "portable",
    "torch_npu_kernel",
]


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


def _corners(y: Any, x: Any, weight: Any, height: int, width: int) -> tuple[Any, Any]:
    """Bilinear corners of samples at ``y, x``: flat pixel indices and weights, ``[..., 4]``.

    mmcv's rule: a sample at or beyond one pixel outside the map is 0, corners outside
    the map count as 0. ``weight`` (the mask, validity) multiplies every corner.
    """
    import torch

    valid = (y > -1) & (y < height) & (x > -1) & (x < width)
    # A point outside (NaN too) moves to (-2, -2), where no corner is on the map: its
    # weights are exactly 0 and so are its offset gradients (torch.where, no 0 * inf).
    far = torch.full((), -2.0, dtype=y.dtype, device=y.device)
    y, x = torch.where(valid, y, far), torch.where(valid, x, far)
    weight = weight * valid
    y0, x0 = y.floor(), x.floor()
    ly, lx = y - y0, x - x0
    y0, x0 = y0.long(), x0.long()
    index, weights = [], []
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y0 + dy, x0 + dx
            inside = (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
            index.append(yy.clamp(0, height - 1) * width + xx.clamp(0, width - 1))
            weights.append(wy * wx * weight * inside)
    return torch.stack(index, -1), torch.stack(weights, -1)


def output_size(
    input: Any, weight: Any, stride: Any, padding: Any, dilation: Any
) -> tuple[int, int]:
    """``(Ho, Wo)`` of the convolution, mmcv's formula."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    height, width = input.shape[-2:]
    kh, kw = weight.shape[2], weight.shape[3]
    return (
        (height + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1,
        (width + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1,
    )


def _as_read(tensor: Any, channels: int, out_h: int, out_w: int, what: str) -> Any:
    """``tensor [N, ...]`` as mmcv's DCNv2 kernel reads it: each sample's first
    ``channels * out_h * out_w`` values as ``[channels, out_h, out_w]``."""
    batch = tensor.shape[0]
    if tuple(tensor.shape[1:]) == (channels, out_h, out_w):
        return tensor
    need, have = channels * out_h * out_w, (tensor[0].numel() if batch else 0)
    if tensor.dim() != 4 or have < need:
        raise RuntimeError(
            f"modulated_deform_conv2d: {what} {tuple(tensor.shape)} holds {have} values per "
            f"sample; the output {out_h}x{out_w} needs {need} ({channels} channels of "
            f"{out_h}x{out_w}): mmcv's kernel would read past it. Give the {what} the "
            f"output's size [N, {channels}, {out_h}, {out_w}]."
        )
    return tensor.reshape(batch, -1)[:, :need].view(batch, channels, out_h, out_w)


def offsets_at_output_size(
    input: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    deform_groups: int,
) -> tuple[Any, Any]:
    """``(offset, mask)`` of the output's spatial size, as mmcv's kernels take them.

    DCNv1 (``mask`` None): mmcv's shape check -- anything but ``[N, 2 * dg * kh * kw,
    Ho, Wo]`` is an error. DCNv2: each sample's values read in order (module docstring).
    """
    out_h, out_w = output_size(input, weight, stride, padding, dilation)
    taps = weight.shape[2] * weight.shape[3]
    if mask is None:
        expected = (input.shape[0], 2 * deform_groups * taps, out_h, out_w)
        if tuple(offset.shape) != expected:
            raise RuntimeError(
                f"deform_conv2d: invalid offset shape {tuple(offset.shape)}, expected "
                f"{expected} (batch, 2 * deform_groups * kh * kw, output height, output "
                f"width), as mmcv's kernel checks"
            )
        return offset, None
    return (
        _as_read(offset, 2 * deform_groups * taps, out_h, out_w, "offset"),
        _as_read(mask, deform_groups * taps, out_h, out_w, "mask"),
    )


def portable(
    input: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    deform_groups: int = 1,
) -> Any:
    """Modulated deformable convolution in PyTorch; ``mask=None`` is DCNv1 (all ones).

    The columns (every tap's bilinear sample of every channel) come from one
    ``embedding_bag``: the map is a channels-last table of pixels, each sample a bag of
    its 4 corners weighted by bilinear weight x mask, so no per-corner
    ``channels x samples`` tensor is built; autograd differentiates through the table
    (input) and the per-sample weights (offsets, mask).
    """
    import torch
    import torch.nn.functional as F

    offset, mask = offsets_at_output_size(
        input, offset, mask, weight, stride, padding, dilation, deform_groups
    )
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    batch, channels, height, width = input.shape
    out_channels, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[-2:]
    taps, dg, positions = kh * kw, deform_groups, out_h * out_w
    dtype = torch.promote_types(input.dtype, offset.dtype)
    device = input.device
    offsets = offset.to(dtype).view(batch, dg, taps, 2, out_h, out_w)
    rows = torch.arange(out_h, device=device, dtype=dtype).view(out_h, 1) * sh - ph
    cols = torch.arange(out_w, device=device, dtype=dtype).view(1, out_w) * sw - pw
    tap_y = (torch.arange(kh, device=device, dtype=dtype) * dh).repeat_interleave(kw)
    tap_x = (torch.arange(kw, device=device, dtype=dtype) * dw).repeat(kh)
    # Samples ordered (n, position, deform group, tap): [N, L, dg, taps].
    y = (rows + tap_y.view(taps, 1, 1) + offsets[:, :, :, 0]).flatten(3).permute(0, 3, 1, 2)
    x = (cols + tap_x.view(taps, 1, 1) + offsets[:, :, :, 1]).flatten(3).permute(0, 3, 1, 2)
    scale = (
        torch.ones((), device=device, dtype=dtype)
        if mask is None
        else mask.to(dtype).view(batch, dg, taps, positions).permute(0, 3, 1, 2)
    )
    index, weights = _corners(y, x, scale, height, width)
    # One table of pixels per (image, deform group): [N * dg * H * W, C / dg].
    image = torch.arange(batch, device=device).view(batch, 1, 1, 1) * dg
    image = image + torch.arange(dg, device=device).view(1, 1, dg, 1)
    index = (index + (image * (height * width)).unsqueeze(-1)).flatten()
    table = input.to(dtype).view(batch, dg, channels // dg, height, width)
    table = table.permute(0, 1, 3, 4, 2).reshape(-1, channels // dg)
    bags = torch.arange(0, index.numel(), 4, device=device)
    columns = F.embedding_bag(
        index, table, bags, mode="sum", per_sample_weights=weights.flatten().to(table.dtype)
    )
    # [N*L, dg, taps, C/dg] -> per convolution group [N*L, g, C/g * taps]: the weight's
    # own (channel, kh, kw) order.
    columns = columns.view(batch * positions, dg, taps, channels // dg).transpose(2, 3)
    columns = columns.reshape(batch * positions, groups, channels // groups * taps)
    kernel = weight.to(dtype).reshape(groups, out_channels // groups, -1)
    out = torch.einsum("lgk,gok->lgo", columns, kernel).reshape(batch, out_h, out_w, out_channels)
    out = out.permute(0, 3, 1, 2)
    if bias is not None and bias.numel():
        out = out + bias.to(dtype).view(1, -1, 1, 1)
    return out.to(input.dtype)


def _npu_offsets(offset: Any, mask: Any, taps: int, deform_groups: int) -> Any:
    """mmcv's interleaved ``(dy, dx)`` offsets and the mask in torch_npu's layout."""
    import torch

    batch, _, out_h, out_w = offset.shape
    pairs = offset.view(batch, deform_groups * taps, 2, out_h, out_w)
    xs, ys = pairs[:, :, 1], pairs[:, :, 0]
    if mask is None:
        mask = offset.new_ones(batch, deform_groups * taps, out_h, out_w)
    return torch.cat((xs, ys, mask.to(offset.dtype)), dim=1)


def torch_npu_kernel(
    input: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    deform_groups: int = 1,
) -> Any:
    """The same through ``torch_npu.npu_deformable_conv2d`` (its autograd backward)."""
    import torch_npu

    offset, mask = offsets_at_output_size(
        input, offset, mask, weight, stride, padding, dilation, deform_groups
    )
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    kh, kw = weight.shape[2], weight.shape[3]
    out, _ = torch_npu.npu_deformable_conv2d(
        input,
        weight,
        _npu_offsets(offset, mask, kh * kw, deform_groups),
        bias if bias is not None and bias.numel() else None,
        kernel_size=[kh, kw],
        stride=[1, 1, sh, sw],
        padding=[ph, ph, pw, pw],
        dilation=[1, 1, dh, dw],
        groups=groups,
        deformable_groups=deform_groups,
        modulated=True,
    )
    return out.to(input.dtype)


def mx_driving_supports(input: Any, weight: Any, modulated: bool) -> bool:
    """Whether DrivingSDK's kernel takes these shapes.

    Its modulated kernel refuses (ValueError) anything but a 3x3 kernel with input and
    output channels multiples of 64; the same limits are assumed for the unmodulated one.
    """
    return (
        tuple(weight.shape[2:]) == (3, 3) and input.shape[1] % 64 == 0 and weight.shape[0] % 64 == 0
    )


def mx_driving_kernel(
    input: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    deform_groups: int = 1,
) -> Any:
    """DrivingSDK's kernels; the bias is added here (they take none)."""
    mx = _kernel_source.mx_driving()
    offset, mask = offsets_at_output_size(
        input, offset, mask, weight, stride, padding, dilation, deform_groups
    )
    weight = weight.type_as(input)
    if mask is None:
        out = mx.deform_conv2d(
            input, offset, weight, stride, padding, dilation, groups, deform_groups
        )
    else:
        out = mx.modulated_deform_conv2d(
            input, offset, mask, weight, None, stride, padding, dilation, groups, deform_groups
        )
    if bias is not None and bias.numel():
        out = out + bias.view(1, -1, 1, 1).to(out.dtype)
    return out
