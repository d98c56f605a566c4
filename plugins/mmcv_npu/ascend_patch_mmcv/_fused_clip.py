"""The fused gradient clipping of torch_npu's fused optimizers, and when a call can use it.

torch_npu's fused optimizers (``torch_npu.optim.NpuFusedAdam``, ``NpuFusedSGD``, ...)
keep every gradient in one combined buffer and offer
``clip_grad_norm_fused_(max_norm, norm_type=2)``: one norm and one scaling over that
buffer, returning the total norm -- where torch's ``clip_grad_norm_`` works
parameter by parameter. It takes only those two arguments, so a clipping config
with others (``error_if_nonfinite``, ``foreach``) keeps torch's function.

Shared by :mod:`ascend_patch_mmcv.optimizer_hooks` (mmcv 1.x) and
:mod:`ascend_patch_mmcv.optimizer_wrapper` (mmengine).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any


__all__ = ["FUSED_CLIP_ARGUMENTS", "FUSED_CLIP_METHOD", "fused_norm_clip", "grads_to_clip"]

FUSED_CLIP_METHOD = "clip_grad_norm_fused_"
#: The arguments ``clip_grad_norm_fused_`` accepts.
FUSED_CLIP_ARGUMENTS = frozenset({"max_norm", "norm_type"})


def fused_norm_clip(
    optimizer: Any, clip_kwargs: Mapping[str, Any] | None
) -> Callable[..., Any] | None:
    """``optimizer.clip_grad_norm_fused_`` if it can serve ``clip_kwargs``, else None.

    It can when the optimizer has it and the config names ``max_norm`` (torch's
    function requires it too) and nothing the fused method does not take.
    """
    clip = getattr(optimizer, FUSED_CLIP_METHOD, None)
    if not callable(clip) or not clip_kwargs or "max_norm" not in clip_kwargs:
        return None
    if not set(clip_kwargs) <= FUSED_CLIP_ARGUMENTS:
        return None
    return clip


def grads_to_clip(params: Iterable[Any]) -> bool:
    """Whether any parameter has a gradient to clip (OpenMMLab clips and logs nothing otherwise)."""
    return any(p.requires_grad and p.grad is not None for p in params)
