"""The quaternions of the NuScenes groups equal pyquaternion's, bit for bit.

mmdet3d builds ``Quaternion(axis=[0, 0, 1], radians=yaw)`` per LiDAR box and
``Quaternion(axis=[1, 0, 0], radians=pi / 2) * Quaternion(axis=[0, 0, 1], radians=-yaw)``
per camera box; :mod:`ascend_patch_mmcv.nuscenes_kernels` computes them for a whole frame.
Needs pyquaternion (the mmdet3d stack of the nox session ``openmmlab_cpu_ops``).
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mmcv_stacks import require_module


np = require_module("numpy", "mmdet3d")
pyquaternion = require_module("pyquaternion", "mmdet3d")

from ascend_patch_mmcv.nuscenes_kernels import camera_quaternions  # noqa: E402
from ascend_patch_mmcv.nuscenes_kernels import yaw_quaternions  # noqa: E402


Quaternion = pyquaternion.Quaternion
EDGES = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -3e-39, math.pi, -math.pi, 1e4, -2.5e7, 3.4e38]


def bits(values: object) -> list[bytes]:
    """Each element's IEEE bytes: equal bits, signs of zero included."""
    return [struct.pack("<d", v) for v in np.asarray(values, np.float64).reshape(-1).tolist()]


def lidar_reference(yaw: object) -> object:
    return np.array([Quaternion(axis=[0, 0, 1], radians=y).q for y in yaw]).reshape(-1, 4)


def camera_reference(yaw: object) -> object:
    turn = Quaternion(axis=[1, 0, 0], radians=np.pi / 2)
    rows = [(turn * Quaternion(axis=[0, 0, 1], radians=y)).q for y in -yaw]
    return np.array(rows).reshape(-1, 4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_edge_yaws_give_pyquaternions_elements(dtype: str) -> None:
    with np.errstate(over="ignore"):
        yaw = np.array([*EDGES, float("nan")], dtype=dtype)
    yaw = yaw[~np.isinf(yaw)]  # float16 overflows on the largest
    assert bits(yaw_quaternions(yaw)) == bits(lidar_reference(yaw))
    assert bits(camera_quaternions(yaw)) == bits(camera_reference(yaw))


@given(st.lists(st.floats(allow_infinity=False, width=32), max_size=40))
def test_random_yaws_give_pyquaternions_elements(values: list[float]) -> None:
    yaw = np.array(values, dtype=np.float32)
    assert bits(yaw_quaternions(yaw)) == bits(lidar_reference(yaw))
    assert bits(camera_quaternions(yaw)) == bits(camera_reference(yaw))


def test_no_yaw_gives_no_rows() -> None:
    empty = np.zeros(0, np.float32)
    assert yaw_quaternions(empty).shape == (0, 4)
    assert camera_quaternions(empty).shape == (0, 4)


def test_infinite_yaw_raises_as_pyquaternion_does() -> None:
    yaw = np.array([0.5, np.inf], np.float32)
    with pytest.raises(ValueError, match="math domain error") as expected:
        lidar_reference(yaw)
    with pytest.raises(ValueError, match=str(expected.value)):
        yaw_quaternions(yaw)
