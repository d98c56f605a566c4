"""IoU losses on column boxes: ``npu_giou``, ``npu_ciou`` and their explicit backwards.

Both take boxes as columns, ``[4, n]``: ``(cx, cy, w, h)`` with ``trans=True``, else
``(x1, y1, x2, y2)``. Half inputs are computed in float32 and returned as half, as
op-plugin casts them.

* ``npu_giou``: ``iou - (enclose - union) / enclose`` with ``union = a1 + a2 - inter
  + 1e-16``; op-plugin accepts only ``trans=True, is_cross=False, mode=0`` (its
  "giou backward only support ..." check runs in the forward too) and returns
  ``[n, 1]`` (the op's ``[1, n]`` permuted).
* ``npu_ciou``: ``iou - (rho² / c² + alpha * v)`` with ``eps = 1e-9`` as in
  torch_npu's own golden (``h + eps`` in the aspect term, ``union + eps``,
  ``c² + eps``), ``v = 4/pi² (atan(w2/h2) - atan(w1/h1))²`` and ``alpha = v / (1 + eps
  - iou + v)`` held constant for the gradient; ``[1, n]`` (``[m, n]`` with
  ``is_cross``). ``mode=1`` (IoF) is not emulated.

The backwards (``npu_giou_backward``, ``npu_ciou_backward``) return ``(dbboxes,
dgtboxes)``, the gradient of the forward formula (``atan_sub`` is recomputed).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import kernel
from . import recording


_GIOU_ONLY = (
    "giou backward only support trans==True, is_cross==False, mode==0('iou') current version "
    "if you need to back propagation, please ensure your parameter is correct!"
)


def _corners(boxes: Any, trans: bool) -> tuple[Any, Any, Any, Any]:
    if trans:
        cx, cy, w, h = boxes
        return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    x1, y1, x2, y2 = boxes
    return x1, y1, x2, y2


def _columns(op: str, boxes: Any, gtboxes: Any) -> tuple[Any, Any]:
    for name, value in (("self", boxes), ("gtboxes", gtboxes)):
        if value.dim() != 2 or value.shape[0] != 4:
            raise RuntimeError(f"{op} expected {name} as [4, n] boxes, got {tuple(value.shape)}")
    wide = torch.float64 if boxes.dtype == torch.float64 else torch.float32
    return boxes.to(wide), gtboxes.to(wide)


def _result_dtype(boxes: Any, gtboxes: Any, value: Any) -> Any:
    if torch.float16 in (boxes.dtype, gtboxes.dtype):
        return value.to(torch.float16)
    return value.to(boxes.dtype)


def _giou_formula(boxes: Any, gtboxes: Any) -> Any:
    a_x1, a_y1, a_x2, a_y2 = _corners(boxes, True)
    b_x1, b_y1, b_x2, b_y2 = _corners(gtboxes, True)
    inter = (torch.minimum(a_x2, b_x2) - torch.maximum(a_x1, b_x1)).clamp(min=0) * (
        torch.minimum(a_y2, b_y2) - torch.maximum(a_y1, b_y1)
    ).clamp(min=0)
    outer = (torch.maximum(a_x2, b_x2) - torch.minimum(a_x1, b_x1)).abs() * (
        torch.maximum(a_y2, b_y2) - torch.minimum(a_y1, b_y1)
    ).abs()
    union = (a_x2 - a_x1) * (a_y2 - a_y1) + (b_x2 - b_x1) * (b_y2 - b_y1) - inter + 1e-16
    return inter / union - (outer - union) / outer


@kernel("npu_giou", differentiable=True)
def giou(
    self: Any, gtboxes: Any, trans: bool = False, is_cross: bool = False, mode: int = 0
) -> Any:
    if not (trans and not is_cross and mode == 0):
        raise RuntimeError(_GIOU_ONLY)
    boxes, gt = _columns("npu_giou", self, gtboxes)
    if boxes.shape != gt.shape:
        raise RuntimeError(
            f"npu_giou: with is_cross=False self {tuple(self.shape)} and gtboxes "
            f"{tuple(gtboxes.shape)} must have the same shape"
        )
    return _result_dtype(self, gtboxes, _giou_formula(boxes, gt).unsqueeze(1))


_EPS = 1e-9


def _ciou_formula(boxes: Any, gtboxes: Any, trans: bool) -> Any:
    """Pairwise-broadcast CIoU of ``boxes`` and ``gtboxes`` (columns, broadcastable)."""
    a_x1, a_y1, a_x2, a_y2 = _corners(boxes, trans)
    b_x1, b_y1, b_x2, b_y2 = _corners(gtboxes, trans)
    inter = (torch.minimum(a_x2, b_x2) - torch.maximum(a_x1, b_x1)).clamp(min=0) * (
        torch.minimum(a_y2, b_y2) - torch.maximum(a_y1, b_y1)
    ).clamp(min=0)
    w1, h1 = a_x2 - a_x1, a_y2 - a_y1 + _EPS
    w2, h2 = b_x2 - b_x1, b_y2 - b_y1 + _EPS
    iou = inter / (w1 * h1 + w2 * h2 - inter + _EPS)
    cw = torch.maximum(a_x2, b_x2) - torch.minimum(a_x1, b_x1)
    ch = torch.maximum(a_y2, b_y2) - torch.minimum(a_y1, b_y1)
    c2 = cw**2 + ch**2 + _EPS
    rho2 = ((b_x1 + b_x2 - a_x1 - a_x2) ** 2 + (b_y1 + b_y2 - a_y1 - a_y2) ** 2) / 4
    v = (4 / math.pi**2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)) ** 2
    alpha = (v / ((1 + _EPS) - iou + v)).detach()
    return iou - (rho2 / c2 + v * alpha)


@kernel("npu_ciou", differentiable=True)
def ciou(
    self: Any,
    gtboxes: Any,
    trans: bool = False,
    is_cross: bool = True,
    mode: int = 0,
    atan_sub_flag: bool = False,
) -> Any:
    if mode != 0:
        raise RuntimeError(f"npu_ciou: mode {mode} (IoF) is not emulated (mode 0, IoU, is)")
    boxes, gt = _columns("npu_ciou", self, gtboxes)
    if is_cross:
        # [m, n]: every gt box (rows) against every box (columns).
        value = _ciou_formula(boxes[:, None, :], gt[:, :, None], trans)
    else:
        if boxes.shape != gt.shape:
            raise RuntimeError(
                f"npu_ciou: with is_cross=False self {tuple(self.shape)} and gtboxes "
                f"{tuple(gtboxes.shape)} must have the same shape"
            )
        value = _ciou_formula(boxes, gt, trans).unsqueeze(0)
    return _result_dtype(self, gtboxes, value)


def _box_grads(forward: Any, grad: Any, bboxes: Any, gtboxes: Any) -> tuple[Any, Any]:
    with recording():
        a = bboxes.detach().requires_grad_(True)
        b = gtboxes.detach().requires_grad_(True)
        out = forward(a, b)
        da, db = torch.autograd.grad(out, (a, b), grad.to(out.dtype).reshape(out.shape))
    return da.to(bboxes.dtype), db.to(gtboxes.dtype)


@kernel("npu_giou_backward")
def giou_backward(
    grad: Any, bboxes: Any, gtboxes: Any, trans: bool = False, is_cross: bool = False, mode: int = 0
) -> tuple[Any, Any]:
    return _box_grads(lambda a, b: giou(a, b, trans, is_cross, mode), grad, bboxes, gtboxes)


@kernel("npu_ciou_backward")
def ciou_backward(
    grad: Any,
    bboxes: Any,
    gtboxes: Any,
    atan_sub: Any = None,
    trans: bool = False,
    is_cross: bool = True,
    mode: int = 0,
) -> tuple[Any, Any]:
    return _box_grads(lambda a, b: ciou(a, b, trans, is_cross, mode), grad, bboxes, gtboxes)
