"""Deformable convolution: ``npu_deformable_conv2d`` (DCNv1/v2, torch_npu's conventions).

* ``stride``, ``padding`` and ``dilation`` are 4-element lists in NCHW order:
  stride ``[1, 1, sh, sw]``, dilation ``[1, 1, dh, dw]``, padding ``[top, bottom, left, right]``;
* ``offset`` is ``[N, 3 * dg * kh * kw, Hout, Wout]`` when ``modulated`` (2x without
  the mask): first all x offsets, then all y offsets, then the modulation mask
  (already activated), each indexed ``g * kh * kw + i * kw + j``. torch_npu's contrib
  module gets there from mmcv/torchvision's interleaved ``(y, x)`` pairs with
  ``perm = idx[1::2] + idx[::2]``;
* ``kernel_size`` must match the weight's ``(kh, kw)``; torch_npu's own contrib
  module passes ``(kw, kh)``, so both orders are accepted;
* all inputs are computed in float32 (float64 stays), outputs are float32.

Returns ``(out [N, Cout, Hout, Wout], deform_out [N, Cin, Hout * kh, Wout * kw])``:
``deform_out`` holds the (masked) bilinear samples laid out so that a plain
convolution with stride ``(kh, kw)`` over it gives ``out``. Sampling follows
mmcv/torchvision: zero outside the feature map, bilinear inside; a sampling point
at or beyond one pixel outside the map, NaN or infinite gives 0 (as mmcv's kernels,
whose test NaN fails), with zero gradients. The gradient (for input, weight, offset
and bias) is the derivative of this formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import kernel


def _fail(message: str) -> RuntimeError:
    return RuntimeError(f"npu_deformable_conv2d: {message}")


def _four(name: str, values: Sequence[int]) -> list[int]:
    values = list(values)
    if len(values) != 4:
        raise _fail(f"{name} must have 4 elements (NCHW order), got {values}")
    return values


def _sample(images: Any, y: Any, x: Any) -> Any:
    """Bilinear samples of ``images [N, G, C, H, W]`` at ``y, x [N, G, P]`` -> ``[N, G, C, P]``.

    mmcv's rule: only a point strictly inside ``(-1, H) x (-1, W)`` is sampled; any other
    point -- beyond the map, NaN or infinite -- gives 0 and zero gradients (it is moved to
    ``(-2, -2)``, where no corner is on the map, by ``torch.where``: no ``0 * inf``).
    Corners outside the map count as 0 and are not read.
    """
    height, width = images.shape[-2:]
    flat = images.flatten(-2)
    valid = (y > -1) & (y < height) & (x > -1) & (x < width)
    far = torch.full((), -2.0, dtype=y.dtype)
    y, x = torch.where(valid, y, far), torch.where(valid, x, far)
    y0, x0 = y.floor(), x.floor()
    ly, lx = y - y0, x - x0
    total = torch.zeros(*flat.shape[:3], y.shape[-1], dtype=images.dtype)
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y0 + dy, x0 + dx
            inside = ((yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)).unsqueeze(2)
            index = (yy.clamp(0, height - 1) * width + xx.clamp(0, width - 1)).long()
            gathered = flat.gather(3, index.unsqueeze(2).expand(-1, -1, flat.shape[2], -1))
            total = total + torch.where(inside, gathered * (wy * wx).unsqueeze(2), 0.0)
    return total


@kernel("npu_deformable_conv2d", differentiable=True, grad_outputs=(0,))
def deformable_conv2d(
    input: Any,
    weight: Any,
    offset: Any,
    bias: Any,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int] = (1, 1, 1, 1),
    groups: int = 1,
    deformable_groups: int = 1,
    modulated: bool = True,
) -> tuple[Any, Any]:
    wide = torch.float64 if input.dtype == torch.float64 else torch.float32
    x = input.to(wide)
    w = weight.to(wide)
    batch, channels, height, width = x.shape
    kh, kw = w.shape[2], w.shape[3]
    if list(kernel_size) not in ([kh, kw], [kw, kh]):
        raise _fail(f"kernel_size {list(kernel_size)} does not match the weight's ({kh}, {kw})")
    _, _, sh, sw = _four("stride", stride)
    top, bottom, left, right = _four("padding", padding)
    _, _, dh, dw = _four("dilation", dilation)
    out_h = (height + top + bottom - ((kh - 1) * dh + 1)) // sh + 1
    out_w = (width + left + right - ((kw - 1) * dw + 1)) // sw + 1
    taps = kh * kw
    dg = deformable_groups
    if channels % dg or channels % groups:
        raise _fail(f"{channels} input channels are not divisible by the groups")
    expected = (batch, (3 if modulated else 2) * dg * taps, out_h, out_w)
    if tuple(offset.shape) != expected:
        raise _fail(f"offset shape {tuple(offset.shape)} must be {expected}")
    o = offset.to(wide).view(batch, -1, dg, taps, out_h, out_w)
    off_x, off_y = o[:, 0], o[:, 1]
    mask = o[:, 2] if modulated else None
    # Sampling positions [N, dg, taps, Hout, Wout]
    rows = torch.arange(out_h, dtype=wide).view(1, 1, 1, out_h, 1) * sh - top
    cols = torch.arange(out_w, dtype=wide).view(1, 1, 1, 1, out_w) * sw - left
    tap_y = (torch.arange(kh, dtype=wide) * dh).repeat_interleave(kw).view(1, 1, taps, 1, 1)
    tap_x = (torch.arange(kw, dtype=wide) * dw).repeat(kh).view(1, 1, taps, 1, 1)
    y = (rows + tap_y + off_y).flatten(2)
    xs = (cols + tap_x + off_x).flatten(2)
    images = x.view(batch, dg, channels // dg, height, width)
    samples = _sample(images, y, xs).view(batch, dg, channels // dg, taps, out_h, out_w)
    if mask is not None:
        samples = samples * mask.unsqueeze(2)
    # [N, Cin, Hout, kh, Wout, kw] -> [N, Cin, Hout * kh, Wout * kw]
    columns = (
        samples.reshape(batch, channels, kh, kw, out_h, out_w)
        .permute(0, 1, 4, 2, 5, 3)
        .reshape(batch, channels, out_h * kh, out_w * kw)
    )
    b = bias.to(wide) if bias is not None else None
    out = F.conv2d(columns, w, b, stride=(kh, kw), groups=groups)
    return out.float() if wide == torch.float32 else out, columns.to(out.dtype)
