"""Voxelization: mmcv's hard voxelization of point clouds on DrivingSDK's NPU kernel.

``mmcv.ops.voxelization`` (``_Voxelization.apply``; the ``Voxelization`` module calls
the module-level name) turns points ``[N, C]`` into voxels. In hard mode
(``max_points`` and ``max_voxels`` both set) the group sends NPU points to
``mx_driving.voxelization(..., layout="ZYX")`` -- the same voxels, in the same order,
with mmcv's ``(z, y, x)`` voxel coordinates -- and returns mmcv's three results
(the kernel's first result, the voxel count, is dropped). Dynamic voxelization
(``max_points`` or ``max_voxels`` -1) stays with mmcv.

Kernel (:mod:`ascend_patch_mmcv._kernel_source`, op ``voxelization``): ``mx_driving``
only; without it the group installs nothing (mmcv's NPU build has a hard-voxelization
kernel of its own). Opt-in, as in the DrivingSDK patcher: the kernel's ordering and
limits are the ones mmcv documents, but 3D detectors are sensitive to which points
are dropped when a voxel or the voxel budget is full, so switching is the user's call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from . import _kernel_source


__all__ = ["OP", "voxelization", "voxelization_patches"]

MODULE = "mmcv.ops.voxelize"
OP = "voxelization"


def voxelization(
    points: Any,
    voxel_size: Any,
    coors_range: Any,
    max_points: int = 35,
    max_voxels: int = 20000,
    deterministic: bool = True,
) -> Any:
    """mmcv's hard ``voxelization`` on ``mx_driving.voxelization``."""
    count, voxels, coors, num_points = _kernel_source.mx_driving().voxelization(
        points, voxel_size, coors_range, max_points, max_voxels, deterministic, "ZYX"
    )
    count = int(count)
    return voxels[:count], coors[:count], num_points[:count]


def _check(points: Any, voxel_size: Any, coors_range: Any, *rest: Any, **kwargs: Any) -> bool:
    max_points = rest[0] if rest else kwargs.get("max_points", 35)
    max_voxels = rest[1] if len(rest) > 1 else kwargs.get("max_voxels", 20000)
    return (
        getattr(points, "is_npu", False) is True
        and points.dim() == 2
        and points.shape[0] > 0
        and max_points != -1
        and max_voxels != -1
    )


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    return voxelization(*args, **kwargs)


def voxelization_patches(options: Any = None) -> Iterator[AtomicPatch]:
    source = _kernel_source.choose(OP, (_kernel_source.MX_DRIVING,))
    if source != _kernel_source.MX_DRIVING:
        return
    note = _kernel_source.note(source)
    yield AtomicPatch(
        f"{MODULE}:_Voxelization.apply",
        _apply,
        runtime_check=lambda cls, *args, **kwargs: _check(*args, **kwargs),
        note=note,
    )
    yield AtomicPatch(
        f"{MODULE}:voxelization",
        voxelization,
        aliases="mmcv.ops:voxelization",
        runtime_check=_check,
        note=note,
    )
