"""NuScenesDataset on the mmdet3d 1.0.0rc line (mmcv 1.x), against that line's own functions.

mmdet3d 1.0.0rc cannot be installed beside mmcv 2.x, so each test builds a stand-in
``mmdet3d`` package in ``tmp_path``, with a ``mmdet3d-<version>.dist-info`` so that the
group's ``requires`` sees that version, and runs ``ascend_patch_core.apply()`` in a
subprocess where it shadows the installed mmdet3d. The stand-in's two target functions
are the **1.0.0rc6 and 1.0.0rc0 sources** of ``output_to_nusc_box`` (code verbatim,
docstrings and comments left out); its box classes are a **minimal replica** of
mmdet3d 1.0.0rc6's (``tensor``, ``dims``, ``yaw``, ``gravity_center``, ``len``, as in
``mmdet3d/core/bbox/structures``). The oracle is the same source executed again, unpatched.
Needs torch, pyquaternion and nuscenes-devkit (the mmdet3d stack of ``openmmlab_cpu_ops``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mmcv_stacks import require_module


require_module("torch", "mmdet3d")
require_module("pyquaternion", "mmdet3d")
require_module("nuscenes.utils.data_classes", "mmdet3d")

HERE = Path(__file__).resolve().parent

# mmdet3d 1.0.0rc6, mmdet3d/datasets/nuscenes_dataset.py (Apache-2.0, (c) OpenMMLab).
RC6_DATASET = """\
def output_to_nusc_box(detection, with_velocity=True):
    box3d = detection['boxes_3d']
    scores = detection['scores_3d'].numpy()
    labels = detection['labels_3d'].numpy()

    box_gravity_center = box3d.gravity_center.numpy()
    box_dims = box3d.dims.numpy()
    box_yaw = box3d.yaw.numpy()

    nus_box_dims = box_dims[:, [1, 0, 2]]

    box_list = []
    for i in range(len(box3d)):
        quat = pyquaternion.Quaternion(axis=[0, 0, 1], radians=box_yaw[i])
        if with_velocity:
            velocity = (*box3d.tensor[i, 7:9], 0.0)
        else:
            velocity = (0, 0, 0)
        box = NuScenesBox(
            box_gravity_center[i],
            nus_box_dims[i],
            quat,
            label=labels[i],
            score=scores[i],
            velocity=velocity)
        box_list.append(box)
    return box_list
"""

# mmdet3d 1.0.0rc0, the same file: no ``with_velocity`` yet.
RC0_DATASET = """\
def output_to_nusc_box(detection):
    box3d = detection['boxes_3d']
    scores = detection['scores_3d'].numpy()
    labels = detection['labels_3d'].numpy()

    box_gravity_center = box3d.gravity_center.numpy()
    box_dims = box3d.dims.numpy()
    box_yaw = box3d.yaw.numpy()

    nus_box_dims = box_dims[:, [1, 0, 2]]

    box_list = []
    for i in range(len(box3d)):
        quat = pyquaternion.Quaternion(axis=[0, 0, 1], radians=box_yaw[i])
        velocity = (*box3d.tensor[i, 7:9], 0.0)
        box = NuScenesBox(
            box_gravity_center[i],
            nus_box_dims[i],
            quat,
            label=labels[i],
            score=scores[i],
            velocity=velocity)
        box_list.append(box)
    return box_list
"""

# mmdet3d 1.0.0rc6 (and rc0), mmdet3d/datasets/nuscenes_mono_dataset.py.
RC_MONO_DATASET = """\
def output_to_nusc_box(detection):
    box3d = detection['boxes_3d']
    scores = detection['scores_3d'].numpy()
    labels = detection['labels_3d'].numpy()
    attrs = None
    if 'attrs_3d' in detection:
        attrs = detection['attrs_3d'].numpy()

    box_gravity_center = box3d.gravity_center.numpy()
    box_dims = box3d.dims.numpy()
    box_yaw = box3d.yaw.numpy()

    box_dims[:, [0, 1, 2]] = box_dims[:, [2, 0, 1]]
    box_yaw = -box_yaw

    box_list = []
    for i in range(len(box3d)):
        q1 = pyquaternion.Quaternion(axis=[0, 0, 1], radians=box_yaw[i])
        q2 = pyquaternion.Quaternion(axis=[1, 0, 0], radians=np.pi / 2)
        quat = q2 * q1
        velocity = (box3d.tensor[i, 7], 0.0, box3d.tensor[i, 8])
        box = NuScenesBox(
            box_gravity_center[i],
            box_dims[i],
            quat,
            label=labels[i],
            score=scores[i],
            velocity=velocity)
        box_list.append(box)
    return box_list, attrs
"""

# A minimal replica of mmdet3d 1.0.0rc6's box classes: what output_to_nusc_box reads.
REPLICA_BOXES = """\
import torch


class BaseInstance3DBoxes:
    def __init__(self, tensor, box_dim=7):
        self.tensor = tensor
        self.box_dim = box_dim

    def __len__(self):
        return self.tensor.shape[0]

    @property
    def dims(self):
        return self.tensor[:, 3:6]

    @property
    def yaw(self):
        return self.tensor[:, 6]

    @property
    def bottom_center(self):
        return self.tensor[:, :3]


class LiDARInstance3DBoxes(BaseInstance3DBoxes):
    @property
    def gravity_center(self):
        bottom_center = self.bottom_center
        gravity_center = torch.zeros_like(bottom_center)
        gravity_center[:, :2] = bottom_center[:, :2]
        gravity_center[:, 2] = bottom_center[:, 2] + self.tensor[:, 5] * 0.5
        return gravity_center


class CameraInstance3DBoxes(BaseInstance3DBoxes):
    @property
    def gravity_center(self):
        bottom_center = self.bottom_center
        gravity_center = torch.zeros_like(bottom_center)
        gravity_center[:, [0, 2]] = bottom_center[:, [0, 2]]
        gravity_center[:, 1] = bottom_center[:, 1] - self.tensor[:, 4] * 0.5
        return gravity_center
"""

IMPORTS = """\
import numpy as np
import pyquaternion
from nuscenes.utils.data_classes import Box as NuScenesBox

from ..boxes import CameraInstance3DBoxes, LiDARInstance3DBoxes


"""

# Runs in the subprocess: apply(), then each replacement against the unpatched source.
SCRIPT = '''\
import json
import sys

import torch

import ascend_patch_core

report = ascend_patch_core.apply()

import mmdet3d.datasets.nuscenes_dataset as dataset
import mmdet3d.datasets.nuscenes_mono_dataset as mono_dataset
from mmdet3d.boxes import CameraInstance3DBoxes, LiDARInstance3DBoxes
from nuscenes_detections import assert_same_boxes, box_tensor, scores_and_labels


def unpatched(module):
    """The module's function, its source executed again in a namespace of its own."""
    namespace = {"__name__": module.__name__ + "_unpatched", "__package__": module.__package__}
    with open(module.__file__) as source:
        exec(compile(source.read(), module.__file__, "exec"), namespace)
    return namespace["output_to_nusc_box"]


def detection(boxes_class, count, columns, seed, attrs=False):
    scores, labels = scores_and_labels(count, seed)
    result = {
        "boxes_3d": boxes_class(box_tensor(count, columns, seed)),
        "scores_3d": scores,
        "labels_3d": labels,
    }
    if attrs:
        result["attrs_3d"] = torch.arange(count) % 3
    return result


lidar, camera = unpatched(dataset), unpatched(mono_dataset)
assert dataset.output_to_nusc_box is not lidar, "not patched"
with_velocity = sys.argv[1] == "with_velocity"
calls = []
for count in (0, 1, 5, 300):
    for columns in (7, 9):
        options = [{}] + ([{"with_velocity": False}, {"with_velocity": True}] if with_velocity else [])
        for kwargs in options:
            mine = dataset.output_to_nusc_box(detection(LiDARInstance3DBoxes, count, columns, count), **kwargs)
            theirs = lidar(detection(LiDARInstance3DBoxes, count, columns, count), **kwargs)
            assert_same_boxes(mine, theirs)
    for attrs in (False, True):
        mine_input = detection(CameraInstance3DBoxes, count, 9, count, attrs)
        their_input = detection(CameraInstance3DBoxes, count, 9, count, attrs)
        (mine, mine_attrs), (theirs, their_attrs) = (
            mono_dataset.output_to_nusc_box(mine_input), camera(their_input))
        assert_same_boxes(mine, theirs)
        assert (mine_attrs is None) == (their_attrs is None)
        assert mine_attrs is None or (mine_attrs == their_attrs).all()
        # Upstream swaps the dims columns of the box tensor in place; so does the patch.
        assert torch.equal(mine_input["boxes_3d"].tensor, their_input["boxes_3d"].tensor)

# Input the original rejects goes to it: its own error.
broken = detection(LiDARInstance3DBoxes, 4, 9, 1)
broken["boxes_3d"].tensor[2, 0] = float("nan")
for function in (dataset.output_to_nusc_box, lidar):
    try:
        function(broken)
    except AssertionError:
        calls.append("AssertionError")
narrow = detection(CameraInstance3DBoxes, 2, 7, 1)
for function in (mono_dataset.output_to_nusc_box, camera):
    try:
        function(narrow)
    except IndexError:
        calls.append("IndexError")

def counters(target):
    record = report.get(target)
    return [record.status.name, record.counters.replacement_calls, record.counters.fallback_calls]

groups = {r.name: [r.status.name, r.reason] for r in report.records if r.name.startswith("NuScenes")}
print(json.dumps({
    "dataset": counters("mmdet3d.datasets.nuscenes_dataset:output_to_nusc_box"),
    "mono": counters("mmdet3d.datasets.nuscenes_mono_dataset:output_to_nusc_box"),
    "errors": calls,
    "groups": groups,
}))
'''


def fake_mmdet3d(root: Path, version: str, dataset_function: str) -> None:
    """A ``mmdet3d`` package of the 1.0.0rc layout, reported by metadata as ``version``."""
    package = root / "mmdet3d"
    (package / "datasets").mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "boxes.py").write_text(REPLICA_BOXES)
    (package / "datasets" / "__init__.py").write_text("")
    (package / "datasets" / "nuscenes_dataset.py").write_text(IMPORTS + dataset_function)
    (package / "datasets" / "nuscenes_mono_dataset.py").write_text(IMPORTS + RC_MONO_DATASET)
    info = root / f"mmdet3d-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mmdet3d\nVersion: {version}\n")


def run_apply(root: Path, argument: str) -> dict[str, object]:
    script = root / "check_rc_line.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "ASCEND_PATCH_CACHE": "0",
        "ASCEND_PATCH_STRICT": "0",
    }
    done = subprocess.run(
        [sys.executable, str(script), argument],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("version", "source", "argument"),
    [("1.0.0rc6", RC6_DATASET, "with_velocity"), ("1.0.0rc0", RC0_DATASET, "no_with_velocity")],
)
def test_dataset_group_gives_the_rc_lines_own_boxes(
    tmp_path: Path, version: str, source: str, argument: str
) -> None:
    fake_mmdet3d(tmp_path, version, source)
    result = run_apply(tmp_path, argument)
    # Every call that the runtime check admits ran the replacement; the rejected
    # ones ran the original, which raised its own error, as unpatched.
    lidar_calls = 4 * 2 * (3 if argument == "with_velocity" else 1)
    assert result["dataset"] == ["APPLIED", lidar_calls, 1]
    assert result["mono"] == ["APPLIED", 4 * 2, 1]
    assert result["errors"] == ["AssertionError"] * 2 + ["IndexError"] * 2
    groups = result["groups"]
    assert isinstance(groups, dict)
    assert groups["NuScenesMetric"][0] == "SKIPPED"
    assert "mmdet3d" in groups["NuScenesMetric"][1]
