"""Patch groups of the plugin: the mmdet3d family (see :mod:`ascend_patch_mmcv.groups` for the rules).

Like ``groups``, this module imports no patch family: a group's ``patches()`` imports
its family module only when the core builds the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


__all__ = ["GROUPS", "NuScenesDataset", "NuScenesMetric"]


class NuScenesDataset(Patch):
    """mmdet3d 1.0.0rc (the mmcv 1.x line): nuScenes datasets' ``output_to_nusc_box``, faster.

    ``mmdet3d.datasets.nuscenes_dataset`` (LiDAR boxes) and ``nuscenes_mono_dataset``
    (camera boxes): the same nuScenes boxes, in mmdet3d 1.0's own box convention, with
    the quaternions and velocities of a frame computed at once
    (see :mod:`ascend_patch_mmcv.nuscenes_boxes`).
    """

    legacy_name = "nuscenes_dataset"
    # The function lives in these modules from 1.0.0rc0 (the coordinate-system refactor)
    # to 1.0.0rc6; mmdet3d 1.1 moved it to the metric (NuScenesMetric). Before 1.0 it
    # had another box convention, which this group does not reproduce.
    requires = ("mmdet3d>=1.0.0rc0,<1.1.0rc0",)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .nuscenes_patches import nuscenes_dataset_patches

        return nuscenes_dataset_patches(options)


class NuScenesMetric(Patch):
    """mmdet3d 1.1-1.4 (the mmcv 2.x line): ``NuScenesMetric``'s ``output_to_nusc_box``, faster.

    ``mmdet3d.evaluation.metrics.nuscenes_metric.output_to_nusc_box``, LiDAR and camera
    branches, the same boxes as the installed mmdet3d's
    (see :mod:`ascend_patch_mmcv.nuscenes_boxes`).
    """

    legacy_name = "nuscenes_metric"
    # Checked identical in 1.1.0 and 1.4.0; the 1.1.0rc pre-releases are not covered.
    requires = ("mmdet3d>=1.1.0,<1.5",)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .nuscenes_patches import nuscenes_metric_patches

        return nuscenes_metric_patches(options)


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (NuScenesDataset, NuScenesMetric)
