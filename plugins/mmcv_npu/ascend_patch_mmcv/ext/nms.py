"""``mmcv._ext`` NMS family: ``nms``, ``softnms``, ``nms_match`` in portable PyTorch.

Each equals mmcv's compiled CPU kernel (mmcv/ops/csrc/pytorch/cpu/nms.cpp) on the same
inputs, index for index: the same float32 arithmetic in the same order (areas
``(x2 - x1 + offset) * (y2 - y1 + offset)``, overlap ``inter / (area_i + area_j -
inter)``), the same sort (``scores.sort(0, descending=True)``), the same comparisons
(``nms`` drops ``iou > threshold``, ``nms_match`` ``iou >= threshold``) and, for
``softnms``, the same array permutation (its swap-with-the-last compaction), so ties
resolve as mmcv's do.

How it is vectorised (greedy NMS is sequential by definition):

* ``nms`` / ``nms_match``: boxes in score order, in blocks of :data:`BLOCK`. For a
  block, the IoU of its still-alive boxes with every alive box from the block on is
  one tensor expression; the greedy pass over the block's boxes is then a loop over
  the rows of that boolean matrix (a kept box ORs its row into the removed mask; a
  removed box costs one lookup) -- the "vectorised IoU matrix and a loop over sorted
  boxes on a bool tensor" formulation. Boxes removed by earlier blocks are dropped
  before the next block's IoU is computed, so the work follows the kept boxes, as the
  compiled kernel's does, and memory stays ``BLOCK x N``.
* ``softnms``: one loop iteration per output box (a round picks the best remaining box,
  re-weights all the others at once and drops those under ``min_score``): a round
  depends on the scores the previous one changed, so rounds cannot be merged.

Inputs of another floating dtype are computed in float32 (mmcv's CPU and CUDA kernels
accept float32 only; float64 is computed in float64). There is no NPU kernel here:
torch_npu's ``npu_nms_v4`` has no ``offset`` and drops boxes whose score is not above a
threshold, and mmcv's own NPU kernel calls ``NonMaxSuppressionV3`` with an ``offset``
attribute, which torch_npu does not expose; so NPU tensors run the portable code (the
IoU on the device, the greedy pass on the host).
"""

from __future__ import annotations

from typing import Any

import numpy as np  # type: ignore[import-not-found]  # (no numpy in the typecheck env)
import torch
from torch import Tensor

from .registry import implements


__all__ = ["BLOCK", "nms", "nms_match", "softnms"]

#: Sorted boxes per block of the greedy pass (memory: BLOCK x N booleans per block).
BLOCK = 256


def _overlaps(rows: tuple[Tensor, ...], cols: tuple[Tensor, ...], offset: int) -> Tensor:
    """IoU ``[len(rows), len(cols)]`` of boxes ``(x1, y1, x2, y2, area)``, as mmcv's CPU kernel.

    Bit for bit the kernel's float arithmetic: ``max``/``min`` and ``+`` commute, so the
    IoU of a pair does not depend on which box is the row.
    """
    rx1, ry1, rx2, ry2, rarea = (t[:, None] for t in rows)
    cx1, cy1, cx2, cy2, carea = (t[None, :] for t in cols)
    w = torch.minimum(rx2, cx2).sub_(torch.maximum(rx1, cx1))
    h = torch.minimum(ry2, cy2).sub_(torch.maximum(ry1, cy1))
    if offset:
        w.add_(offset)
        h.add_(offset)
    inter = w.clamp_(min=0).mul_(h.clamp_(min=0))
    return inter / (rarea + carea).sub_(inter)


class _Sweep:
    """Boxes in order of ``x1``, and for each :data:`BLOCK` of them the end of its partners.

    A box's partners later in that order start before the block's largest ``x2`` (plus
    ``offset``): a contiguous range, so each block is one dense IoU over that range.
    Where boxes that do not overlap can pass (a threshold below 0, or 0 with ``>=``),
    every later box is a partner.
    """

    def __init__(
        self, boxes: tuple[Tensor, ...], threshold: float, offset: int, inclusive: bool
    ) -> None:
        x1 = boxes[0]
        count = x1.numel()
        self.by_x = torch.argsort(x1)
        self.swept = tuple(t[self.by_x].contiguous() for t in boxes)
        sx1, sx2 = self.swept[0], self.swept[2]
        starts = range(0, count, BLOCK)
        if threshold > 0 or (threshold == 0 and not inclusive):
            # The margin only widens the ranges (float rounding of x2 - x1 + offset).
            scale = float(torch.cat([sx1.abs(), sx2.abs()]).max())
            padded = torch.cat([sx2, sx2.new_full(((-count) % BLOCK,), float("-inf"))])
            block_max = padded.view(-1, BLOCK).amax(1) + (offset + 1e-5 * (1.0 + scale))
            ends = torch.searchsorted(sx1, block_max, right=True).tolist()
        else:
            ends = [count] * len(starts)
        self.blocks = [
            (a, min(a + BLOCK, count), max(e, min(a + BLOCK, count)))
            for a, e in zip(starts, ends, strict=True)
        ]
        #: IoU entries the sweep computes.
        self.work = sum((stop - a) * (end - a) for a, stop, end in self.blocks)

    def pairs(self, offset: int, passes: Any) -> tuple[Tensor, Tensor]:
        """Every pair ``(a, b)``, ``a != b``, whose IoU passes, each once (original indices)."""
        firsts: list[Tensor] = [self.by_x[:0]]
        seconds: list[Tensor] = [self.by_x[:0]]
        for start, stop, end in self.blocks:
            rows = tuple(t[start:stop] for t in self.swept)
            iou = _overlaps(rows, tuple(t[start:end] for t in self.swept), offset)
            row, col = passes(iou).nonzero(as_tuple=True)
            later = row < col  # each pair once; not a box with itself
            firsts.append(self.by_x[row[later] + start])
            seconds.append(self.by_x[col[later] + start])
        return torch.cat(firsts), torch.cat(seconds)


def _greedy(
    boxes: tuple[Tensor, ...],
    order: Tensor,
    threshold: float,
    offset: int,
    inclusive: bool,
    groups: dict[int, np.ndarray] | None,
) -> np.ndarray:
    """Sorted positions (ranks into ``order``) of the boxes greedy NMS keeps.

    ``groups`` (nms_match) gets, for each kept rank that suppresses any, the ranks it
    suppresses, ascending. Two exact ways, chosen by the work each needs: spread-out
    boxes (few overlap) go through the ``x1`` sweep's pair list; crowded ones (most
    overlap, most are suppressed) through blocks in score order, which skip the boxes
    already suppressed, as the compiled kernel does.
    """
    limit = torch.tensor(threshold, dtype=boxes[0].dtype, device=boxes[0].device)

    def passes(iou: Tensor) -> Tensor:  # limit: a C++ float in mmcv's kernel
        return (iou >= limit) if inclusive else (iou > limit)

    count = order.numel()
    sweep = _Sweep(boxes, threshold, offset, inclusive)
    if sweep.work > count * count // 4:
        return _greedy_in_score_order(boxes, order, offset, passes, groups)
    first, second = sweep.pairs(offset, passes)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(count, device=order.device)
    a, b = rank[first], rank[second]
    keys = (torch.minimum(a, b) * count + torch.maximum(a, b)).sort()[0].cpu().numpy()
    suppressor, suppressed = keys // count, keys % count
    rows, starts = np.unique(suppressor, return_index=True)
    bounds = np.append(starts, len(keys))
    removed = np.zeros(count, dtype=bool)
    # A box is suppressed only by a box ranked before it: a box is kept exactly when no
    # kept box before it suppresses it, so only rows that suppress any need a visit.
    for k, row in enumerate(rows.tolist()):
        if removed[row]:
            continue
        victims = suppressed[bounds[k] : bounds[k + 1]]
        if groups is not None:
            groups[row] = victims[~removed[victims]]
        removed[victims] = True
    return np.flatnonzero(~removed)


def _greedy_in_score_order(
    boxes: tuple[Tensor, ...],
    order: Tensor,
    offset: int,
    passes: Any,
    groups: dict[int, np.ndarray] | None,
) -> np.ndarray:
    """The greedy pass over blocks of boxes in score order, each against the boxes still alive."""
    ranked = tuple(t[order] for t in boxes)
    kept: list[int] = []
    alive = torch.arange(order.numel(), device=order.device)
    while alive.numel():
        cols = tuple(t[alive] for t in ranked)
        size = min(BLOCK, alive.numel())
        matrix = passes(_overlaps(tuple(c[:size] for c in cols), cols, offset)).cpu().numpy()
        positions = alive.cpu().numpy()
        removed = np.zeros(alive.numel(), dtype=bool)
        for row in range(size):
            if removed[row]:
                continue
            kept.append(int(positions[row]))
            suppressed = matrix[row]
            suppressed[: row + 1] = False  # itself, and boxes settled before it
            if groups is not None:
                groups[int(positions[row])] = positions[suppressed & ~removed]
            removed |= suppressed
        removed[:size] = True
        alive = alive[torch.from_numpy(~removed).to(alive.device)]
    return np.asarray(kept, dtype=np.int64)


def _box_table(boxes: Tensor, offset: int) -> tuple[Tensor, ...]:
    dtype = boxes.dtype if boxes.dtype in (torch.float32, torch.float64) else torch.float32
    x1, y1, x2, y2 = (boxes.select(1, k).to(dtype).contiguous() for k in range(4))
    return x1, y1, x2, y2, (x2 - x1 + offset) * (y2 - y1 + offset)


@implements("nms")
def nms(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int) -> Tensor:
    """Indices of the boxes kept by greedy NMS, in descending score order (int64)."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=boxes.device)
    table = _box_table(boxes, int(offset))
    order = scores.sort(0, descending=True)[1]
    kept = _greedy(table, order, float(iou_threshold), int(offset), False, None)
    return order[torch.from_numpy(kept).to(order.device)]


@implements("nms_match")
def nms_match(dets: Tensor, iou_threshold: float) -> list[list[int]]:
    """Groups ``[kept, suppressed by it ...]`` in score order, as lists of ints (mmcv's CPU kernel)."""
    if dets.shape[0] == 0:
        return []
    table = _box_table(dets, 0)
    order = dets.select(1, 4).to(table[0].dtype).contiguous().sort(0, descending=True)[1]
    groups: dict[int, np.ndarray] = {}
    kept = _greedy(table, order, float(iou_threshold), 0, True, groups)
    original = order.cpu().numpy()
    empty = np.empty(0, dtype=np.int64)
    return [
        [int(original[rank]), *original[groups.get(int(rank), empty)].tolist()] for rank in kept
    ]


def _fill_holes(keep: Tensor) -> Tensor:
    """The order mmcv's softnms leaves survivors in: a dropped slot takes the last survivor.

    Scanning left to right, the kernel replaces a dropped element by the current last
    one (and looks at that one next); so holes below the final length are filled by
    the survivors beyond it, the last first.
    """
    count = int(keep.sum())
    positions = torch.arange(keep.numel(), device=keep.device)
    head = positions[:count]
    holes = head[~keep[:count]]
    tail = positions[count:][keep[count:]].flip(0)
    result = head.clone()
    result[holes] = tail
    return result


@implements("softnms")
def softnms(
    boxes: Tensor,
    scores: Tensor,
    dets: Tensor,
    iou_threshold: float,
    sigma: float,
    min_score: float,
    method: int,
    offset: int,
) -> Tensor:
    """Soft-NMS: writes ``(x1, y1, x2, y2, score)`` of each output box into ``dets``; returns indices."""
    count = boxes.shape[0]
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=boxes.device)
    x1, y1, x2, y2, areas = _box_table(boxes, int(offset))
    dtype = x1.dtype
    # One table, permuted as the kernel permutes its arrays: x1 y1 x2 y2 score area index.
    table = torch.stack([x1, y1, x2, y2, scores.to(dtype), areas], 1)
    inds = torch.arange(count, dtype=torch.long, device=boxes.device)
    out = torch.empty((count, 5), dtype=dtype, device=boxes.device)
    # mmcv's kernel takes these as C++ floats.
    threshold, sigma_, floor = (
        torch.tensor(float(v), dtype=dtype) for v in (iou_threshold, sigma, min_score)
    )
    n = count
    for i in range(count):
        if i >= n:
            break
        best = i + int(torch.argmax(table[i:n, 4]))
        if best != i:
            table[[i, best]] = table[[best, i]]
            inds[[i, best]] = inds[[best, i]]
        top = table[i]
        out[i] = top[:5]
        rest = table[i + 1 : n]
        if rest.shape[0] == 0:
            continue
        w = (torch.minimum(top[2], rest[:, 2]) - torch.maximum(top[0], rest[:, 0]) + offset).clamp(
            min=0
        )
        h = (torch.minimum(top[3], rest[:, 3]) - torch.maximum(top[1], rest[:, 1]) + offset).clamp(
            min=0
        )
        inter = w * h
        ovr = inter / (top[5] + rest[:, 5] - inter)
        if method == 0:
            weight = (~(ovr >= threshold)).to(dtype)
        elif method == 1:
            weight = torch.where(ovr >= threshold, 1 - ovr, torch.ones_like(ovr))
        elif method == 2:
            # Rounded from double: the C library's expf is correctly rounded, torch's
            # float32 exp may be one ulp off, which would reorder tied scores.
            weight = torch.exp((-(ovr * ovr) / sigma_).double()).to(dtype)
        else:
            weight = torch.ones_like(ovr)
        rest[:, 4] *= weight
        keep = ~(rest[:, 4] < floor)
        if not bool(keep.all()):
            permutation = _fill_holes(keep)
            table[i + 1 : i + 1 + permutation.numel()] = rest[permutation]
            inds[i + 1 : i + 1 + permutation.numel()] = inds[i + 1 : n][permutation]
            n = i + 1 + permutation.numel()
    dets[:n].copy_(out[:n].to(dets.dtype))
    return inds[:n].clone()
