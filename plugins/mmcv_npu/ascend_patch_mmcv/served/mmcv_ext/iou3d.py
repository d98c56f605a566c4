"""``mmcv._ext`` 3D box overlaps: bird's-eye-view overlap areas, rotated and axis-aligned NMS.

Boxes are ``(x, y, z, dx, dy, dz, heading)``. Semantics are those of mmcv 2.1.0's CUDA
kernels (mmcv has no CPU kernel for these):

- ``iou3d_boxes_overlap_bev_forward`` writes the *area* of the intersection of the two
  rotated rectangles (not the IoU; mmcv's Python divides). The polygon is built as
  mmcv builds it: crossing points of the edges (strict crossings) and each corner
  lying inside the other box (with mmcv's 1e-2 margin), sorted by angle about their
  mean, area by a fan of triangles.
- ``iou3d_nms3d_forward`` is greedy NMS on boxes already sorted by score: a box is
  dropped when its BEV IoU (overlap / max(area_a + area_b - overlap, 1e-8)) with a
  kept, earlier box is above ``nms_overlap_thresh``. ``keep[:num_out]`` gets the kept
  positions in order, ``num_out`` their number. ``iou3d_nms3d_normal_forward`` is the
  same with axis-aligned rectangles (heading ignored).

Kernels: on NPU tensors ``mx_driving.boxes_overlap_bev`` / ``nms3d`` / ``nms3d_normal``
when chosen; otherwise portable PyTorch. The portable overlap is vectorised over box
pairs (pairs whose circumscribed circles are apart are never built; the rest go in
chunks); NMS builds the overlap matrix that way, then walks the boxes in score order
once, each kept box dropping its overlapping successors: the walk is the greedy
definition itself (each decision depends on the earlier ones) and costs O(boxes +
overlapping pairs) list operations.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _kernel_source
from .registry import implements


__all__ = ["iou3d_boxes_overlap_bev_forward", "iou3d_nms3d_forward", "iou3d_nms3d_normal_forward"]

_EPS = 1e-8
_MARGIN = 1e-2
#: Box pairs per chunk of the polygon computation (24 points of 2 floats each).
_PAIRS_PER_CHUNK = 1 << 16
#: Rows of box pairs per chunk of the candidate search.
_ROW_ELEMENTS = 1 << 22


def _on_npu(tensor: Any) -> bool:
    return getattr(tensor, "is_npu", False) is True


def _mx(op: str, name: str) -> Any:
    source = _kernel_source.choose(
        op, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE), mx_names=(name,)
    )
    return _kernel_source.mx_driving() if source == _kernel_source.MX_DRIVING else None


# The polygon code works on planes [k, P]: k points (corners, edges) of P box pairs, the
# pairs innermost, so every elementwise op runs over long contiguous rows.


def _corners(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Corner planes ``x, y [4, P]``, rotated about the centre as mmcv's kernel does."""
    cx, cy = boxes[:, 0], boxes[:, 1]
    half_x, half_y = boxes[:, 3] / 2, boxes[:, 4] / 2
    x = torch.stack((cx - half_x, cx + half_x, cx + half_x, cx - half_x))
    y = torch.stack((cy - half_y, cy - half_y, cy + half_y, cy + half_y))
    angle = boxes[:, 6].double()
    cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
    dx, dy = x - cx, y - cy
    return dx * cos - dy * sin + cx, dx * sin + dy * cos + cy


def _inside(boxes: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[4, P]``: corner ``(x, y)`` inside box ``p``, with mmcv's 1e-2 margin."""
    angle = -boxes[:, 6].double()
    cos, sin = torch.cos(angle).float(), torch.sin(angle).float()
    dx, dy = x - boxes[:, 0], y - boxes[:, 1]
    rot_x = dx * cos + dy * (-sin)
    rot_y = dx * sin + dy * cos
    return (rot_x.abs() < boxes[:, 3] / 2 + _MARGIN) & (rot_y.abs() < boxes[:, 4] / 2 + _MARGIN)


def _crossings(
    ax: torch.Tensor, ay: torch.Tensor, bx: torch.Tensor, by: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Edge crossings of the corner planes ``a``, ``b [4, P]``: ``x, y, valid [16, P]``.

    mmcv's ``intersection(p1, p0, q1, q0)`` for edge ``p0 -> p1`` of ``a`` against edge
    ``q0 -> q1`` of ``b``, its cross products built from the same coordinate
    differences (so the same floats), each difference computed once.
    """
    p0x, p0y = ax[:, None], ay[:, None]  # [4, 1, P]: edge i of a
    p1x, p1y = ax.roll(-1, 0)[:, None], ay.roll(-1, 0)[:, None]
    q0x, q0y = bx[None], by[None]  # [1, 4, P]: edge j of b
    q1x, q1y = bx.roll(-1, 0)[None], by.roll(-1, 0)[None]
    boxes_meet = (
        (torch.minimum(p0x, p1x) <= torch.maximum(q0x, q1x))
        & (torch.minimum(q0x, q1x) <= torch.maximum(p0x, p1x))
        & (torch.minimum(p0y, p1y) <= torch.maximum(q0y, q1y))
        & (torch.minimum(q0y, q1y) <= torch.maximum(p0y, p1y))
    )
    ex, ey = p1x - p0x, p1y - p0y  # edge of a
    fx, fy = q1x - q0x, q1y - q0y  # edge of b
    d0x, d0y = q0x - p0x, q0y - p0y  # [4, 4, P]
    d1x, d1y = q1x - p0x, q1y - p0y
    gx, gy = p1x - q0x, p1y - q0y
    s1 = d0x * ey - ex * d0y  # cross(q0, p1, p0)
    s2 = ex * d1y - d1x * ey  # cross(p1, q1, p0)
    s3 = (-d0x) * fy - fx * (-d0y)  # cross(p0, q1, q0)
    s4 = fx * gy - gx * fy  # cross(q1, p1, q0)
    s5 = -s2  # cross(q1, p1, p0): the same two products, subtracted the other way
    valid = boxes_meet & (s1 * s2 > 0) & (s3 * s4 > 0)
    general = (s5 - s1).abs() > _EPS
    denominator = torch.where(general, s5 - s1, torch.ones_like(s1))
    x = (s5 * q0x - s1 * q1x) / denominator
    y = (s5 * q0y - s1 * q1y) / denominator
    if not bool((general | ~valid).all()):
        # Nearly parallel: mmcv intersects the two lines in implicit form.
        a0, b0, c0 = p0y - p1y, ex, p0x * p1y - p1x * p0y
        a1, b1, c1 = q0y - q1y, fx, q0x * q1y - q1x * q0y
        d = a0 * b1 - a1 * b0
        d = torch.where(d == 0, torch.ones_like(d), d)
        x = torch.where(general, x, (b0 * c1 - b1 * c0) / d)
        y = torch.where(general, y, (a1 * c0 - a0 * c1) / d)
    pairs = ax.shape[1]
    return x.reshape(16, pairs), y.reshape(16, pairs), valid.reshape(16, pairs)


def _pair_overlaps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Intersection areas of box pairs ``a[p]``, ``b[p]`` ``[P, 7]`` (float32)."""
    ax, ay = _corners(a)
    bx, by = _corners(b)
    cross_x, cross_y, cross_valid = _crossings(ax, ay, bx, by)
    x = torch.cat((cross_x, bx, ax))  # [24, P]
    y = torch.cat((cross_y, by, ay))
    valid = torch.cat((cross_valid, _inside(a, bx, by), _inside(b, ax, ay)))
    weight = valid.to(x.dtype)
    count = valid.sum(0).clamp(min=1).to(x.dtype)
    centre_x, centre_y = (x * weight).sum(0) / count, (y * weight).sum(0) / count
    angle = torch.atan2(y - centre_y, x - centre_x)
    angle = torch.where(valid, angle, torch.full_like(angle, float("inf")))
    order = torch.sort(angle.t().contiguous(), dim=1, stable=True).indices.t()  # rows: faster
    x, y, valid = x.gather(0, order), y.gather(0, order), valid.gather(0, order)
    rel_x, rel_y = x - x[:1], y - y[:1]
    fan = rel_x[:-1] * rel_y[1:] - rel_y[:-1] * rel_x[1:]
    fan = torch.where(valid[1:], fan, torch.zeros_like(fan))
    return fan.sum(0).abs() / 2


def _candidates(boxes_a: torch.Tensor, boxes_b: torch.Tensor, upper: bool) -> torch.Tensor:
    """``[2, P]`` index pairs whose boxes may touch (circumscribed circles, plus margin).

    ``upper``: only pairs ``i < j`` (NMS on one set). The radii carry a 2e-2 slack, far
    above float32's error on the centre distances.
    """
    radius_a = torch.hypot(boxes_a[:, 3], boxes_a[:, 4]) / 2 + 2 * _MARGIN
    radius_b = torch.hypot(boxes_b[:, 3], boxes_b[:, 4]) / 2 + 2 * _MARGIN
    found = []
    step = max(1, _ROW_ELEMENTS // max(1, boxes_b.shape[0]))
    for start in range(0, boxes_a.shape[0], step):
        stop = min(boxes_a.shape[0], start + step)
        first_column = start + 1 if upper else 0  # i < j: no column before start + 1
        columns = boxes_b[first_column:]
        dx = boxes_a[start:stop, 0:1] - columns[:, 0]
        dy = boxes_a[start:stop, 1:2] - columns[:, 1]
        reach = radius_a[start:stop, None] + radius_b[None, first_column:]
        near = dx.mul_(dx).add_(dy.mul_(dy)) <= reach.mul_(reach)
        if upper:
            rows = torch.arange(start, stop, device=near.device)[:, None]
            near &= torch.arange(first_column, boxes_b.shape[0], device=near.device)[None, :] > rows
        pairs = near.nonzero().t()
        pairs[0] += start
        pairs[1] += first_column
        found.append(pairs)
    if not found:
        return torch.zeros((2, 0), dtype=torch.long, device=boxes_a.device)
    return torch.cat(found, 1)


def _overlaps_at(boxes_a: torch.Tensor, boxes_b: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    parts = [
        _pair_overlaps(
            boxes_a[pairs[0, s : s + _PAIRS_PER_CHUNK]], boxes_b[pairs[1, s : s + _PAIRS_PER_CHUNK]]
        )
        for s in range(0, pairs.shape[1], _PAIRS_PER_CHUNK)
    ]
    return torch.cat(parts) if parts else boxes_a.new_zeros(0)


@implements("iou3d_boxes_overlap_bev_forward", npu="mx_driving boxes_overlap_bev")
def iou3d_boxes_overlap_bev_forward(
    boxes_a: torch.Tensor, boxes_b: torch.Tensor, ans_iou: torch.Tensor
) -> None:
    """Write the BEV intersection areas ``[N, M]`` of two box sets into ``ans_iou``."""
    if boxes_a.shape[0] == 0 or boxes_b.shape[0] == 0:
        return
    if _on_npu(boxes_a):
        mx = _mx("iou3d_boxes_overlap_bev_forward", "boxes_overlap_bev")
        if mx is not None:
            ans_iou.copy_(mx.boxes_overlap_bev(boxes_a.contiguous(), boxes_b.contiguous()))
            return
    a, b = boxes_a.float(), boxes_b.float()
    pairs = _candidates(a, b, upper=False)
    result = torch.zeros(ans_iou.shape, dtype=torch.float32, device=a.device)
    result[pairs[0], pairs[1]] = _overlaps_at(a, b, pairs)
    ans_iou.copy_(result)


def _normal_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    left = torch.maximum(a[:, 0] - a[:, 3] / 2, b[:, 0] - b[:, 3] / 2)
    right = torch.minimum(a[:, 0] + a[:, 3] / 2, b[:, 0] + b[:, 3] / 2)
    top = torch.maximum(a[:, 1] - a[:, 4] / 2, b[:, 1] - b[:, 4] / 2)
    bottom = torch.minimum(a[:, 1] + a[:, 4] / 2, b[:, 1] + b[:, 4] / 2)
    inter = (right - left).clamp(min=0) * (bottom - top).clamp(min=0)
    return inter / torch.clamp(a[:, 3] * a[:, 4] + b[:, 3] * b[:, 4] - inter, min=_EPS)


def _greedy(count: int, pairs: torch.Tensor, suppresses: torch.Tensor) -> list[int]:
    """Greedy NMS over boxes 0..count-1 in order, given the suppressing pairs (i < j)."""
    first, second = pairs[:, suppresses]
    order = torch.argsort(first, stable=True)
    first, second = first[order], second[order]
    bounds = torch.searchsorted(first, torch.arange(count + 1, device=first.device)).tolist()
    later = second.tolist()
    dropped = bytearray(count)
    kept = []
    for box in range(count):  # the greedy walk: each decision depends on earlier ones
        if dropped[box]:
            continue
        kept.append(box)
        for other in later[bounds[box] : bounds[box + 1]]:
            dropped[other] = 1
    return kept


def _nms(
    boxes: torch.Tensor, keep: torch.Tensor, num_out: torch.Tensor, threshold: float, normal: bool
) -> None:
    count = boxes.shape[0]
    if count == 0:
        num_out.fill_(0)
        return
    boxes = boxes.float()
    pairs = _candidates(boxes, boxes, upper=True)
    if normal:
        iou = _normal_iou(boxes[pairs[0]], boxes[pairs[1]])
    else:
        overlap = _overlaps_at(boxes, boxes, pairs)
        area = boxes[:, 3] * boxes[:, 4]
        iou = overlap / torch.clamp(area[pairs[0]] + area[pairs[1]] - overlap, min=_EPS)
    threshold32 = torch.tensor(threshold, dtype=torch.float32)  # a C++ float in mmcv
    # Below 0 every IoU (0 for boxes apart, never built) is above it: the first box stays.
    kept = [0] if threshold32 < 0 else _greedy(count, pairs, iou > threshold32)
    keep[: len(kept)] = torch.tensor(kept, dtype=keep.dtype, device=keep.device)
    num_out.fill_(len(kept))


def _nms_on_mx(
    op: str,
    name: str,
    boxes: torch.Tensor,
    keep: torch.Tensor,
    num_out: torch.Tensor,
    threshold: float,
) -> bool:
    if not (_on_npu(boxes) and boxes.shape[0] > 0):
        return False
    mx = _mx(op, name)
    if mx is None:
        return False
    # mx_driving's NMS sorts by score itself: descending scores keep mmcv's order.
    scores = torch.arange(boxes.shape[0], 0, -1, dtype=torch.float32, device=boxes.device)
    kept = getattr(mx, name)(boxes, scores, threshold)
    keep[: kept.shape[0]] = kept.to(keep.dtype)
    num_out.fill_(int(kept.shape[0]))
    return True


@implements("iou3d_nms3d_forward", npu="mx_driving nms3d")
def iou3d_nms3d_forward(
    boxes: torch.Tensor, keep: torch.Tensor, num_out: torch.Tensor, nms_overlap_thresh: float
) -> None:
    """Greedy NMS of score-sorted rotated boxes ``[N, 7]``: ``keep[:num_out]``, ``num_out``."""
    if not _nms_on_mx("iou3d_nms3d_forward", "nms3d", boxes, keep, num_out, nms_overlap_thresh):
        _nms(boxes, keep, num_out, nms_overlap_thresh, normal=False)


@implements("iou3d_nms3d_normal_forward", npu="mx_driving nms3d_normal")
def iou3d_nms3d_normal_forward(
    boxes: torch.Tensor, keep: torch.Tensor, num_out: torch.Tensor, nms_overlap_thresh: float
) -> None:
    """As :func:`iou3d_nms3d_forward` with axis-aligned boxes (heading ignored)."""
    if not _nms_on_mx(
        "iou3d_nms3d_normal_forward", "nms3d_normal", boxes, keep, num_out, nms_overlap_thresh
    ):
        _nms(boxes, keep, num_out, nms_overlap_thresh, normal=True)
