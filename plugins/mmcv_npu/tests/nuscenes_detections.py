"""Random 3D detections, and the comparison of two lists of nuScenes boxes, for the NuScenes tests.

Shared by ``test_nuscenes_metric.py`` (mmdet3d 1.4.0) and ``test_nuscenes_rc_line.py``
(mmdet3d 1.0.0rc sources, in a subprocess that imports this module too). Needs torch
and numpy only.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import torch


__all__ = ["assert_same_boxes", "box_tensor", "scores_and_labels"]


def box_tensor(count: int, columns: int, seed: int, dtype: Any = torch.float32) -> Any:
    """``(count, columns)`` boxes: centre, positive dims, yaw (with exact zeros), velocity."""
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.empty((count, columns), dtype=torch.float64)
    tensor[:, :3] = torch.randn((count, 3), generator=generator, dtype=torch.float64) * 20
    tensor[:, 3:6] = torch.rand((count, 3), generator=generator, dtype=torch.float64) * 5 + 0.1
    tensor[:, 6] = (torch.rand(count, generator=generator, dtype=torch.float64) - 0.5) * 4 * math.pi
    if columns > 7:
        tensor[:, 7:] = torch.randn((count, columns - 7), generator=generator) * 3
    # pyquaternion takes a zero yaw (also -0.0) as 0.0: keep some.
    tensor[::7, 6] = 0.0
    tensor[3::7, 6] = -0.0
    return tensor.to(dtype)


def scores_and_labels(count: int, seed: int, classes: int = 10) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(seed + 1)
    scores = torch.rand(count, generator=generator)
    labels = torch.randint(0, classes, (count,), generator=generator)
    return scores, labels


def _bits(array: Any) -> list[bytes]:
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind != "f":
        return [repr(v).encode() for v in flat.tolist()]
    return [struct.pack("<d", v) for v in flat.astype(np.float64).tolist()]


def _same_array(mine: Any, theirs: Any, what: str) -> None:
    assert type(mine) is type(theirs), what
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, what
    assert mine.flags.owndata == theirs.flags.owndata, what
    assert _bits(mine) == _bits(theirs), f"{what}: {mine!r} != {theirs!r}"


def _same_number(mine: Any, theirs: Any, what: str) -> None:
    assert type(mine) is type(theirs), what
    if isinstance(theirs, float | np.floating) and math.isnan(theirs):
        assert math.isnan(mine), what
    else:
        assert mine == theirs, what


def assert_same_boxes(mine: list[Any], theirs: list[Any]) -> None:
    """Equal box lists: every attribute, its type, dtype and bits (signs of zero included)."""
    assert type(mine) is type(theirs)
    assert len(mine) == len(theirs)
    for index, (box, expected) in enumerate(zip(mine, theirs, strict=True)):
        what = f"box {index}"
        assert type(box) is type(expected), what
        assert list(vars(box)) == list(vars(expected)), what
        _same_array(box.center, expected.center, f"{what} center")
        _same_array(box.wlh, expected.wlh, f"{what} wlh")
        _same_array(box.velocity, expected.velocity, f"{what} velocity")
        assert type(box.orientation) is type(expected.orientation), what
        assert list(vars(box.orientation)) == list(vars(expected.orientation)), what
        _same_array(box.orientation.q, expected.orientation.q, f"{what} orientation")
        _same_number(box.label, expected.label, f"{what} label")
        _same_number(box.score, expected.score, f"{what} score")
        assert (box.name, box.token) == (expected.name, expected.token), what
