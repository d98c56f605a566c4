"""``mmcv._ext`` NMS family: ``nms``, ``softnms``, ``nms_match`` in portable PyTorch.

Each equals mmcv's compiled CPU kernel (mmcv/ops/csrc/pytorch/cpu/nms.cpp) on the same
inputs, index for index: the same float32 arithmetic in the same order (areas
``(x2 - x1 + offset) * (y2 - y1 + offset)``, overlap ``inter / (area_i + area_j -
inter)``), the same sort (``scores.sort(0, descending=True)``), the same comparisons
(``nms`` drops ``iou > threshold``, ``nms_match`` ``iou >= threshold``) and, for
``softnms``, the same array permutation (its swap-with-the-last compaction), so ties
resolve as mmcv's do.

How it is vectorised (greedy NMS is sequential by definition):

* ``nms`` / ``nms_match``: boxes in score order, in blocks (from :data:`FIRST_BLOCK`
  doubling to :data:`BLOCK`): the IoU of a block's boxes with every box still in play
  is one tensor expression, and the greedy pass over the block is a loop over the
  rows of that boolean matrix (a kept box ORs its row into the removed mask; a
  removed box costs one lookup) -- the "vectorised IoU matrix and a loop over sorted
  boxes on a bool tensor" formulation. Suppressed boxes leave before the next block,
  so a crowded scene, where a few boxes suppress most, ends after a few blocks, as
  the compiled kernel's loop does. When those blocks have cost a quarter of what a
  sweep over ``x1`` would cost, the boxes left go through the sweep instead: in
  ``x1`` order a block's possible partners form one contiguous range, so the IoU is
  computed only where boxes can overlap, the passing pairs are listed once, and the
  greedy pass visits only boxes that suppress any (spread-out scenes, where most
  boxes are kept).
* ``softnms``: one loop iteration per output box (a round picks the best remaining
  box, re-weights all the others at once and drops those under ``min_score``): a
  round depends on the scores the previous one changed, so rounds cannot be merged.
  The rounds run on host arrays (numpy): a round is a dozen small operations, and
  torch's per-call overhead would be most of its time.

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


__all__ = ["BLOCK", "FIRST_BLOCK", "nms", "nms_match", "softnms"]

#: Boxes per block of the greedy pass and of the sweep (memory: BLOCK x N per block).
BLOCK = 256
#: The first score-order block (blocks double from here up to BLOCK).
FIRST_BLOCK = 32


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
    """Ranks (positions in ``order``, ascending) of the boxes greedy NMS keeps.

    ``groups`` (nms_match) gets, for each kept rank that suppresses any, the ranks it
    suppresses, ascending. Blocks in score order come first (growing from
    :data:`FIRST_BLOCK` to :data:`BLOCK`): each drops the boxes its kept boxes suppress
    before the next, so crowded scenes (a few kept boxes suppress most) end after a
    few blocks, as the compiled kernel's loop does. Once those blocks have cost a
    quarter of what the ``x1`` sweep would cost for all boxes, the boxes still in play
    go through the sweep's pair list instead (spread-out scenes: most boxes are kept,
    few overlap). Both are exact; the split only moves work.
    """
    limit = torch.tensor(threshold, dtype=boxes[0].dtype, device=boxes[0].device)

    def passes(iou: Tensor) -> Tensor:  # limit: a C++ float in mmcv's kernel
        return (iou >= limit) if inclusive else (iou > limit)

    ranked = tuple(t[order] for t in boxes)
    sweep = _Sweep(ranked, threshold, offset, inclusive)
    kept, alive = _greedy_in_score_order(ranked, offset, passes, groups, sweep.work // 4)
    if alive.numel():
        kept.append(_greedy_swept(ranked, alive, threshold, offset, inclusive, passes, groups))
    return np.sort(np.concatenate(kept)) if kept else np.empty(0, dtype=np.int64)


def _greedy_swept(
    ranked: tuple[Tensor, ...],
    alive: Tensor,
    threshold: float,
    offset: int,
    inclusive: bool,
    passes: Any,
    groups: dict[int, np.ndarray] | None,
) -> np.ndarray:
    """Greedy over the boxes ``alive`` (ranks, ascending) through the sweep's pair list."""
    boxes = tuple(t[alive] for t in ranked)  # index order is rank order
    count = alive.numel()
    a, b = _Sweep(boxes, threshold, offset, inclusive).pairs(offset, passes)
    keys = (torch.minimum(a, b) * count + torch.maximum(a, b)).sort()[0].cpu().numpy()
    suppressor, suppressed = keys // count, keys % count
    rows, starts = np.unique(suppressor, return_index=True)
    bounds = np.append(starts, len(keys))
    ranks = alive.cpu().numpy()
    removed = np.zeros(count, dtype=bool)
    # A box is suppressed only by a box ranked before it: a box is kept exactly when no
    # kept box before it suppresses it, so only rows that suppress any need a visit.
    for k, row in enumerate(rows.tolist()):
        if removed[row]:
            continue
        victims = suppressed[bounds[k] : bounds[k + 1]]
        if groups is not None:
            groups[int(ranks[row])] = ranks[victims[~removed[victims]]]
        removed[victims] = True
    return ranks[~removed]


def _greedy_in_score_order(
    ranked: tuple[Tensor, ...],
    offset: int,
    passes: Any,
    groups: dict[int, np.ndarray] | None,
    budget: int,
) -> tuple[list[np.ndarray], Tensor]:
    """Blocks of boxes in score order against the boxes still alive, within ``budget``.

    Returns the kept ranks and the ranks still undecided when the budget ran out.
    """
    kept: list[int] = []
    alive = torch.arange(ranked[0].numel(), device=ranked[0].device)
    size, spent = min(FIRST_BLOCK, BLOCK), 0
    while alive.numel():
        size = min(size, alive.numel())
        if spent + size * alive.numel() > budget and spent:
            break
        spent += size * alive.numel()
        cols = tuple(t[alive] for t in ranked)
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
        size = min(2 * size, BLOCK)
    return [np.asarray(kept, dtype=np.int64)], alive


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


def _fill_holes(keep: np.ndarray) -> np.ndarray:
    """The order mmcv's softnms leaves survivors in: a dropped slot takes the last survivor.

    Scanning left to right, the kernel replaces a dropped element by the current last
    one (and looks at that one next); so holes below the final length are filled by
    the survivors beyond it, the last first.
    """
    count = int(keep.sum())
    result = np.arange(count)
    result[~keep[:count]] = (np.flatnonzero(keep[count:]) + count)[::-1]
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
    # One table (a row per quantity, so each slice is contiguous), permuted as the
    # kernel permutes its arrays: x1 y1 x2 y2 score area.
    table = torch.stack([x1, y1, x2, y2, scores.to(x1.dtype), areas]).cpu().numpy()
    kind = table.dtype.type
    # mmcv's kernel takes these as C++ floats.
    threshold, sigma_, floor = kind(iou_threshold), kind(sigma), kind(min_score)
    inds = np.arange(count)
    out = np.empty((count, 5), dtype=table.dtype)
    n = count
    for i in range(count):
        if i >= n:
            break
        best = i + int(np.argmax(table[4, i:n]))  # the first of equal scores, as the kernel's `<`
        if best != i:
            table[:, [i, best]] = table[:, [best, i]]
            inds[i], inds[best] = inds[best], inds[i]
        out[i] = table[:5, i]
        if i + 1 == n:
            continue
        rx1, ry1, rx2, ry2, rscore, rarea = table[:, i + 1 : n]
        top = table[:, i]
        w = np.maximum(np.minimum(top[2], rx2) - np.maximum(top[0], rx1) + offset, 0)
        h = np.maximum(np.minimum(top[3], ry2) - np.maximum(top[1], ry1) + offset, 0)
        inter = w * h
        ovr = inter / (top[5] + rarea - inter)
        if method == 0:
            weight = (~(ovr >= threshold)).astype(table.dtype)
        elif method == 1:
            weight = np.where(ovr >= threshold, 1 - ovr, kind(1))
        elif method == 2:
            # Rounded from double: the C library's expf rounds (nearly) correctly, a
            # float32 vector exp may be an ulp off, which could reorder tied scores.
            weight = np.exp((-(ovr * ovr) / sigma_).astype(np.float64)).astype(table.dtype)
        else:
            weight = np.ones_like(ovr)
        rscore *= weight
        keep = ~(rscore < floor)
        if not keep.all():
            permutation = _fill_holes(keep)
            stop = i + 1 + permutation.size
            table[:, i + 1 : stop] = table[:, i + 1 : n][:, permutation]
            inds[i + 1 : stop] = inds[i + 1 : n][permutation]
            n = stop
    dets[:n].copy_(torch.from_numpy(out[:n]).to(dets.dtype))
    return torch.from_numpy(inds[:n].copy()).to(boxes.device)
