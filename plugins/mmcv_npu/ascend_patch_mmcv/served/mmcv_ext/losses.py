"""``mmcv._ext`` focal losses: sigmoid and softmax, forward and backward.

mmcv 2.1.0's ``mmcv/ops/focal_loss.py`` allocates the outputs and reduces them;
these functions compute its kernels' element-wise formulas (mmcv has CUDA, MLU and
NPU kernels, no CPU one; these follow the CUDA kernels, in the same order of
operations):

* sigmoid, with ``p = sigmoid(x)``: ``-alpha (1-p)^gamma log(max(p, FLT_MIN))`` at the
  target class, ``-(1-alpha) p^gamma log(max(1-p, FLT_MIN))`` elsewhere; the backward
  writes the derivative of each element by its logit.
* softmax, on the probabilities mmcv's Python computed: ``-alpha (1-p_t)^gamma
  log(max(p_t, FLT_MIN))`` per row; the backward writes mmcv's ``buff`` (the
  derivative by ``log p_t``) and the gradient of each row's loss by the logits.

A non-empty ``weight [C]`` scales row ``n`` by ``weight[target[n]]`` (mmcv's CUDA
kernels; its NPU build broadcasts the weight over the classes instead). Where the
CUDA kernels read out of range, these choose: a sigmoid target ``C`` (background)
leaves its row unweighted, as DrivingSDK's kernel does; a softmax target outside
``[0, C)`` gives a zero loss and gradient (CUDA's kernel does so for negative ones).
Half precision is computed in float32 (``FLT_MIN`` is 0 in half) and written back.

On NPU tensors the sigmoid loss runs ``mx_driving.sigmoid_focal_loss`` (reduction
``none``; its autograd gives the backward) when that kernel is chosen; the softmax
loss has no NPU kernel outside mmcv's own build and runs portable everywhere.
"""

from __future__ import annotations

from typing import Any

from ... import _kernel_source
from .registry import implements


__all__ = [
    "sigmoid_focal_loss_backward",
    "sigmoid_focal_loss_forward",
    "softmax_focal_loss_backward",
    "softmax_focal_loss_forward",
]

OP = "sigmoid_focal_loss"
_FLT_MIN = 1.1754943508222875e-38


def _on_npu(*tensors: Any) -> bool:
    return all(getattr(t, "is_npu", False) is True for t in tensors)


def _wide(dtype: Any) -> Any:
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_weight(weight: Any, target: Any, classes: int, dtype: Any) -> Any:
    """``weight[target]`` per row, 1 where the target is not a class (or no weight)."""
    import torch

    if weight is None or weight.numel() == 0:
        return None
    known = (target >= 0) & (target < classes)
    picked = weight.to(dtype)[target.clamp(0, max(classes - 1, 0))]
    return torch.where(known, picked, 1.0).unsqueeze(1)


def _use_mx(input: Any, target: Any) -> bool:
    if not _on_npu(input, target):
        return False
    source = _kernel_source.choose(OP, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE))
    return source == _kernel_source.MX_DRIVING


def _mx_loss(input: Any, target: Any, weight: Any, gamma: float, alpha: float) -> Any:
    weight = weight if weight is not None and weight.numel() else None
    return _kernel_source.mx_driving().sigmoid_focal_loss(
        input, target, float(gamma), float(alpha), weight, "none"
    )


def _sigmoid_parts(input: Any, target: Any) -> tuple[Any, Any]:
    import torch

    x = input.to(_wide(input.dtype))
    classes = torch.arange(x.shape[1], device=x.device)
    return x, target.view(-1, 1) == classes


@implements("sigmoid_focal_loss_forward", npu="mx_driving sigmoid_focal_loss")
def sigmoid_focal_loss_forward(
    input: Any, target: Any, weight: Any, output: Any, gamma: float, alpha: float
) -> None:
    """Writes the element-wise loss ``[N, C]`` of logits ``input`` into ``output``."""
    import torch

    if input.numel() == 0:
        return
    if _use_mx(input, target):
        output.copy_(_mx_loss(input, target, weight, gamma, alpha))
        return
    x, positive = _sigmoid_parts(input, target)
    p = torch.sigmoid(x)
    term_p = torch.pow(1 - p, gamma) * torch.log(p.clamp(min=_FLT_MIN))
    term_n = torch.pow(p, gamma) * torch.log((1 - p).clamp(min=_FLT_MIN))
    loss = torch.where(positive, -alpha * term_p, -(1 - alpha) * term_n)
    scale = _row_weight(weight, target, x.shape[1], x.dtype)
    output.copy_(loss if scale is None else loss * scale)


@implements("sigmoid_focal_loss_backward", npu="mx_driving sigmoid_focal_loss")
def sigmoid_focal_loss_backward(
    input: Any, target: Any, weight: Any, grad_input: Any, gamma: float, alpha: float
) -> None:
    """Writes each element's derivative by its logit into ``grad_input [N, C]``."""
    import torch

    if input.numel() == 0:
        return
    if _use_mx(input, target):
        leaf = input.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = _mx_loss(leaf, target, weight, gamma, alpha)
        (found,) = torch.autograd.grad(loss, leaf, torch.ones_like(loss))
        grad_input.copy_(found)
        return
    x, positive = _sigmoid_parts(input, target)
    p = torch.sigmoid(x)
    term_p = torch.pow(1 - p, gamma) * (1 - p - gamma * p * torch.log(p.clamp(min=_FLT_MIN)))
    term_n = torch.pow(p, gamma) * (gamma * (1 - p) * torch.log((1 - p).clamp(min=_FLT_MIN)) - p)
    grad = torch.where(positive, -alpha * term_p, -(1 - alpha) * term_n)
    scale = _row_weight(weight, target, x.shape[1], x.dtype)
    grad_input.copy_(grad if scale is None else grad * scale)


def _softmax_parts(input: Any, target: Any) -> tuple[Any, Any, Any]:
    """Probabilities in a wide dtype, ``p_t`` per row and whether the target is a class."""
    probabilities = input.to(_wide(input.dtype))
    classes = probabilities.shape[1]
    known = (target >= 0) & (target < classes)
    picked = probabilities.gather(1, target.clamp(0, max(classes - 1, 0)).view(-1, 1)).squeeze(1)
    return probabilities, picked, known


@implements("softmax_focal_loss_forward")
def softmax_focal_loss_forward(
    input: Any, target: Any, weight: Any, output: Any, gamma: float, alpha: float
) -> None:
    """Writes each row's loss ``[N]`` from the softmax probabilities ``input [N, C]``."""
    import torch

    if input.numel() == 0:
        return
    probabilities, pred, known = _softmax_parts(input, target)
    loss = -alpha * torch.pow(1 - pred, gamma) * torch.log(pred.clamp(min=_FLT_MIN))
    scale = _row_weight(weight, target, probabilities.shape[1], probabilities.dtype)
    if scale is not None:
        loss = loss * scale.squeeze(1)
    output.copy_(torch.where(known, loss, 0.0))


@implements("softmax_focal_loss_backward")
def softmax_focal_loss_backward(
    input: Any, target: Any, weight: Any, buff: Any, grad_input: Any, gamma: float, alpha: float
) -> None:
    """Writes ``buff [N]`` and each row loss's gradient by the logits into ``grad_input``."""
    import torch

    if input.numel() == 0:
        return
    probabilities, pred, known = _softmax_parts(input, target)
    log_pred = torch.log(pred.clamp(min=_FLT_MIN))
    factor = alpha * (
        -torch.pow(1 - pred, gamma) + gamma * torch.pow(1 - pred, gamma - 1) * pred * log_pred
    )
    scale = _row_weight(weight, target, probabilities.shape[1], probabilities.dtype)
    if scale is not None:
        factor = factor * scale.squeeze(1)
    factor = torch.where(known, factor, 0.0)
    buff.copy_(factor)
    classes = torch.arange(probabilities.shape[1], device=probabilities.device)
    flag = (target.view(-1, 1) == classes).to(probabilities.dtype)
    grad_input.copy_(factor.unsqueeze(1) * (flag - probabilities))
