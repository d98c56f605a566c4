"""SigmoidFocalLoss: mmcv's sigmoid focal loss on DrivingSDK's NPU kernel.

``mmcv.ops.sigmoid_focal_loss`` (``SigmoidFocalLossFunction.apply``) is what mmdet's
``FocalLoss`` calls for accelerator tensors (mmdet 3.x checks ``pred.is_cuda``, which
is true for NPU tensors under ``transfer_to_npu`` and the torch plugin). mmcv's NPU
builds have a kernel for it; ``mx_driving.sigmoid_focal_loss`` takes the same
arguments (logits ``[N, C]``, long targets ``[N]`` where ``C`` means background,
gamma, alpha, per-class weight, reduction) and is used when it is there.

Kernel (:mod:`ascend_patch_mmcv._kernel_source`, op ``sigmoid_focal_loss``):
``mx_driving`` only. Without it the group installs nothing and mmcv's own kernel
runs: on an NPU box, mmcv's NPU build has one, and a portable formula would be
slower than it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from . import _kernel_source


__all__ = ["OP", "sigmoid_focal_loss_patches"]

MODULE = "mmcv.ops.focal_loss"
OP = "sigmoid_focal_loss"


def _on_npu(tensor: Any) -> bool:
    return getattr(tensor, "is_npu", False) is True


def sigmoid_focal_loss(
    input: Any,
    target: Any,
    gamma: float = 2.0,
    alpha: float = 0.25,
    weight: Any = None,
    reduction: str = "mean",
) -> Any:
    """mmcv's ``sigmoid_focal_loss`` arguments, on ``mx_driving.sigmoid_focal_loss``."""
    return _kernel_source.mx_driving().sigmoid_focal_loss(
        input, target, gamma, alpha, weight, reduction
    )


def _check(input: Any, target: Any, *rest: Any, **kwargs: Any) -> bool:
    return _on_npu(input) and input.dim() == 2 and input.shape[0] > 0


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    return sigmoid_focal_loss(*args, **kwargs)


def sigmoid_focal_loss_patches(options: Any = None) -> Iterator[AtomicPatch]:
    source = _kernel_source.choose(OP, (_kernel_source.MX_DRIVING,))
    if source != _kernel_source.MX_DRIVING:
        return
    note = _kernel_source.note(source)
    yield AtomicPatch(
        f"{MODULE}:SigmoidFocalLossFunction.apply",
        _apply,
        runtime_check=lambda cls, *args, **kwargs: _check(*args, **kwargs),
        note=note,
    )
    yield AtomicPatch(
        f"{MODULE}:sigmoid_focal_loss",
        sigmoid_focal_loss,
        aliases="mmcv.ops:sigmoid_focal_loss",
        runtime_check=_check,
        note=note,
    )
