"""``mmcv._ext`` voxel functions: hard and dynamic voxelization, dynamic point-to-voxel scatter.

Semantics are those of mmcv 2.1.0's kernels (``voxelization_cpu.cpp`` for the two
voxelizations; the CUDA ``scatter_points`` launcher for the scatter, which has no CPU
kernel in mmcv):

- A point's cell is ``floor((p - range_min) / voxel_size)`` per axis (arithmetic in
  float32, float64 for float64 points), the grid ``round((range_max - range_min) /
  voxel_size)`` cells (C ``round``: halves away from zero); a point outside the grid
  gets the coordinate ``-1`` on every axis. Coordinates are written ``(z, y, x)``.
- Hard voxelization numbers voxels in the order of their first point; a point whose
  voxel would be number ``max_voxels`` or later is dropped, and so is a point arriving
  when its voxel already holds ``max_points``. ``deterministic=False`` gives the same
  (deterministic) answer: mmcv's non-deterministic variant only reorders voxels.
- The scatter groups points by coordinate (a row with a negative entry belongs to no
  voxel), voxels in lexicographic order of ``(z, y, x)``, and reduces their features by
  ``max`` / ``sum`` / ``mean``; the backward of ``max`` sends each voxel channel's
  gradient to the lowest-numbered point holding the maximum.

Kernels: hard voxelization on NPU tensors uses ``mx_driving.voxelization`` (layout
``"ZYX"``, mmcv's order) when chosen; everything else is portable PyTorch, vectorised
(sorts and scatters, no loop over points). ``mx_driving``'s dynamic scatter returns
neither the point-to-voxel map nor the counts mmcv's backward takes, so the scatter
stays portable on NPU too.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _kernel_source
from .registry import implements


__all__ = [
    "dynamic_point_to_voxel_backward",
    "dynamic_point_to_voxel_forward",
    "dynamic_voxelize_forward",
    "hard_voxelize_forward",
]

_REDUCE_TYPES = ("max", "sum", "mean")


def _on_npu(tensor: Any) -> bool:
    return getattr(tensor, "is_npu", False) is True


def _floats(values: Any) -> list[float]:
    """The float32 values of a small host tensor (mmcv passes voxel size and range so)."""
    return [float(v) for v in torch.as_tensor(values, dtype=torch.float32).flatten().tolist()]


def _c_round(values: torch.Tensor) -> torch.Tensor:
    """C's ``round``: halves away from zero (``torch.round`` rounds them to even)."""
    wide = values.double()
    return torch.where(wide >= 0, torch.floor(wide + 0.5), torch.ceil(wide - 0.5))


def _cells(
    points: torch.Tensor, voxel_size: Any, coors_range: Any, ndim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(cells [N, ndim] floored floats in x, y, z order, inside [N] bool, grid [ndim] int64)``.

    A cell is only meaningful where ``inside`` is True.
    """
    size = _floats(voxel_size)[:ndim]
    bounds = _floats(coors_range)
    compute = torch.float64 if points.dtype == torch.float64 else torch.float32
    low = torch.tensor(bounds[:ndim], dtype=torch.float32)
    high = torch.tensor(bounds[ndim : 2 * ndim], dtype=torch.float32)
    step = torch.tensor(size, dtype=torch.float32)
    grid = _c_round((high - low) / step).long()
    coordinates = points[:, :ndim].to(compute)
    scaled = (coordinates - low.to(points.device, compute)).div_(step.to(points.device, compute))
    scaled.floor_()
    inside = ((scaled >= 0) & (scaled < grid.to(points.device, compute))).all(dim=1)
    # Rows outside the grid (NaN included) hold garbage: every caller masks them.
    return scaled, inside, grid.to(points.device)


@implements("dynamic_voxelize_forward")
def dynamic_voxelize_forward(
    points: torch.Tensor,
    voxel_size: Any,
    coors_range: Any,
    coors: torch.Tensor,
    NDim: int,
) -> None:
    """Write each point's ``(z, y, x)`` cell into ``coors [N, NDim]`` (-1s outside the grid)."""
    if points.shape[0] == 0:
        return
    cells, inside, _ = _cells(points, voxel_size, coors_range, NDim)
    coors.copy_(cells.flip(1))
    coors.masked_fill_(~inside.unsqueeze(1), -1)


def _hard_on_mx_driving(
    points: torch.Tensor,
    voxel_size: Any,
    coors_range: Any,
    voxels: torch.Tensor,
    coors: torch.Tensor,
    num_points_per_voxel: torch.Tensor,
    voxel_num: torch.Tensor,
    max_points: int,
    max_voxels: int,
    deterministic: bool,
) -> None:
    count, got_voxels, got_coors, got_num = _kernel_source.mx_driving().voxelization(
        points, _floats(voxel_size), _floats(coors_range), max_points, max_voxels,
        deterministic, "ZYX",
    )  # fmt: skip
    count = int(count)
    voxels[:count].copy_(got_voxels[:count])
    coors[:count].copy_(got_coors[:count])
    num_points_per_voxel[:count].copy_(got_num[:count])
    voxel_num.fill_(count)


@implements("hard_voxelize_forward", npu="mx_driving voxelization")
def hard_voxelize_forward(
    points: torch.Tensor,
    voxel_size: Any,
    coors_range: Any,
    voxels: torch.Tensor,
    coors: torch.Tensor,
    num_points_per_voxel: torch.Tensor,
    voxel_num: torch.Tensor,
    max_points: int,
    max_voxels: int,
    NDim: int,
    deterministic: bool,
) -> None:
    """Fill ``voxels``, ``coors``, ``num_points_per_voxel`` and the scalar ``voxel_num``.

    Only the first ``voxel_num`` rows are written (mmcv preallocates them zeroed).
    """
    max_voxels = voxels.shape[0] if max_voxels == -1 else max_voxels
    max_points = voxels.shape[1] if max_points == -1 else max_points
    if max_voxels > voxels.shape[0] or max_points > voxels.shape[1]:
        raise ValueError(
            f"hard_voxelize_forward: voxels {tuple(voxels.shape)} cannot hold "
            f"max_voxels={max_voxels}, max_points={max_points}"
        )
    if (
        _on_npu(points)
        and points.shape[0] > 0
        and NDim == 3
        and _kernel_source.choose(
            "hard_voxelize_forward",
            (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE),
            mx_names=("voxelization",),
        )
        == _kernel_source.MX_DRIVING
    ):
        _hard_on_mx_driving(
            points, voxel_size, coors_range, voxels, coors, num_points_per_voxel,
            voxel_num, max_points, max_voxels, deterministic,
        )  # fmt: skip
        return
    cells, inside, grid = _cells(points, voxel_size, coors_range, NDim)
    kept = inside.nonzero().squeeze(1)
    if kept.numel() == 0:
        voxel_num.fill_(0)
        return
    cells = cells.index_select(0, kept).long()
    # One int64 key per cell, x fastest (the order of mmcv's coor_to_voxelidx table).
    strides = torch.cumprod(torch.cat((grid.new_ones(1), grid[:-1])), 0)
    keys = (cells * strides).sum(dim=1)
    if int(torch.prod(grid)) < 2**31:
        keys = keys.int()  # sorts twice as fast
    sorted_keys, order = torch.sort(keys, stable=True)
    starts_here = torch.ones_like(sorted_keys, dtype=torch.bool)
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=starts_here[1:])
    group = torch.cumsum(starts_here, 0) - 1
    starts = starts_here.nonzero().squeeze(1)
    # Stable sort: a group's first entry is its voxel's first point. Voxels are numbered
    # in the order of those first points: a running count over the points, no sort.
    first_point = order[starts]
    is_first = torch.zeros_like(keys, dtype=torch.bool)
    is_first[first_point] = True
    rank = (torch.cumsum(is_first, 0) - 1)[first_point]
    voxel_of = rank[group]
    slot = torch.arange(order.numel(), device=order.device) - starts[group]
    take = ((voxel_of < max_voxels) & (slot < max_points)).nonzero().squeeze(1)
    count = min(int(first_point.numel()), max_voxels)
    taken_voxels = voxel_of[take]
    rows = points.index_select(0, kept[order[take]]).to(voxels.dtype)
    if voxels.is_contiguous():  # one flat index: index_copy_ is ~10x index_put_ on two
        flat = voxels.view(-1, voxels.shape[2])
        flat.index_copy_(0, taken_voxels * voxels.shape[1] + slot[take], rows)
    else:
        voxels[taken_voxels, slot[take]] = rows
    num_points_per_voxel[:count] = torch.bincount(taken_voxels, minlength=count)[:count].to(
        num_points_per_voxel.dtype
    )
    heads = (rank < max_voxels).nonzero().squeeze(1)
    coors[rank[heads]] = cells[first_point[heads]].flip(1).to(coors.dtype)
    voxel_num.fill_(count)


def _voxel_keys(coors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique coordinate rows (lexicographic order), voxel of each row)`` for valid rows."""
    wide = coors.long()
    low = wide.amin(dim=0)
    span = wide.amax(dim=0) - low + 1
    if float(torch.prod(span.double())) < 2**62:
        strides = torch.flip(
            torch.cumprod(torch.flip(torch.cat((span[1:], span.new_ones(1))), [0]), 0), [0]
        )
        keys = ((wide - low) * strides).sum(dim=1)
        unique_keys, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        first = torch.full_like(unique_keys, wide.shape[0])
        first.scatter_reduce_(0, inverse, torch.arange(wide.shape[0], device=wide.device), "amin")
        return coors[first], inverse
    unique_rows, inverse = torch.unique(coors, dim=0, sorted=True, return_inverse=True)
    return unique_rows, inverse


@implements("dynamic_point_to_voxel_forward")
def dynamic_point_to_voxel_forward(
    feats: torch.Tensor, coors: torch.Tensor, reduce_type: str
) -> list[torch.Tensor]:
    """``[voxel_feats, voxel_coors, point2voxel_map (int32), voxel_points_count (int32)]``."""
    if reduce_type not in _REDUCE_TYPES:
        raise RuntimeError(f"do not support reduce type {reduce_type}")
    if feats.shape[0] == 0:
        empty = coors.new_empty((0,), dtype=torch.int32)
        return [feats.clone().detach(), coors.clone().detach(), empty, empty.clone()]
    valid = ~(coors < 0).any(dim=1)
    rows = valid.nonzero().squeeze(1)
    point_to_voxel = torch.full((feats.shape[0],), -1, dtype=torch.int64, device=feats.device)
    if rows.numel() == 0:
        voxel_coors = coors.new_empty((0, coors.shape[1]))
        count = torch.zeros(0, dtype=torch.int64, device=feats.device)
    else:
        voxel_coors, inverse = _voxel_keys(coors[rows])
        point_to_voxel[rows] = inverse
        count = torch.bincount(inverse, minlength=voxel_coors.shape[0])
    voxels = voxel_coors.shape[0]
    src = feats[rows]
    index = point_to_voxel[rows].unsqueeze(1).expand_as(src)
    if reduce_type == "max":
        reduced = feats.new_full((voxels, feats.shape[1]), float("-inf"))
        reduced.scatter_reduce_(0, index, src, "amax")
    else:
        reduced = feats.new_zeros((voxels, feats.shape[1]))
        reduced.scatter_add_(0, index, src)
        if reduce_type == "mean":
            reduced /= count.unsqueeze(1).to(reduced.dtype)
    return [reduced, voxel_coors, point_to_voxel.int(), count.int()]


@implements("dynamic_point_to_voxel_backward")
def dynamic_point_to_voxel_backward(
    grad_feats: torch.Tensor,
    grad_reduced_feats: torch.Tensor,
    feats: torch.Tensor,
    reduced_feats: torch.Tensor,
    coors_idx: torch.Tensor,
    reduce_count: torch.Tensor,
    reduce_type: str,
) -> None:
    """Write the gradient of the points' features into ``grad_feats`` (zeroed first)."""
    if reduce_type not in _REDUCE_TYPES:
        raise RuntimeError(f"do not support reduce type {reduce_type}")
    grad_feats.fill_(0)
    points, channels = feats.shape
    if points == 0 or reduced_feats.shape[0] == 0:
        return
    voxel = coors_idx.long()
    rows = (voxel >= 0).nonzero().squeeze(1)
    voxel = voxel[rows]
    if reduce_type != "max":
        grad = grad_reduced_feats[voxel]
        if reduce_type == "mean":
            grad = grad / reduce_count.to(grad.device)[voxel].unsqueeze(1).to(grad.dtype)
        grad_feats[rows] = grad.to(grad_feats.dtype)
        return
    # For each voxel channel, the lowest point index whose feature equals the maximum.
    holds_max = feats[rows] == reduced_feats[voxel]
    candidate = torch.where(
        holds_max, rows.unsqueeze(1), torch.full_like(holds_max, points, dtype=torch.long)
    )
    source = torch.full(reduced_feats.shape, points, dtype=torch.long, device=feats.device)
    source.scatter_reduce_(0, voxel.unsqueeze(1).expand(-1, channels), candidate, "amin")
    found = source < points
    channel = torch.arange(channels, device=feats.device).expand_as(source)
    grad_feats[source[found], channel[found]] = grad_reduced_feats[found].to(grad_feats.dtype)
