"""Helpers of the point-cloud ``mmcv._ext`` functions (:mod:`.points`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ... import _kernel_source


__all__ = ["chunks", "mx_driving_for", "on_npu", "planes", "squared_distances"]

#: Elements of one ``[chunk, points]`` intermediate: bounds memory on large clouds.
_CHUNK_ELEMENTS = 1 << 22


def on_npu(tensor: Any) -> bool:
    return getattr(tensor, "is_npu", False) is True


def mx_driving_for(op: str, *names: str) -> Any:
    """The mx_driving module when ``op`` runs on its kernel in this process, else None."""
    source = _kernel_source.choose(
        op, (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE), mx_names=names
    )
    return _kernel_source.mx_driving() if source == _kernel_source.MX_DRIVING else None


def chunks(total: int, per_item: int) -> Iterator[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(1, per_item))
    for start in range(0, total, step):
        yield slice(start, min(total, start + step))


def planes(points: torch.Tensor) -> list[torch.Tensor]:
    """The x, y, z planes ``[B, 1, n]`` of ``points [B, n, 3]``, contiguous."""
    return [points[..., i].unsqueeze(1).contiguous() for i in range(3)]


def squared_distances(centres: torch.Tensor, point_planes: list[torch.Tensor]) -> torch.Tensor:
    """``[B, c, n]`` squared distances: dx*dx + dy*dy, then + dz*dz (the kernels' order).

    Separate multiplies and adds (no fused multiply-add), one coordinate plane at a
    time, in place: the rounding of mmcv's kernels, at a third of the memory traffic
    of a ``[B, c, n, 3]`` difference.
    """
    total = None
    for axis, plane in enumerate(point_planes):
        diff = centres[..., axis].unsqueeze(2) - plane
        diff.mul_(diff)
        total = diff if total is None else total.add_(diff)
    assert total is not None
    return total
