"""Tiny mmdet detectors train a step and predict under ``ascend-patch run --emulate-npu``.

The programs (``programs/``) are CUDA-style code (``.cuda()``), run unmodified: the
torch plugin moves them to the (emulated) NPU, the mmcv plugin's default groups serve
mmcv's ops, and the run report must show each group's replacement ran (counters > 0).
Runs in the nox session ``openmmlab_cpu_ops`` (mmdet needs mmcv.ops). Emulated: the
numbers say the code paths run and the losses are finite, not how fast an NPU is.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")
require_stack("mmdet")

PROGRAMS = Path(__file__).parent / "programs"


def _cli() -> list[str]:
    script = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "ascend_patch_core._cli"]


def _run(program: str, tmp_path: Path) -> tuple[str, dict[str, dict]]:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [*_cli(), "run", "--emulate-npu", "--report", str(report), str(PROGRAMS / program)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(report.read_text())
    records = data["processes"][0]["report"]["records"]
    by_target = {r["target"]: r for r in records if r["kind"] == "patch"}
    return done.stdout, by_target


def _calls(records: dict[str, dict], target: str) -> int:
    record = records[target]
    assert record["status"] == "applied", record
    return record["counters"]["replacement_calls"]


def _loss(stdout: str) -> float:
    line = next(line for line in stdout.splitlines() if line.startswith("loss "))
    return float(line.split()[1])


@pytest.mark.slow
def test_deformable_detr_trains_and_predicts_on_the_emulated_npu(tmp_path):
    stdout, records = _run("deformable_detr_step.py", tmp_path)
    assert math.isfinite(_loss(stdout)) and "boxes (10, 4)" in stdout
    msda = "mmcv.ops.multi_scale_deform_attn:MultiScaleDeformableAttnFunction.apply"
    assert records[msda]["note"] == "kernel: mx_driving"
    assert _calls(records, msda) > 0
    assert _calls(records, "mmdet.models.backbones.resnet:BasicBlock.forward") > 0
    assert _calls(records, "mmdet.models.backbones.resnet:ResNet.forward") > 0
    assert _calls(records, "mmcv.ops.focal_loss:sigmoid_focal_loss") > 0


@pytest.mark.slow
def test_retinanet_trains_and_predicts_on_the_emulated_npu(tmp_path):
    stdout, records = _run("retinanet_step.py", tmp_path)
    assert math.isfinite(_loss(stdout))
    assert _calls(records, "mmdet.models.backbones.resnet:BasicBlock.forward") > 0
    assert _calls(records, "mmdet.models.backbones.resnet:ResNet.forward") > 0
    assert _calls(records, "mmcv.ops.focal_loss:sigmoid_focal_loss") > 0


@pytest.mark.slow
def test_an_mmengine_runner_trains_and_brakes_on_the_emulated_npu(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            *_cli(),
            "run",
            "--emulate-npu",
            "--brake-at",
            "3",
            "--report",
            str(report),
            str(PROGRAMS / "mmengine_runner_train.py"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # 20 iterations asked for; the brake stops the Runner after 3, on the emulated NPU.
    assert "on_npu True iterations 3" in done.stdout
    records = json.loads(report.read_text())["processes"][0]["report"]["records"]
    by_target = {r["target"]: r for r in records if r["kind"] == "patch"}
    msda = "mmcv.ops.multi_scale_deform_attn:MultiScaleDeformableAttnFunction.apply"
    assert _calls(by_target, msda) == 3
    assert _calls(by_target, "mmcv.ops.modulated_deform_conv:modulated_deform_conv2d") == 3
    # clip_grad is set: every step went through the OptimizerWrapper patch (a plain
    # SGD has no fused clip, so mmengine's own clipping ran: a fallback).
    wrapper = by_target["mmengine.optim.optimizer.optimizer_wrapper:OptimWrapper._clip_grad"]
    assert wrapper["counters"]["fallback_calls"] == 3
    (brake,) = [r for r in records if r["kind"] == "setting" and r["name"].startswith("brake")]
    assert brake["status"] == "applied"
