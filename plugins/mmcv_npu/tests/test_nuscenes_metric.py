"""NuScenesMetric on mmdet3d 1.4.0: the patched ``output_to_nusc_box`` makes mmdet3d's own boxes.

Runs in the nox session ``openmmlab_cpu_ops`` (mmdet3d imports ``mmcv.ops``, so it
needs mmcv with its compiled ops); elsewhere it skips. Each case converts the same
random detections with the original and with the patched function and compares every
box attribute bit for bit; the submission file ``NuScenesMetric`` writes is compared
byte for byte, through ``ascend_patch_core.apply()`` as a user runs it.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")
require_stack("mmdet3d")

import torch  # noqa: E402
from ascend_patch_mmcv.groups import NuScenesDataset  # noqa: E402
from ascend_patch_mmcv.groups import NuScenesMetric  # noqa: E402
from mmdet3d.evaluation.metrics import nuscenes_metric  # noqa: E402
from mmdet3d.structures import CameraInstance3DBoxes  # noqa: E402
from mmdet3d.structures import DepthInstance3DBoxes  # noqa: E402
from mmdet3d.structures import LiDARInstance3DBoxes  # noqa: E402
from nuscenes_detections import assert_same_boxes  # noqa: E402
from nuscenes_detections import box_tensor  # noqa: E402
from nuscenes_detections import scores_and_labels  # noqa: E402

from ascend_patch_core import Status  # noqa: E402


TARGET = "mmdet3d.evaluation.metrics.nuscenes_metric:output_to_nusc_box"
ORIGINAL = nuscenes_metric.output_to_nusc_box
HERE = Path(__file__).resolve().parent
CLASSES = [
    "car",
    "truck",
    "trailer",
    "bus",
    "construction_vehicle",
    "bicycle",
    "motorcycle",
    "pedestrian",
    "traffic_cone",
    "barrier",
]


def detection(boxes_class: type, count: int, columns: int, seed: int, attrs: bool = False) -> Any:
    scores, labels = scores_and_labels(count, seed)
    result = {
        "bboxes_3d": boxes_class(box_tensor(count, columns, seed), box_dim=columns),
        "scores_3d": scores,
        "labels_3d": labels,
    }
    if attrs:
        result["attr_labels"] = torch.arange(count) % 9
    return result


def patched(isolated_patcher: Any) -> Any:
    isolated_patcher.add(NuScenesMetric).apply()
    assert isolated_patcher.report.get(TARGET).status is Status.APPLIED
    function = nuscenes_metric.output_to_nusc_box
    assert function is not ORIGINAL
    return function


def counters(isolated_patcher: Any) -> tuple[int, int]:
    record = isolated_patcher.report.get(TARGET).counters
    return record.replacement_calls, record.fallback_calls


@pytest.mark.parametrize("count", [0, 1, 7, 300])
@pytest.mark.parametrize("columns", [7, 9], ids=["no-velocity", "velocity"])
@pytest.mark.parametrize("attrs", [False, True], ids=["", "attrs"])
def test_lidar_boxes_are_the_originals(
    isolated_patcher: Any, count: int, columns: int, attrs: bool
) -> None:
    function = patched(isolated_patcher)
    mine, mine_attrs = function(detection(LiDARInstance3DBoxes, count, columns, count, attrs))
    theirs, their_attrs = ORIGINAL(detection(LiDARInstance3DBoxes, count, columns, count, attrs))
    assert_same_boxes(mine, theirs)
    assert (mine_attrs is None) == (their_attrs is None)
    assert mine_attrs is None or (mine_attrs == their_attrs).all()
    assert counters(isolated_patcher) == (1, 0)


@pytest.mark.parametrize("count", [0, 1, 7, 300])
def test_camera_boxes_are_the_originals(isolated_patcher: Any, count: int) -> None:
    """The metric's camera branch (mono detectors such as FCOS3D)."""
    function = patched(isolated_patcher)
    mine_input = detection(CameraInstance3DBoxes, count, 9, count, attrs=True)
    their_input = detection(CameraInstance3DBoxes, count, 9, count, attrs=True)
    before = their_input["bboxes_3d"].tensor.clone()
    (mine, mine_attrs), (theirs, their_attrs) = function(mine_input), ORIGINAL(their_input)
    assert_same_boxes(mine, theirs)
    assert (mine_attrs == their_attrs).all()
    # mmdet3d 1.4 leaves the input alone (1.0's mono dataset did not): so does the patch.
    assert torch.equal(mine_input["bboxes_3d"].tensor, before)
    assert counters(isolated_patcher) == (1, 0)


def test_labels_and_scores_of_other_dtypes_are_converted_as_box_does(
    isolated_patcher: Any,
) -> None:
    """Float labels and scores with NaN: Box keeps a NaN as it came, converts the rest."""
    function = patched(isolated_patcher)
    results = []
    for convert in (function, ORIGINAL):
        item = detection(LiDARInstance3DBoxes, 6, 9, 3)
        item["labels_3d"] = item["labels_3d"].double()
        item["labels_3d"][1] = float("nan")
        item["scores_3d"] = item["scores_3d"].half()
        item["scores_3d"][2] = float("nan")
        results.append(convert(item)[0])
    assert_same_boxes(*results)


def test_what_the_original_rejects_goes_to_it(isolated_patcher: Any) -> None:
    """Its own error, as without the patch; each such call counts as a fallback."""
    function = patched(isolated_patcher)
    nan_centre = detection(LiDARInstance3DBoxes, 3, 9, 1)
    nan_centre["bboxes_3d"].tensor[1, 2] = float("nan")
    infinite_yaw = detection(LiDARInstance3DBoxes, 3, 9, 1)
    infinite_yaw["bboxes_3d"].tensor[2, 6] = float("inf")
    cases = [
        (nan_centre, AssertionError),
        (infinite_yaw, ValueError),
        (detection(DepthInstance3DBoxes, 3, 7, 1), NotImplementedError),
        (detection(CameraInstance3DBoxes, 3, 7, 1), IndexError),  # no velocity columns
    ]
    for item, error in cases:
        with pytest.raises(error) as theirs:
            ORIGINAL(item)
        with pytest.raises(error) as mine:
            function(item)
        assert str(mine.value) == str(theirs.value)
    assert counters(isolated_patcher) == (0, len(cases))


def test_an_infinite_centre_is_converted_by_the_original(isolated_patcher: Any) -> None:
    """Valid for the original (Box only asserts on NaN): it converts such boxes itself."""
    function = patched(isolated_patcher)
    results = []
    for convert in (function, ORIGINAL):
        item = detection(LiDARInstance3DBoxes, 4, 9, 2)
        item["bboxes_3d"].tensor[0, 0] = float("inf")
        results.append(convert(item)[0])
    assert_same_boxes(*results)
    assert counters(isolated_patcher) == (0, 1)


def test_revert_puts_the_original_back(isolated_patcher: Any) -> None:
    patched(isolated_patcher)
    isolated_patcher.revert()
    assert nuscenes_metric.output_to_nusc_box is ORIGINAL


def test_dataset_group_is_reported_as_not_for_this_mmdet3d(isolated_patcher: Any) -> None:
    """mmdet3d 1.1+ has no ``datasets.nuscenes_dataset.output_to_nusc_box``: said, not hidden."""
    isolated_patcher.add(NuScenesDataset).apply()
    record = isolated_patcher.report.get("NuScenesDataset")
    assert record.status is Status.SKIPPED
    assert "mmdet3d>=1.0.0rc0,<1.1.0rc0" in record.reason
    assert "1.4.0" in record.reason


def test_the_1_0_names_build_the_groups() -> None:
    """A DrivingSDK-patcher 1.0 script: ``Patch(nuscenes_metric)`` in a ``PatcherBuilder``."""
    from ascend_patch_core import Patch
    from ascend_patch_core import PatcherBuilder
    from ascend_patch_core import nuscenes_dataset
    from ascend_patch_core import nuscenes_metric as legacy_metric

    assert nuscenes_dataset.__ascend_patch_group__ is NuScenesDataset
    assert legacy_metric.__ascend_patch_group__ is NuScenesMetric
    builder = PatcherBuilder().add_module_patch(
        "mmdet3d", Patch(legacy_metric), Patch(nuscenes_dataset)
    )
    patcher = builder.build()
    try:
        patcher.apply()
        assert patcher.report.get(TARGET).status is Status.APPLIED
        assert nuscenes_metric.output_to_nusc_box is not ORIGINAL
    finally:
        patcher.revert()
    assert nuscenes_metric.output_to_nusc_box is ORIGINAL


def nuscenes_infos(path: Path, frames: int) -> None:
    """An annotation file with what ``_format_lidar_bbox`` reads: token and two poses."""
    infos = []
    for frame in range(frames):
        turn = torch.tensor(0.3 * frame)
        pose = torch.eye(4, dtype=torch.float64)
        pose[:2, :2] = torch.tensor(
            [[torch.cos(turn), -torch.sin(turn)], [torch.sin(turn), torch.cos(turn)]]
        )
        pose[:3, 3] = torch.tensor([100.0 + frame, -50.0, 1.5])
        infos.append(
            {
                "token": f"sample-{frame}",
                "lidar_points": {"lidar2ego": torch.eye(4).tolist()},
                "ego2global": pose.tolist(),
            }
        )
    with path.open("wb") as handle:
        pickle.dump({"data_list": infos, "metainfo": {}}, handle)


SUBMISSION_SCRIPT = """\
import json, pickle, sys
import ascend_patch_core

report = ascend_patch_core.apply() if sys.argv[1] == "patched" else None
from mmdet3d.evaluation.metrics import NuScenesMetric

with open(sys.argv[2], "rb") as handle:
    results = pickle.load(handle)
metric = NuScenesMetric(
    data_root=sys.argv[3], ann_file=sys.argv[4], format_only=True, jsonfile_prefix=sys.argv[5]
)
metric.dataset_meta = {"classes": json.loads(sys.argv[6]), "version": "v1.0-mini"}
metric.compute_metrics(results)
if report is not None:
    record = report.get("mmdet3d.evaluation.metrics.nuscenes_metric:output_to_nusc_box")
    counters = record.counters
    print(json.dumps([record.status.name, record.note, counters.replacement_calls,
                      counters.fallback_calls]))
"""


def test_metric_writes_the_same_submission_under_apply(tmp_path: Path) -> None:
    """The user's way: apply() with the plugin installed, NuScenesMetric formats results."""
    frames = 4
    infos = tmp_path / "nuscenes_infos_val.pkl"
    nuscenes_infos(infos, frames)
    results = [
        {
            "pred_instances_3d": detection(LiDARInstance3DBoxes, count, 9, frame),
            "pred_instances": {},
            "sample_idx": frame,
        }
        for frame, count in enumerate((0, 1, 40, 300))
    ]
    results_file = tmp_path / "results.pkl"
    with results_file.open("wb") as handle:
        pickle.dump(results, handle)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(HERE)}
    outputs = {}
    for mode in ("unpatched", "patched"):
        prefix = tmp_path / mode
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                SUBMISSION_SCRIPT,
                mode,
                str(results_file),
                str(tmp_path),
                str(infos),
                str(prefix),
                json.dumps(CLASSES),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        submission = prefix / "pred_instances_3d" / "results_nusc.json"
        outputs[mode] = (submission.read_bytes(), done.stdout.strip().splitlines()[-1])
    assert outputs["patched"][0] == outputs["unpatched"][0]
    assert len(json.loads(outputs["patched"][0])["results"]["sample-3"]) > 0
    status, note, replaced, fell_back = json.loads(outputs["patched"][1])
    assert (status, replaced, fell_back) == ("APPLIED", frames, 0)
    assert "vectorised" in note
