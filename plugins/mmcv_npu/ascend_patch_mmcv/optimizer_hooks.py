"""OptimizerHooks: mmcv 1.x's optimizer hooks clip with the optimizer's fused clipping.

mmcv 1.x clips gradients in one method, ``OptimizerHook.clip_grads(params)``, which
``GradientCumulativeOptimizerHook``, ``Fp16OptimizerHook`` and
``GradientCumulativeFp16OptimizerHook`` (and user subclasses) inherit. It calls
torch's ``clip_grad_norm_(params, **grad_clip)``. With a torch_npu fused optimizer
(``NpuFused*``, see :mod:`ascend_patch_mmcv._fused_clip`) the replacement calls
``runner.optimizer.clip_grad_norm_fused_(**grad_clip)`` instead; its total norm is
what the hook logs as ``grad_norm``. Any other optimizer, or a config the fused
method cannot take, runs the original.

The hook has no reference to the runner (nor to its optimizer), so a second patch
wraps ``BaseRunner.call_hook`` -- through which every runner calls every hook --
to make the runner calling the hooks known, in a context variable, for the duration
of that call. That wrapper changes nothing else; it is what lets one small
replacement of ``clip_grads`` serve every hook class, instead of copies of the four
hook classes as the DrivingSDK patcher had (whose copies called the fused method
unconditionally, so that ``grad_clip`` without a fused optimizer failed).

The fused method clips the gradients the optimizer holds (its parameter groups), not
the list the hook passes; both are the model's trainable parameters with a gradient
in the usual setup (an optimizer built from ``model.parameters()``).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from ._fused_clip import fused_norm_clip
from ._fused_clip import grads_to_clip


__all__ = [
    "CALL_HOOK_TARGET",
    "CLIP_TARGET",
    "clip_grads_fused",
    "current_runner",
    "optimizer_hook_patches",
    "uses_fused_clip",
    "with_runner_known",
]

CLIP_TARGET = "mmcv.runner.hooks.optimizer:OptimizerHook.clip_grads"
CALL_HOOK_TARGET = "mmcv.runner.base_runner:BaseRunner.call_hook"

_runner: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "ascend_patch_mmcv_hook_runner", default=None
)


def current_runner() -> Any:
    """The mmcv runner whose ``call_hook`` is running in this context, or None."""
    return _runner.get()


def with_runner_known(original: Callable[..., Any]) -> Callable[..., Any]:
    """``target_wrapper`` of ``BaseRunner.call_hook``: the runner is current while its hooks run."""

    @functools.wraps(original)
    def call_hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _runner.set(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _runner.reset(token)

    return call_hook


def _fused_clip(hook: Any) -> Callable[..., Any] | None:
    runner = _runner.get()
    if runner is None:
        return None
    return fused_norm_clip(getattr(runner, "optimizer", None), getattr(hook, "grad_clip", None))


def uses_fused_clip(hook: Any, params: Any) -> bool:
    """``runtime_check``: the runner's optimizer has a fused clipping that fits ``grad_clip``.

    ``params`` (often a generator) is left unread for the original.
    """
    return _fused_clip(hook) is not None


def clip_grads_fused(hook: Any, params: Any) -> Any:
    """``OptimizerHook.clip_grads`` through ``runner.optimizer.clip_grad_norm_fused_``."""
    if not grads_to_clip(params):
        return None  # as mmcv: no gradient, nothing clipped, no grad_norm logged
    clip = _fused_clip(hook)
    if clip is None:  # called outside the runtime check, with nothing fused to call
        raise RuntimeError(
            "clip_grads_fused: no runner's call_hook is running, or its optimizer has no "
            "clip_grad_norm_fused_ that takes this grad_clip"
        )
    return clip(**hook.grad_clip)


def optimizer_hook_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_mmcv.groups.OptimizerHooks`."""
    yield AtomicPatch(CALL_HOOK_TARGET, target_wrapper=with_runner_known)
    yield AtomicPatch(
        CLIP_TARGET,
        clip_grads_fused,
        runtime_check=uses_fused_clip,
        note="optimizer's clip_grad_norm_fused_ when it has one",
    )
