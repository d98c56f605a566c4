"""``mmcv._ext`` multi-scale deformable attention: ``ms_deform_attn_forward/backward``.

mmcv 2.1.0's ``MultiScaleDeformableAttnFunction`` (``mmcv/ops/multi_scale_deform_attn.py``)
calls ``ms_deform_attn_forward(value, value_spatial_shapes, value_level_start_index,
sampling_locations, attention_weights, im2col_step)``, which returns the output
``[bs, num_queries, num_heads * embed_dims]``, and ``ms_deform_attn_backward(...,
grad_output, grad_value, grad_sampling_loc, grad_attn_weight, im2col_step)``, which
fills the three preallocated (zeroed) gradients; like mmcv's kernels, which add with
atomics, these add into them. ``im2col_step`` only tiles mmcv's kernel over the batch
and is ignored.

mmcv has CUDA and MLU kernels, no CPU one; on the CPU it runs the pure-PyTorch
``multi_scale_deformable_attn_pytorch``, the definition followed here: each sample is
bilinear at pixel ``(x * w - 0.5, y * h - 0.5)`` of its level with zeros outside the
map (``grid_sample``, ``align_corners=False``), weighted by ``attention_weights``. The
portable kernel loops over the levels (a handful; each level has its own map size) and
accumulates each level's weighted samples instead of stacking them all, so it holds
one level's samples at a time; autograd of it gives the backward. Half precision is
computed in float32.

On NPU tensors ``mx_driving.multi_scale_deformable_attn`` (op
``multi_scale_deformable_attn`` of :mod:`ascend_patch_mmcv._kernel_source`) when chosen,
its own autograd giving the backward; torch_npu has no such op.
"""

from __future__ import annotations

from typing import Any

from ... import _kernel_source
from .registry import implements


__all__ = ["ms_deform_attn_backward", "ms_deform_attn_forward", "multi_scale_deformable_attn"]

OP = "multi_scale_deformable_attn"


def _on_npu(*tensors: Any) -> bool:
    return all(getattr(t, "is_npu", False) is True for t in tensors)


def multi_scale_deformable_attn(
    value: Any, value_spatial_shapes: Any, sampling_locations: Any, attention_weights: Any
) -> Any:
    """The portable kernel: ``[bs, num_queries, num_heads * embed_dims]``, differentiable."""
    import torch
    import torch.nn.functional as F

    wide = torch.float64 if value.dtype == torch.float64 else torch.float32
    bs, _, heads, dims = value.shape
    queries = sampling_locations.shape[1]
    # [bs * heads, dims, keys]: each level is a slice of the keys.
    maps = value.to(wide).permute(0, 2, 3, 1).reshape(bs * heads, dims, -1)
    # [bs * heads, queries, levels, points, 2] in grid_sample's [-1, 1].
    grids = (2 * sampling_locations.to(wide) - 1).transpose(1, 2).flatten(0, 1)
    weights = attention_weights.to(wide).transpose(1, 2).flatten(0, 1)
    out = maps.new_zeros(bs * heads, dims, queries)
    start = 0
    for level, (height, width) in enumerate(value_spatial_shapes.tolist()):
        image = maps[:, :, start : start + height * width].view(bs * heads, dims, height, width)
        start += height * width
        samples = F.grid_sample(
            image, grids[:, :, level], mode="bilinear", padding_mode="zeros", align_corners=False
        )  # [bs * heads, dims, queries, points]
        out = out + (samples * weights[:, None, :, level]).sum(-1)
    return out.view(bs, heads * dims, queries).transpose(1, 2).to(value.dtype)


def _use_mx(*tensors: Any) -> bool:
    if not _on_npu(*tensors):
        return False
    source = _kernel_source.choose(OP, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE))
    return source == _kernel_source.MX_DRIVING


def _attend(
    value: Any, shapes: Any, start: Any, sampling_locations: Any, attention_weights: Any
) -> Any:
    if _use_mx(value, sampling_locations) and value.numel() and attention_weights.numel():
        return _kernel_source.mx_driving().multi_scale_deformable_attn(
            value, shapes, start, sampling_locations, attention_weights
        )
    return multi_scale_deformable_attn(value, shapes, sampling_locations, attention_weights)


@implements("ms_deform_attn_forward", npu="mx_driving multi_scale_deformable_attn")
def ms_deform_attn_forward(
    value: Any,
    value_spatial_shapes: Any,
    value_level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    im2col_step: int,
) -> Any:
    """The attention output ``[bs, num_queries, num_heads * embed_dims]`` (value's dtype)."""
    return _attend(
        value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights
    )


@implements("ms_deform_attn_backward", npu="mx_driving multi_scale_deformable_attn")
def ms_deform_attn_backward(
    value: Any,
    value_spatial_shapes: Any,
    value_level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    grad_output: Any,
    grad_value: Any,
    grad_sampling_loc: Any,
    grad_attn_weight: Any,
    im2col_step: int,
) -> None:
    """Adds the gradients of value, sampling locations and attention weights."""
    import torch

    leaves = [
        t.detach().requires_grad_(True) for t in (value, sampling_locations, attention_weights)
    ]
    with torch.enable_grad():
        out = _attend(
            leaves[0], value_spatial_shapes, value_level_start_index, leaves[1], leaves[2]
        )
    found = torch.autograd.grad(out, leaves, grad_output.to(out.dtype), allow_unused=True)
    for target, grad in zip((grad_value, grad_sampling_loc, grad_attn_weight), found, strict=True):
        if grad is not None:
            target += grad.to(target.dtype)
