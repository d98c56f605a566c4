"""MultiScaleDeformableAttention: mmcv's deformable attention on the NPU kernel.

mmcv computes deformable attention two ways, in ``mmcv.ops.multi_scale_deform_attn``
(the same in mmcv 1.7 and 2.x):

* ``MultiScaleDeformableAttnFunction.apply(value, shapes, level_start_index,
  sampling_locations, attention_weights, im2col_step)`` -- the compiled ``_ext``
  kernel (CUDA/MLU only), which models of the BEVFormer family also call directly;
* ``multi_scale_deformable_attn_pytorch(value, shapes, sampling_locations,
  attention_weights)`` -- a ``grid_sample`` loop over levels, which
  ``MultiScaleDeformableAttention.forward`` takes for every tensor that is not on a
  CUDA or MLU device, so for every NPU tensor.

The group replaces both for NPU tensors (``runtime_check``; anything else goes to
mmcv's code). The kernel (:mod:`ascend_patch_mmcv._kernel_source`, op
``multi_scale_deformable_attn``): ``mx_driving.multi_scale_deformable_attn`` (an
autograd function with its own backward), else a portable one: mmcv's own PyTorch
implementation, which autograd differentiates. torch_npu has no such op. With the
portable kernel the PyTorch path is left alone (it already is that kernel), and the
``Function`` is served by it instead of the missing ``_ext``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from . import _kernel_source


__all__ = ["MODULE", "OP", "level_start_index", "msda_patches"]

MODULE = "mmcv.ops.multi_scale_deform_attn"
OP = "multi_scale_deformable_attn"


def level_start_index(value_spatial_shapes: Any) -> Any:
    """Where each level starts in the flattened keys: 0, h0*w0, h0*w0 + h1*w1, ..."""
    import torch

    sizes = value_spatial_shapes.prod(1)
    return torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1]))


def _on_npu(*tensors: Any) -> bool:
    # ``Tensor.is_npu`` (torch_npu's, and the emulator's, whose NPU tensors live on the CPU).
    return all(getattr(t, "is_npu", False) is True for t in tensors)


def _mx_kernel(
    value: Any, shapes: Any, start: Any, sampling_locations: Any, attention_weights: Any
) -> Any:
    return _kernel_source.mx_driving().multi_scale_deformable_attn(
        value, shapes, start, sampling_locations, attention_weights
    )


def _portable_kernel(
    value: Any, shapes: Any, start: Any, sampling_locations: Any, attention_weights: Any
) -> Any:
    # mmcv's own PyTorch implementation: differentiable, and the definition of the op.
    pytorch = sys.modules[MODULE].multi_scale_deformable_attn_pytorch
    return pytorch(value, shapes, sampling_locations, attention_weights)


def _function_apply(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``MultiScaleDeformableAttnFunction.apply`` (a classmethod) served by ``kernel``."""

    def apply(
        cls: Any,
        value: Any,
        value_spatial_shapes: Any,
        value_level_start_index: Any,
        sampling_locations: Any,
        attention_weights: Any,
        im2col_step: Any = None,
    ) -> Any:
        # im2col_step only tiles the CUDA kernel's batch; the result does not depend on it.
        # As mmcv's Function: locations and weights in value's dtype (under autocast value
        # is float16 and they are float32; grid_sample would refuse the mix).
        # mx_driving's kernel refuses empty tensors (no query); mmcv's definition gives
        # an empty result, so that case takes the portable kernel.
        use = kernel if attention_weights.numel() > 0 else _portable_kernel
        return use(
            value,
            value_spatial_shapes,
            value_level_start_index,
            sampling_locations.type_as(value),
            attention_weights.type_as(value),
        )

    return apply


def _apply_check(cls: Any, value: Any, shapes: Any, start: Any, locations: Any, *rest: Any) -> bool:
    return _on_npu(value, locations) and value.numel() > 0 and shapes.numel() > 0


def _pytorch_path(
    value: Any, value_spatial_shapes: Any, sampling_locations: Any, attention_weights: Any
) -> Any:
    """``multi_scale_deformable_attn_pytorch``'s arguments, on the mx_driving kernel."""
    start = level_start_index(value_spatial_shapes)
    return _mx_kernel(value, value_spatial_shapes, start, sampling_locations, attention_weights)


def _pytorch_check(value: Any, shapes: Any, locations: Any, weights: Any) -> bool:
    # mmcv's function also takes the shapes as a list of (h, w) pairs; the kernel wants
    # the [levels, 2] tensor, so a list goes to mmcv's code.
    return (
        _on_npu(value, locations)
        and getattr(shapes, "dim", None) is not None
        and value.numel() > 0
        and weights.numel() > 0
    )


def msda_patches(options: Any = None) -> Iterator[AtomicPatch]:
    source = _kernel_source.choose(OP, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE))
    note = _kernel_source.note(source)
    kernel = _mx_kernel if source == _kernel_source.MX_DRIVING else _portable_kernel
    yield AtomicPatch(
        f"{MODULE}:MultiScaleDeformableAttnFunction.apply",
        _function_apply(kernel),
        runtime_check=_apply_check,
        note=note,
    )
    if source == _kernel_source.MX_DRIVING:
        yield AtomicPatch(
            f"{MODULE}:multi_scale_deformable_attn_pytorch",
            _pytorch_path,
            runtime_check=_pytorch_check,
            note=note,
        )
