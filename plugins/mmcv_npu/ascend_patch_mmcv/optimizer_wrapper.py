"""OptimizerWrapper: mmengine's ``OptimWrapper`` clips by norm with the optimizer's fused clipping.

mmengine 0.10.x clips in ``OptimWrapper._clip_grad()`` (called by ``step`` when
``clip_grad`` is configured; ``AmpOptimWrapper`` inherits it): it collects the
optimizer's parameters that have a gradient, calls ``self.clip_func(params,
**self.clip_grad_kwargs)`` -- torch's ``clip_grad_norm_`` for ``type='norm'`` (the
default) -- and logs the result as ``train/grad_norm`` in the message hub.

When the wrapped optimizer offers ``clip_grad_norm_fused_`` (torch_npu's fused
optimizers; see :mod:`ascend_patch_mmcv._fused_clip`) and the wrapper clips by norm
with arguments the fused method takes, the replacement calls it instead, and logs
the norm it returns. Otherwise -- another optimizer, ``type='value'``, a config
with ``error_if_nonfinite`` or ``foreach`` -- mmengine's original runs.

(The DrivingSDK patcher set ``self.clip_grads`` after ``__init__``: an attribute
mmengine never reads, so its patch changed nothing. Replacing the method, rather
than setting ``clip_func`` on each instance, also keeps the patch reversible: a
wrapper built while the patch was applied clips the original way after ``revert()``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from ._fused_clip import fused_norm_clip
from ._fused_clip import grads_to_clip


__all__ = ["TARGET", "clip_grad_fused", "optimizer_wrapper_patches", "uses_fused_clip"]

TARGET = "mmengine.optim.optimizer.optimizer_wrapper:OptimWrapper._clip_grad"


def _fused_clip(wrapper: Any) -> Any:
    # grad_name is mmengine's record of the clip type: 'grad_norm' for type='norm'.
    if getattr(wrapper, "grad_name", None) != "grad_norm":
        return None
    return fused_norm_clip(wrapper.optimizer, getattr(wrapper, "clip_grad_kwargs", None))


def uses_fused_clip(wrapper: Any) -> bool:
    """``runtime_check``: norm clipping, and a fused clipping on the optimizer that fits it."""
    return _fused_clip(wrapper) is not None


def clip_grad_fused(wrapper: Any) -> None:
    """``OptimWrapper._clip_grad`` through ``optimizer.clip_grad_norm_fused_``."""
    params = [p for group in wrapper.optimizer.param_groups for p in group["params"]]
    if not grads_to_clip(params):
        return  # as mmengine: no gradient, nothing clipped, nothing logged
    clip = _fused_clip(wrapper)
    if clip is None:  # called outside the runtime check, with nothing fused to call
        raise RuntimeError(
            "clip_grad_fused: the wrapper does not clip by norm, or its optimizer has no "
            "clip_grad_norm_fused_ that takes these clip_grad arguments"
        )
    grad_norm = clip(**wrapper.clip_grad_kwargs)
    wrapper.message_hub.update_scalar(f"train/{wrapper.grad_name}", float(grad_norm))


def optimizer_wrapper_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.OptimizerWrapper`."""
    yield AtomicPatch(
        TARGET,
        clip_grad_fused,
        runtime_check=uses_fused_clip,
        note="optimizer's clip_grad_norm_fused_ when it has one",
    )
