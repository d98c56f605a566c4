"""A permute of any rank, done with permutes of at most 8 dimensions.

``permute_narrow(x, dims)`` equals ``x.permute(dims)`` in shape and values, and returns
a contiguous tensor (the data moved once per pass). Why: the vision processors of
Qwen2-VL, Qwen3-VL, GLM-4V and others patchify images and videos with a view to 9 or
10 dimensions and one permute of all of them, and on an Ascend NPU a transpose of
more than 8 dimensions is reported not to be supported well (it is not measured here).

How: dimensions that stay next to each other, in the same order, are merged, and
size-1 dimensions dropped (neither moves data). If at most ``max_dims`` remain, one
permute does it. Otherwise each pass permutes one window of the remaining blocks
(what lies before and after the window is merged into one dimension each, so a pass
has at most ``max_dims``), chosen so the result has the fewest blocks left and then
the fewest blocks out of order: every pass sorts its window, so the passes end.
Qwen2-VL's 10-dimension patchify takes two passes: one of 8 dimensions, one of 4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


__all__ = ["MAX_DIMS", "permute_narrow", "plan_narrow_permute"]

#: The widest permute a pass makes.
MAX_DIMS = 8

Blocks = list[tuple[int, ...]]  # runs of input dimensions, in memory order


def _blocks(order: Sequence[int], rank: dict[int, int]) -> Blocks:
    """``order`` (input dims in memory order) cut where the target order is not continued."""
    blocks: Blocks = []
    for dim in order:
        if blocks and rank[dim] == rank[blocks[-1][-1]] + 1:
            blocks[-1] = (*blocks[-1], dim)
        else:
            blocks.append((dim,))
    return blocks


def _inversions(order: Sequence[int], rank: dict[int, int]) -> int:
    ranks = [rank[d] for d in order]
    return sum(a > b for i, a in enumerate(ranks) for b in ranks[i + 1 :])


def plan_narrow_permute(
    shape: Sequence[int], dims: Sequence[int], max_dims: int = MAX_DIMS
) -> list[tuple[list[int], list[int]]]:
    """The passes of :func:`permute_narrow`: ``(view shape, permutation)`` per pass.

    Each pass reshapes the (contiguous) data to ``view shape`` and permutes it; no
    permutation has more than ``max_dims`` entries.
    """
    if max_dims < 4:
        raise ValueError("max_dims must be at least 4 (a window of two blocks between two others)")
    n = len(shape)
    if sorted(d % n for d in dims) != list(range(n)) or len(dims) != n:
        raise ValueError(f"dims {tuple(dims)} is not a permutation of {n} dimensions")
    target = [d % n for d in dims if shape[d % n] != 1]  # size-1 dims move no data
    rank = {d: i for i, d in enumerate(target)}
    order = sorted(target)  # the memory order of a contiguous tensor
    passes: list[tuple[list[int], list[int]]] = []
    while True:
        blocks = _blocks(order, rank)
        if len(blocks) <= max_dims:
            sizes = [math.prod(shape[d] for d in b) for b in blocks]
            permutation = sorted(range(len(blocks)), key=lambda i: rank[blocks[i][0]])
            if permutation != list(range(len(blocks))):
                passes.append((sizes, permutation))
            return passes
        best: tuple[tuple[int, int], int, int, list[int]] | None = None
        for start in range(len(blocks)):
            for stop in range(start + 2, len(blocks) + 1):
                if (start > 0) + (stop - start) + (stop < len(blocks)) > max_dims:
                    break
                window = sorted(blocks[start:stop], key=lambda b: rank[b[0]])
                moved = [d for b in blocks[:start] + window + blocks[stop:] for d in b]
                score = (len(_blocks(moved, rank)), _inversions(moved, rank))
                if best is None or score < best[0]:
                    best = (score, start, stop, moved)
        assert best is not None  # max_dims >= 4 always leaves a window of two blocks
        _, start, stop, moved = best
        size = lambda group: math.prod(shape[d] for b in group for d in b)  # noqa: E731
        view = [size([b]) for b in blocks[start:stop]]
        window_order = sorted(range(len(view)), key=lambda i: rank[blocks[start + i][0]])
        offset = 0
        if start > 0:
            view.insert(0, size(blocks[:start]))
            offset = 1
        permutation = list(range(offset)) + [offset + i for i in window_order]
        if stop < len(blocks):
            view.append(size(blocks[stop:]))
            permutation.append(len(view) - 1)
        passes.append((view, permutation))
        order = moved


def permute_narrow(x: Any, dims: Sequence[int], max_dims: int = MAX_DIMS) -> Any:
    """``x.permute(dims)``, contiguous, computed with permutes of at most ``max_dims`` dims.

    An ``x`` that is itself a permuted view of contiguous memory (channels-last images,
    a transposed batch) is planned from that memory order, with no copy first; any
    other non-contiguous ``x`` is made contiguous first (a copy of its own rank). The
    processors' patchify views are contiguous.
    """
    n = x.dim()
    dims = tuple(int(d) % n if n else int(d) for d in dims)
    plan_narrow_permute(tuple(x.shape), dims, max_dims)  # checks dims
    out_shape = tuple(x.shape[d] for d in dims)
    if x.numel() == 0:
        return x.new_empty(out_shape)
    # The memory order of x's dims: by stride, largest first (stable for equal strides).
    memory_order = sorted(range(n), key=lambda d: -x.stride(d))
    base = x.permute(memory_order)
    if base.is_contiguous():
        x, dims = base, tuple(memory_order.index(d) for d in dims)
    y = x.contiguous()
    passes = plan_narrow_permute(tuple(x.shape), dims, max_dims)
    for view, permutation in passes:
        y = y.reshape(view).permute(permutation).contiguous()
    return y.reshape(out_shape)
