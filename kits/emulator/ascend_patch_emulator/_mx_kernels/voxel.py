"""Hard voxelization: ``voxelization`` and the ``Voxelization`` module (mmcv's semantics).

``voxelization(points, voxel_size, coors_range, max_points=-1, max_voxels=-1,
deterministic=True, layout="XYZ")`` with ``max_points`` and ``max_voxels`` both set
(not -1) is hard voxelization: point ``i`` (``points [N, C]``, x y z first) falls in
the voxel ``floor((p - range_min) / voxel_size)`` of a grid of ``round((range_max -
range_min) / voxel_size)`` cells per axis, and is dropped outside the grid. Voxels
are numbered in the order their first point comes; a point whose voxel would be
number ``max_voxels`` or later is dropped, and so is a point arriving when its
voxel already holds ``max_points``. Arithmetic in the points' dtype.

Returns ``(voxel_num, voxels [voxel_num, max_points, C] zero-padded, coors
[voxel_num, 3] int32, num_points_per_voxel [voxel_num] int32)``; ``coors`` is ``(x,
y, z)`` cell numbers for ``layout="XYZ"`` and ``(z, y, x)`` (mmcv's order) for
``"ZYX"``. The wheel returns its compiled op's result unchanged, and its own mmcv
patch drops the first of four results; the emulator's first result is the voxel
count as an int. ``deterministic`` is accepted and has no effect in hard mode (as
in the wheel). Dynamic voxelization (``max_points`` or ``max_voxels`` -1) has no
reference kernel. No backward (the wheel's Function defines none).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from .._errors import KernelNotImplementedError
from . import MxFunction
from . import applier
from . import ensure_active
from . import raw_apply


__all__ = ["PUBLIC", "Voxelization", "hard_voxelize"]

_LAYOUTS = ("XYZ", "ZYX")


def hard_voxelize(
    points: Any, voxel_size: Any, coors_range: Any, max_points: int, max_voxels: int, layout: str
) -> tuple[int, Any, Any, Any]:
    if layout not in _LAYOUTS:
        raise ValueError(f"voxelization: layout must be 'XYZ' or 'ZYX', got {layout!r}")
    if max_points <= 0 or max_voxels <= 0:
        raise ValueError("voxelization: max_points and max_voxels must be positive")
    count, features = points.shape
    dtype = points.dtype if points.is_floating_point() else torch.float32
    size = torch.as_tensor(voxel_size, dtype=dtype).flatten()[:3]
    bounds = torch.as_tensor(coors_range, dtype=dtype).flatten()
    low, high = bounds[:3], bounds[3:6]
    grid = torch.round((high - low) / size).long()
    cells = torch.floor((points[:, :3].to(dtype) - low) / size).long()
    inside = ((cells >= 0) & (cells < grid)).all(dim=1)
    order = torch.arange(count)
    kept_points = order[inside]
    key = (cells[inside, 2] * grid[1] + cells[inside, 1]) * grid[0] + cells[inside, 0]
    empty = points.new_zeros(0, max_points, features)
    if kept_points.numel() == 0:
        no_cells = torch.zeros(0, 3, dtype=torch.int32)
        return 0, empty, no_cells, torch.zeros(0, dtype=torch.int32)
    unique, inverse = torch.unique(key, return_inverse=True)
    first = torch.full((unique.numel(),), count, dtype=torch.long)
    first.scatter_reduce_(0, inverse, kept_points, "amin", include_self=True)
    # Voxel numbers in the order of each voxel's first point.
    rank = torch.empty_like(first)
    rank[torch.argsort(first)] = torch.arange(first.numel())
    voxel_of = rank[inverse]
    # The place of each point inside its voxel: earlier points of the voxel come first.
    sort = torch.argsort(voxel_of * count + kept_points)
    sorted_voxels = voxel_of[sort]
    starts = torch.searchsorted(sorted_voxels, sorted_voxels, right=False)
    slot = torch.empty_like(sort)
    slot[sort] = torch.arange(sort.numel()) - starts
    take = (voxel_of < max_voxels) & (slot < max_points)
    voxel_num = int(min(unique.numel(), max_voxels))
    voxels = points.new_zeros(voxel_num, max_points, features)
    voxels[voxel_of[take], slot[take]] = points[kept_points[take]]
    num_points = torch.zeros(voxel_num, dtype=torch.int32)
    num_points.scatter_add_(0, voxel_of[take], torch.ones_like(voxel_of[take], dtype=torch.int32))
    coors = torch.zeros(voxel_num, 3, dtype=torch.int32)
    heads = take & (slot == 0)
    xyz = cells[inside][heads].int()
    coors[voxel_of[heads]] = xyz if layout == "XYZ" else xyz.flip(1)
    return voxel_num, voxels, coors, num_points


class _Voxelization(MxFunction):
    """The Function behind ``mx_driving.voxelization`` (forward only)."""

    @staticmethod
    def forward(
        ctx: Any,
        points: Any,
        voxel_size: Any,
        coors_range: Any,
        max_points: int = -1,
        max_voxels: int = -1,
        deterministic: bool = True,
        layout: str = "XYZ",
    ) -> Any:
        if len(points) == 0 or len(voxel_size) == 0 or len(coors_range) == 0:
            raise RuntimeError("voxelization: input tensors must not be empty")
        if max_points != -1 and max_voxels != -1:
            return hard_voxelize(points, voxel_size, coors_range, max_points, max_voxels, layout)
        raise KernelNotImplementedError(
            "mx_driving.voxelization with max_points or max_voxels -1 (dynamic "
            "voxelization) has no reference kernel in ascend-patch's emulated mx_driving; "
            "hard voxelization (both set) has one"
        )


class Voxelization(nn.Module):  # type: ignore[misc]
    """``mx_driving.Voxelization``: ``max_voxels`` is one number or (training, testing)."""

    def __init__(
        self,
        voxel_size: Any,
        point_cloud_range: Any,
        max_num_points: int,
        max_voxels: Any = 20000,
        deterministic: bool = True,
        layout: str = "XYZ",
    ) -> None:
        # A bad call never gets here (Python binds __init__ first): nothing to report.
        ensure_active("Voxelization")
        super().__init__()
        self.voxel_size = voxel_size
        self.point_cloud_range = point_cloud_range
        self.max_num_points = max_num_points
        self.max_voxels = max_voxels if isinstance(max_voxels, tuple) else _pair(max_voxels)
        self.deterministic = deterministic
        self.layout = layout

    def forward(self, points: Any) -> Any:
        max_voxels = self.max_voxels[0] if self.training else self.max_voxels[1]
        return raw_apply(
            _Voxelization,
            points,
            self.voxel_size,
            self.point_cloud_range,
            self.max_num_points,
            max_voxels,
            self.deterministic,
            self.layout,
        )


PUBLIC = {
    "Voxelization": Voxelization,
    "voxelization": applier("voxelization", _Voxelization),
}
