"""``sigmoid_focal_loss`` (mmcv's sigmoid focal loss, the wheel's arguments).

``sigmoid_focal_loss(logit [N, C], target [N] int64, gamma=2.0, alpha=0.25,
weight=None, reduction="mean")``: with ``p = sigmoid(logit[n, c])`` and ``t = 1`` when
``target[n] == c`` (a target of ``C`` is background: every class 0), each element is
``-alpha (1 - p)^gamma log p`` where ``t = 1`` and ``-(1 - alpha) p^gamma log(1 - p)``
elsewhere; a ``weight [C]`` multiplies row ``n`` by ``weight[target[n]]`` (rows with
the background target are left as they are: indexing the weight with ``C`` is out of
its range). ``reduction``: ``"none"`` gives ``[N, C]``, ``"sum"`` the sum, ``"mean"``
the sum divided by ``N``, as the wheel divides. Computed in float32 (float64 stays),
returned in ``logit``'s dtype; the gradient (to ``logit`` only) is the derivative of
this formula. The argument checks are the wheel's (``RuntimeError`` here).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import MxFunction
from . import applier


__all__ = ["PUBLIC", "SigmoidFocalLossFunction", "focal_loss"]

_REDUCTIONS = ("none", "mean", "sum")


def _check(logit: Any, target: Any, weight: Any, reduction: str) -> None:
    problems = []
    if target.dtype != torch.long:
        problems.append("target must be int64")
    if logit.dim() != 2 or target.dim() != 1 or logit.size(0) != target.size(0):
        problems.append("logit must be [N, C] and target [N]")
    if weight is not None and (weight.dim() != 1 or weight.size(0) != logit.size(1)):
        problems.append("weight must be [C]")
    if reduction not in _REDUCTIONS:
        problems.append("reduction must be 'none', 'mean' or 'sum'")
    if problems:
        raise RuntimeError(f"sigmoid_focal_loss: {'; '.join(problems)}")


def focal_loss(
    logit: Any, target: Any, gamma: float, alpha: float, weight: Any, reduction: str
) -> Any:
    """The forward formula, differentiable in ``logit``."""
    wide = torch.float64 if logit.dtype == torch.float64 else torch.float32
    x = logit.to(wide)
    classes = torch.arange(x.shape[1]).view(1, -1)
    positive = target.view(-1, 1) == classes
    p = torch.sigmoid(x)
    loss = torch.where(
        positive,
        -alpha * (1 - p).pow(gamma) * F.logsigmoid(x),
        -(1 - alpha) * p.pow(gamma) * F.logsigmoid(-x),
    )
    if weight is not None:
        foreground = target < x.shape[1]
        scale = torch.ones(x.shape[0], dtype=wide)
        scale[foreground] = weight.to(wide)[target[foreground]]
        loss = loss * scale.view(-1, 1)
    if reduction == "mean":
        loss = loss.sum() / x.shape[0]
    elif reduction == "sum":
        loss = loss.sum()
    return loss.to(logit.dtype)


class SigmoidFocalLossFunction(MxFunction):
    """The Function behind ``mx_driving.sigmoid_focal_loss``."""

    @staticmethod
    def forward(
        ctx: Any,
        logit: Any,
        target: Any,
        gamma: float = 2.0,
        alpha: float = 0.25,
        weight: Any = None,
        reduction: str = "mean",
    ) -> Any:
        _check(logit, target, weight, reduction)
        ctx.settings = (float(gamma), float(alpha), reduction)
        ctx.save_for_backward(logit, target, weight)
        return focal_loss(logit, target, float(gamma), float(alpha), weight, reduction)

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> tuple[Any, ...]:
        logit, target, weight = ctx.saved_tensors
        gamma, alpha, reduction = ctx.settings
        leaf = logit.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = focal_loss(leaf, target, gamma, alpha, weight, reduction)
        (grad,) = torch.autograd.grad(loss, leaf, grad_output)
        return grad, None, None, None, None, None


PUBLIC = {"sigmoid_focal_loss": applier("sigmoid_focal_loss", SigmoidFocalLossFunction)}
