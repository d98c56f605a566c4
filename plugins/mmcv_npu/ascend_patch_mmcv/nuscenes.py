"""The patches of NuScenesDataset and NuScenesMetric, declared without numpy.

``apply()`` and ``doctor`` build these (mmdet3d installed is enough); the vectorised
replacements in :mod:`ascend_patch_mmcv.nuscenes_kernels` import numpy, so they are
made only when mmdet3d's module is imported and the patch is installed (each
``target_wrapper`` imports them then). The runtime checks use torch tensors only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = [
    "CAMERA_COLUMNS",
    "DATASET_TARGET",
    "METRIC_TARGET",
    "MONO_DATASET_TARGET",
    "NOTE",
    "YAW_COLUMNS",
    "nuscenes_dataset_patches",
    "nuscenes_metric_patches",
]

METRIC_MODULE = "mmdet3d.evaluation.metrics.nuscenes_metric"
DATASET_MODULE = "mmdet3d.datasets.nuscenes_dataset"
MONO_DATASET_MODULE = "mmdet3d.datasets.nuscenes_mono_dataset"
METRIC_TARGET = f"{METRIC_MODULE}:output_to_nusc_box"
DATASET_TARGET = f"{DATASET_MODULE}:output_to_nusc_box"
MONO_DATASET_TARGET = f"{MONO_DATASET_MODULE}:output_to_nusc_box"
NOTE = "vectorised quaternions and velocities (numpy); one Box per detection, as upstream"

#: Box columns: x y z, 3 dims, yaw, then 2 velocity columns.
YAW_COLUMNS = 7
CAMERA_COLUMNS = 9


def _replacement(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A target_wrapper that builds the numpy replacement ``name`` when installing."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        # Imported here, at installation: it imports numpy. (It imports nothing of this
        # module, so there is no import circle.)
        from . import nuscenes_kernels

        make: Callable[[Callable[..., Any]], Callable[..., Any]] = getattr(nuscenes_kernels, name)
        return make(original)

    return wrap


# -- runtime checks: what the replacement takes; the rest goes to the original ------------


def _convertible(boxes: Any, scores: Any, labels: Any, columns: int) -> bool:
    """Finite boxes of enough columns, with as many scores and labels: what the replacement takes.

    Box.__init__ asserts on a NaN centre or size, pyquaternion raises on an infinite
    yaw: boxes with a non-finite centre, size or yaw go to the original (one check of
    the tensor, cheaper than recomputing the centres), which raises its own error or,
    for an infinite but valid centre, converts them itself.
    """
    tensor = boxes.tensor
    count = len(boxes)
    if tensor.ndim != 2 or tensor.shape[1] < columns or not tensor.dtype.is_floating_point:
        return False
    if scores.ndim != 1 or labels.ndim != 1 or len(scores) < count or len(labels) < count:
        return False
    return bool(tensor[:count, :YAW_COLUMNS].isfinite().all())


def _metric_check(detection: dict[str, Any]) -> bool:
    namespace = vars(sys.modules[METRIC_MODULE])
    bbox3d = detection["bboxes_3d"]
    if isinstance(bbox3d, namespace["LiDARInstance3DBoxes"]):
        columns = YAW_COLUMNS
    elif isinstance(bbox3d, namespace["CameraInstance3DBoxes"]):
        columns = CAMERA_COLUMNS
    else:
        return False
    return _convertible(bbox3d, detection["scores_3d"], detection["labels_3d"], columns)


def _dataset_check(detection: dict[str, Any], with_velocity: Any = True) -> bool:
    box3d = detection["boxes_3d"]
    return _convertible(box3d, detection["scores_3d"], detection["labels_3d"], YAW_COLUMNS)


def _mono_dataset_check(detection: dict[str, Any]) -> bool:
    box3d = detection["boxes_3d"]
    return _convertible(box3d, detection["scores_3d"], detection["labels_3d"], CAMERA_COLUMNS)


def nuscenes_metric_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.NuScenesMetric`."""
    yield AtomicPatch(
        METRIC_TARGET,
        target_wrapper=_replacement("_metric_replacement"),
        runtime_check=_metric_check,
        note=NOTE,
    )


def nuscenes_dataset_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_mmcv.groups.NuScenesDataset`."""
    yield AtomicPatch(
        DATASET_TARGET,
        target_wrapper=_replacement("_dataset_replacement"),
        runtime_check=_dataset_check,
        note=NOTE,
    )
    yield AtomicPatch(
        MONO_DATASET_TARGET,
        target_wrapper=_replacement("_mono_dataset_replacement"),
        runtime_check=_mono_dataset_check,
        note=NOTE,
    )
