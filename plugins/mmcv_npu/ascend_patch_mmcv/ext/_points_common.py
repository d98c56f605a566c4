"""Helpers of the point-cloud ``mmcv._ext`` functions (:mod:`ascend_patch_mmcv.ext.points`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .. import kernel_source


__all__ = ["chunks", "mx_driving_for", "on_npu", "squared_distances"]

#: Elements of one ``[chunk, points]`` intermediate: bounds memory on large clouds.
_CHUNK_ELEMENTS = 1 << 22


def on_npu(tensor: Any) -> bool:
    return getattr(tensor, "is_npu", False) is True


def mx_driving_for(op: str, *names: str) -> Any:
    """The mx_driving module when ``op`` runs on its kernel in this process, else None."""
    source = kernel_source.choose(
        op, (kernel_source.MX_DRIVING, kernel_source.PORTABLE), mx_names=names
    )
    return kernel_source.mx_driving() if source == kernel_source.MX_DRIVING else None


def chunks(total: int, per_item: int) -> Iterator[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(1, per_item))
    for start in range(0, total, step):
        yield slice(start, min(total, start + step))


def squared_distances(centres: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """``[B, c, n]`` squared distances, summed x + y, then + z (the kernels' order)."""
    diff = centres.unsqueeze(2) - points.unsqueeze(1)
    square = diff * diff
    return square[..., 0] + square[..., 1] + square[..., 2]
