"""``mmcv._ext`` rotated boxes: ``box_iou_rotated`` and ``nms_rotated`` in portable PyTorch.

Boxes are ``(x_center, y_center, width, height, angle)``, the angle in radians, as
mmcv's Python hands them over (its wrappers have already turned counter-clockwise
angles into clockwise ones). The semantics are those of mmcv 2.1.0's compiled CPU
kernels (box_iou_rotated_utils.hpp, shared with its CUDA kernels):

- The overlap of a pair is computed about the midpoint of the two centres (shifted in
  double, then float32). Corners come from ``cos``/``sin`` of the angle in double,
  rounded to float32. The intersection polygon's points are the edge crossings
  (parameters ``t1, t2`` in ``[0, 1]``, nearly parallel edges, ``|det| <= 1e-14``,
  skipped) and the corners of each box lying inside the other (projections onto two
  edges, bounds included); with two points or fewer the overlap is 0. mmcv orders
  the points by a Graham scan and sums a fan of triangles from the lowest point; here
  they are sorted by angle about their mean and fanned from that same point: the same
  convex polygon and triangles, so exact cases round alike. Both keep mmcv's float32
  arithmetic, so where edges nearly coincide (angles such as pi/2 or 2 pi, which
  float32 does not hold exactly) both can miss crossings as mmcv does (measured:
  iof 1/3 from both where the exact value is 2/3). Where mmcv's scan, which compares
  cross products with an absolute 1e-6, leaves near-collinear points out of order, its
  area is wrong and the portable one is not (measured: mmcv 0.6 where a box lies
  inside another and the IoU is 1/3; 2e-5 to 4e-5 off in other near-degenerate pairs).
- A box with area ``w * h < 1e-14`` overlaps nothing (IoU 0). ``mode_flag`` 0 divides
  by the union, 1 by the first box's area (iof), any other value returns the
  intersection area itself. ``aligned`` compares ``boxes1[i]`` with ``boxes2[i]``;
  otherwise every pair, written row-major into the flat ``ious``.
- ``nms_rotated`` is greedy over ``scores.sort(0, descending=True)`` (mmcv's CPU
  kernel recomputes that order; ``order`` and ``dets_sorted`` only serve its CUDA
  kernel): a box is dropped when its IoU with a kept, better box is ``>=
  iou_threshold`` (the CPU kernel; mmcv's CUDA kernel uses ``>``). Labels do not
  separate boxes: with ``multi_label`` ``dets`` carries the label as a sixth column
  and both of mmcv's CPU and CUDA kernels read only the first five values.

Vectorised over box pairs: pairs whose circumscribed circles are apart are never built
(their overlap is 0, as mmcv's), the rest go through the polygon code in chunks. NMS
walks the score-sorted boxes once over the list of suppressing pairs (the greedy
definition; each decision depends on the earlier ones), as ``iou3d``'s NMS does.

On tensors of device type ``npu`` mmcv's wrappers first turn the angles into degrees
(for mmcv's own NPU kernels, ``RotatedIou`` / ``RotatedNMS``); these functions turn
them back (on the same test, so the emulator's NPU tensors, which report ``cpu``,
pass radians both ways) and run the portable code on the device. torch_npu's
``npu_rotated_iou`` / ``npu_nms_rotated`` and mx_driving's rotated ops are those device
kernels; their results were never compared with mmcv's CPU kernel (no NPU here, and the
emulator has no kernel for them), so they are not used.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .iou3d import _candidates
from .iou3d import _greedy
from .registry import implements


__all__ = ["box_iou_rotated", "nms_rotated"]

#: Box pairs per chunk of the polygon computation (24 points of 2 floats each).
_PAIRS_PER_CHUNK = 1 << 16
#: mmcv's Python scales NPU angles by these before calling ``_ext`` (radians -> degrees).
_NMS_DEGREES = 57.29578
_IOU_DEGREES = 1.0 / 0.01745329252


def _angles_in_degrees(tensor: Tensor) -> bool:
    """mmcv's wrappers' own test for their NPU branch, which hands angles over in degrees.

    Not ``is_npu``: the emulator's NPU tensors report device ``cpu``, so mmcv's wrappers
    take their CPU branch there and pass radians.
    """
    return tensor.device.type == "npu"


def _from_degrees(boxes: Tensor, per_radian: float) -> Tensor:
    """The boxes with their angle (column 4) turned back from degrees into radians."""
    boxes = boxes.clone()
    boxes[:, 4] /= per_radian
    return boxes


def _vertices(x: Tensor, y: Tensor, w: Tensor, h: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """Corner planes ``x, y [4, P]`` in mmcv's order and float arithmetic."""
    theta = a.double()
    cos2 = torch.cos(theta).to(x.dtype) * 0.5
    sin2 = torch.sin(theta).to(x.dtype) * 0.5
    x0 = x - sin2 * h - cos2 * w
    y0 = y + cos2 * h - sin2 * w
    x1 = x + sin2 * h - cos2 * w
    y1 = y - cos2 * h - sin2 * w
    return (
        torch.stack((x0, x1, 2 * x - x0, 2 * x - x1)),
        torch.stack((y0, y1, 2 * y - y0, 2 * y - y1)),
    )


def _crossings(ax: Tensor, ay: Tensor, bx: Tensor, by: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Crossings of edge ``i`` of ``a`` with edge ``j`` of ``b``: ``x, y, valid [16, P]``."""
    vax, vay = (ax.roll(-1, 0) - ax)[:, None], (ay.roll(-1, 0) - ay)[:, None]  # [4, 1, P]
    vbx, vby = (bx.roll(-1, 0) - bx)[None], (by.roll(-1, 0) - by)[None]  # [1, 4, P]
    det = vbx * vay - vax * vby  # cross(vec2[j], vec1[i])
    dx, dy = bx[None] - ax[:, None], by[None] - ay[:, None]  # pts2[j] - pts1[i]
    general = det.abs() > 1e-14
    safe = torch.where(general, det, torch.ones_like(det))
    t1 = (vbx * dy - dx * vby) / safe
    t2 = (vax * dy - dx * vay) / safe
    valid = general & (t1 >= 0) & (t1 <= 1) & (t2 >= 0) & (t2 <= 1)
    x = ax[:, None] + vax * t1
    y = ay[:, None] + vay * t1
    pairs = ax.shape[1]
    return x.reshape(16, pairs), y.reshape(16, pairs), valid.reshape(16, pairs)


def _inside(px: Tensor, py: Tensor, qx: Tensor, qy: Tensor) -> Tensor:
    """``[4, P]``: corner ``p`` inside rectangle ``q`` (projections on two edges, bounds in)."""
    abx, aby = qx[1] - qx[0], qy[1] - qy[0]  # vec[0]
    dax, day = qx[0] - qx[3], qy[0] - qy[3]  # vec[3]
    apx, apy = px - qx[0], py - qy[0]
    along_ab = apx * abx + apy * aby
    along_ad = -(apx * dax + apy * day)
    return (
        (along_ab >= 0)
        & (along_ad >= 0)
        & (along_ab <= abx * abx + aby * aby)
        & (along_ad <= dax * dax + day * day)
    )


def _pair_ious(first: Tensor, second: Tensor, mode_flag: int) -> Tensor:
    """IoU (or iof, or intersection) of box pairs ``first[p]``, ``second[p]`` ``[P, 5]``."""
    dtype = first.dtype
    shift_x = (first[:, 0].double() + second[:, 0].double()) / 2
    shift_y = (first[:, 1].double() + second[:, 1].double()) / 2
    boxes = []
    for box in (first, second):
        x = (box[:, 0].double() - shift_x).to(dtype)
        y = (box[:, 1].double() - shift_y).to(dtype)
        boxes.append(_vertices(x, y, box[:, 2], box[:, 3], box[:, 4]))
    (ax, ay), (bx, by) = boxes
    cross_x, cross_y, cross_valid = _crossings(ax, ay, bx, by)
    x = torch.cat((cross_x, ax, bx))  # [24, P]
    y = torch.cat((cross_y, ay, by))
    valid = torch.cat((cross_valid, _inside(ax, ay, bx, by), _inside(bx, by, ax, ay)))
    count = valid.sum(0)
    weight = valid.to(dtype)
    divisor = count.clamp(min=1).to(dtype)
    centre_x, centre_y = (x * weight).sum(0) / divisor, (y * weight).sum(0) / divisor
    angle = torch.atan2(y - centre_y, x - centre_x)
    angle = torch.where(valid, angle, torch.full_like(angle, float("inf")))
    order = torch.sort(angle.t().contiguous(), dim=1, stable=True).indices.t()
    x, y, valid = x.gather(0, order), y.gather(0, order), valid.gather(0, order)
    # Fan from mmcv's starting point (lowest y, then lowest x), as its Graham scan does:
    # the same triangles, so exact cases (a box inside another) round as mmcv's do.
    lowest_y = torch.where(valid, y, torch.full_like(y, float("inf"))).amin(0)
    on_bottom = valid & (y == lowest_y)
    leftmost = torch.where(on_bottom, x, torch.full_like(x, float("inf"))).amin(0)
    start = (on_bottom & (x == leftmost)).to(torch.uint8).argmax(0)
    slot = torch.arange(x.shape[0], device=x.device)[:, None]
    turned = torch.where(slot < count, (slot + start) % count.clamp(min=1), slot)
    x, y, valid = x.gather(0, turned), y.gather(0, turned), valid.gather(0, turned)
    rel_x, rel_y = x - x[:1], y - y[:1]
    fan = rel_x[:-1] * rel_y[1:] - rel_y[:-1] * rel_x[1:]
    fan = torch.where(valid[1:], fan, torch.zeros_like(fan))
    inter = torch.where(count > 2, fan.sum(0).abs() / 2, torch.zeros_like(centre_x))
    area1 = first[:, 2] * first[:, 3]
    area2 = second[:, 2] * second[:, 3]
    if mode_flag == 0:
        result = inter / (area1 + area2 - inter)
    elif mode_flag == 1:
        result = inter / area1
    else:
        result = inter
    degenerate = (area1 < 1e-14) | (area2 < 1e-14)
    return torch.where(degenerate, torch.zeros_like(result), result)


def _ious_at(first: Tensor, second: Tensor, pairs: Tensor, mode_flag: int) -> Tensor:
    parts = [
        _pair_ious(
            first[pairs[0, s : s + _PAIRS_PER_CHUNK]],
            second[pairs[1, s : s + _PAIRS_PER_CHUNK]],
            mode_flag,
        )
        for s in range(0, pairs.shape[1], _PAIRS_PER_CHUNK)
    ]
    return torch.cat(parts) if parts else first.new_zeros(0)


def _as_bev(boxes: Tensor) -> Tensor:
    """``[N, 7]`` rows ``(x, y, 0, w, h, 0, 0)``: iou3d's candidate search reads sizes at 3, 4."""
    zeros = boxes.new_zeros(boxes.shape[0])
    return torch.stack((boxes[:, 0], boxes[:, 1], zeros, boxes[:, 2], boxes[:, 3], zeros, zeros), 1)


def _near_pairs(first: Tensor, second: Tensor, upper: bool) -> Tensor:
    """Index pairs whose boxes may overlap; pairs with a box of area < 1e-14 left out."""
    pairs = _candidates(_as_bev(first), _as_bev(second), upper)
    sound = (first[pairs[0], 2] * first[pairs[0], 3] >= 1e-14) & (
        second[pairs[1], 2] * second[pairs[1], 3] >= 1e-14
    )
    return pairs[:, sound]


@implements("box_iou_rotated")
def box_iou_rotated(
    boxes1: Tensor, boxes2: Tensor, ious: Tensor, mode_flag: int, aligned: bool
) -> None:
    """Write the rotated IoUs (``aligned``: ``[N]``; else ``[N * M]`` row-major) into ``ious``."""
    if boxes1.shape[0] == 0 or boxes2.shape[0] == 0 or ious.numel() == 0:
        return
    if _angles_in_degrees(boxes1):
        boxes1 = _from_degrees(boxes1, _IOU_DEGREES)
        boxes2 = _from_degrees(boxes2, _IOU_DEGREES)
    first, second = boxes1[:, :5].float(), boxes2[:, :5].float()  # mmcv's CPU kernel: float
    if aligned:
        count = ious.numel()
        index = torch.arange(count, device=first.device)
        result = _ious_at(first, second, torch.stack((index, index)), int(mode_flag))
    else:
        pairs = _near_pairs(first, second, upper=False)
        values = _ious_at(first, second, pairs, int(mode_flag))
        result = first.new_zeros(first.shape[0] * second.shape[0])
        result[pairs[0] * second.shape[0] + pairs[1]] = values
    ious.view(-1).copy_(result.to(ious.dtype))


@implements("nms_rotated")
def nms_rotated(
    dets: Tensor,
    scores: Tensor,
    order: Tensor,
    dets_sorted: Tensor,
    labels: Tensor,
    iou_threshold: float,
    multi_label: int,
) -> Tensor:
    """Indices (int64) of the boxes greedy rotated NMS keeps, best score first."""
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    if _angles_in_degrees(dets):
        dets = _from_degrees(dets, _NMS_DEGREES)
    dtype = torch.float64 if dets.dtype == torch.float64 else torch.float32
    ranking = scores.sort(0, descending=True)[1]
    ranked = dets[ranking, :5].to(dtype)
    count = ranked.shape[0]
    # A C++ float compared with the kernel's scalar_t.
    threshold = torch.tensor(float(iou_threshold), dtype=torch.float32).to(dtype)
    if threshold <= 0:
        # Boxes apart (never built) have IoU 0, which passes: the best box drops all.
        return ranking[:1].clone()
    pairs = _near_pairs(ranked, ranked, upper=True)
    ious = _ious_at(ranked, ranked, pairs, 0)
    kept = _greedy(count, pairs, ious >= threshold.to(ious.device))
    return ranking[torch.tensor(kept, dtype=torch.long, device=ranking.device)]
