"""Multi-scale deformable attention: ``multi_scale_deformable_attn`` and its Function.

Arguments as mmcv's ``MultiScaleDeformableAttnFunction`` takes them (mx_driving's
is its drop-in): ``value [bs, num_keys, num_heads, embed_dims]``, ``spatial_shapes
[num_levels, 2]`` as ``(h, w)``, ``level_start_index [num_levels]``,
``sampling_locations [bs, num_queries, num_heads, num_levels, num_points, 2]`` as
``(x, y)`` in ``[0, 1]`` of each level's map, ``attention_weights [bs, num_queries,
num_heads, num_levels, num_points]``; output ``[bs, num_queries, num_heads * embed_dims]``.

Each sample is bilinear at pixel ``(x * w - 0.5, y * h - 0.5)`` with zeros outside
the map (grid_sample's ``align_corners=False``, ``padding_mode="zeros"``), written
here as four gathered corners; the sum over levels and points is weighted by
``attention_weights``. A sampling point counts only strictly inside ``(-1, w) x (-1,
h)`` in pixels, the test of mmcv's CUDA kernel and of DrivingSDK's (its
``ComputeLocation`` "fix the sampling location inputs nan and inf bug"): any other
point -- beyond the map, NaN or infinite -- is moved to pixel ``(-2, -2)`` and its
attention weight set to 0, so it adds exactly 0 (even where ``value`` or its weight
is not finite) and every gradient it receives is 0. Corners outside the map are
never read. Computed in float32 (float64 stays), returned in ``value``'s
dtype. The backward gives gradients for value, sampling_locations and
attention_weights (None for the shapes and start indices, as the real op), the
derivative of this formula by autograd.
"""

from __future__ import annotations

from typing import Any

import torch

from . import MxFunction
from . import applier
from . import public
from . import raw_apply


__all__ = ["PUBLIC", "MultiScaleDeformableAttnFunction", "ms_deform_attn"]


def _bilinear(images: Any, x: Any, y: Any) -> Any:
    """Samples of ``images [B, D, H, W]`` at pixel ``x, y [B, P]`` -> ``[B, D, P]``.

    ``x, y`` must be finite (:func:`_valid_points` moves the others away).
    """
    batch, dims, height, width = images.shape
    flat = images.reshape(batch, dims, height * width)
    x0, y0 = x.floor(), y.floor()
    fx, fy = x - x0, y - y0
    total = images.new_zeros(batch, dims, x.shape[-1])
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            xx, yy = x0 + dx, y0 + dy
            inside = ((xx >= 0) & (xx < width) & (yy >= 0) & (yy < height)).unsqueeze(1)
            index = (yy.clamp(0, height - 1) * width + xx.clamp(0, width - 1)).long()
            corner = flat.gather(2, index.unsqueeze(1).expand(-1, dims, -1))
            # where, not a product with the mask: a corner outside the map is not read,
            # so a non-finite value at the clamped pixel cannot leak into it.
            weighted = torch.where(inside, corner * (wx * wy).unsqueeze(1), 0.0)
            total = total + weighted
    return total


def _valid_points(x: Any, y: Any, weight: Any, height: int, width: int) -> tuple[Any, Any, Any]:
    """The hardware kernel's rule: a point outside ``(-1, w) x (-1, h)`` (NaN and infinities
    fail every comparison) goes to ``(-2, -2)``, where no corner is on the map, with weight 0.

    ``torch.where`` and not arithmetic: the moved point's gradients are exactly 0, never
    ``0 * inf``.
    """
    valid = (x > -1) & (y > -1) & (x < width) & (y < height)
    far = torch.full((), -2.0, dtype=x.dtype)
    return torch.where(valid, x, far), torch.where(valid, y, far), torch.where(valid, weight, 0.0)


def ms_deform_attn(
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
) -> Any:
    """The forward formula, differentiable in value, locations and weights."""
    if value.numel() == 0 or spatial_shapes.numel() == 0 or attention_weights.numel() == 0:
        raise RuntimeError("multi_scale_deformable_attn: input tensors must not be empty")
    wide = torch.float64 if value.dtype == torch.float64 else torch.float32
    bs, _, heads, dims = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    if spatial_shapes.shape != (levels, 2) or attention_weights.shape != (
        bs,
        queries,
        heads,
        levels,
        points,
    ):
        raise RuntimeError(
            f"multi_scale_deformable_attn: spatial_shapes {tuple(spatial_shapes.shape)}, "
            f"sampling_locations {tuple(sampling_locations.shape)} and attention_weights "
            f"{tuple(attention_weights.shape)} do not agree"
        )
    v = value.to(wide)
    locations = sampling_locations.to(wide)
    weights = attention_weights.to(wide)
    out = v.new_zeros(bs, heads, dims, queries)
    starts = [int(s) for s in level_start_index.tolist()]
    for level, (height, width) in enumerate(spatial_shapes.tolist()):
        start = starts[level]
        maps = v[:, start : start + height * width].permute(0, 2, 3, 1)
        maps = maps.reshape(bs * heads, dims, height, width)
        # [bs, queries, heads, points] -> [bs * heads, queries * points]
        loc = locations[:, :, :, level].permute(0, 2, 1, 3, 4)
        x = (loc[..., 0] * width - 0.5).reshape(bs * heads, queries * points)
        y = (loc[..., 1] * height - 0.5).reshape(bs * heads, queries * points)
        weight = weights[:, :, :, level].permute(0, 2, 1, 3).reshape(bs * heads, queries * points)
        x, y, weight = _valid_points(x, y, weight, height, width)
        samples = _bilinear(maps, x, y).view(bs, heads, dims, queries, points)
        out = out + (samples * weight.view(bs, heads, 1, queries, points)).sum(-1)
    return out.permute(0, 3, 1, 2).reshape(bs, queries, heads * dims).to(value.dtype)


class MultiScaleDeformableAttnFunction(MxFunction):
    """``mx_driving.MultiScaleDeformableAttnFunction`` (``multi_scale_deformable_attn``)."""

    @staticmethod
    def forward(
        ctx: Any,
        value: Any,
        value_spatial_shapes: Any,
        value_level_start_index: Any,
        sampling_locations: Any,
        attention_weights: Any,
        **kwargs: Any,
    ) -> Any:
        # As the real op: the locations and weights are used in value's dtype.
        sampling_locations = sampling_locations.type_as(value)
        attention_weights = attention_weights.type_as(value)
        ctx.save_for_backward(
            value,
            value_spatial_shapes,
            value_level_start_index,
            sampling_locations,
            attention_weights,
        )
        return ms_deform_attn(
            value,
            value_spatial_shapes,
            value_level_start_index,
            sampling_locations,
            attention_weights,
        )

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> tuple[Any, ...]:
        value, shapes, starts, locations, weights = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(True) for t in (value, locations, weights)]
        with torch.enable_grad():
            out = ms_deform_attn(leaves[0], shapes, starts, leaves[1], leaves[2])
        grads = torch.autograd.grad(out, leaves, grad_output, allow_unused=True)
        return grads[0], None, None, grads[1], grads[2]


@public("npu_multi_scale_deformable_attn_function")
def npu_multi_scale_deformable_attn_function(
    value: Any, shape: Any, offset: Any, locations: Any, weight: Any
) -> Any:
    """The deprecated spelling: the same Function."""
    return raw_apply(MultiScaleDeformableAttnFunction, value, shape, offset, locations, weight)


PUBLIC = {
    "MultiScaleDeformableAttnFunction": MultiScaleDeformableAttnFunction,
    "multi_scale_deformable_attn": applier(
        "multi_scale_deformable_attn", MultiScaleDeformableAttnFunction
    ),
    "npu_multi_scale_deformable_attn_function": npu_multi_scale_deformable_attn_function,
}
