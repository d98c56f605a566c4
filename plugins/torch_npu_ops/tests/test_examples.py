"""The CUDA-written examples run unmodified under ``ascend-patch run --emulate-npu``.

Each example runs twice in fresh processes: the unpatched CPU reference
(``--device cpu``) and the patched run of its ``migrate_to_ascend/train.py`` on the
emulated NPU. They must reach the same losses, and the run report must show the
CUDA calls that were redirected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _ascend_patch() -> list[str]:
    script = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "ascend_patch_core._cli"]


#: What a torchrun rank prints when torch 2.13's gloo teardown aborts it after the
#: script has finished (seen in ~1 of 12 runs of the *unpatched* reference on this
#: machine, with destroy_process_group() called): not what these tests are about.
_GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def _run(command, cwd):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("ASCEND_PATCH_RUN", None)
    for _ in range(2):  # one more try, only after that teardown abort
        result = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env, check=False
        )
        if result.returncode == 0 or _GLOO_TEARDOWN_ABORT not in result.stderr:
            break
    assert result.returncode == 0, (
        f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr[-6000:]}"
    )
    return result


def _compare(reference, emulated):
    assert len(reference) == len(emulated)
    for ref, npu in zip(reference, emulated, strict=True):
        assert ref.keys() == npu.keys()
        for key, value in ref.items():
            if isinstance(value, float):
                assert npu[key] == pytest.approx(value, rel=1e-5), (key, ref, npu)
            else:
                assert npu[key] == value


def _counters(report_path):
    report = json.loads(Path(report_path).read_text())
    counts = {}
    for process in report["processes"]:
        for record in process["report"]["records"]:
            if record.get("counters"):
                counts[record["name"]] = (
                    counts.get(record["name"], 0) + record["counters"]["replacement_calls"]
                )
    return counts


def _example(name, tmp_path, *, torchrun=False, extra=()):
    example = EXAMPLES / name
    launcher = TORCHRUN if torchrun else []
    _run(
        [
            sys.executable,
            *launcher,
            str(example / "train.py"),
            "--device",
            "cpu",
            "--out",
            "ref.json",
            *extra,
        ],
        tmp_path,
    )
    _run(
        [
            *_ascend_patch(),
            "run",
            "--emulate-npu",
            "--report",
            "report.json",
            *(["-m", *launcher[1:]] if torchrun else []),
            str(example / "migrate_to_ascend" / "train.py"),
            "--out",
            "npu.json",
            *extra,
        ],
        tmp_path,
    )
    reference = json.loads((tmp_path / "ref.json").read_text())
    emulated = json.loads((tmp_path / "npu.json").read_text())
    _compare(reference, emulated)
    return _counters(tmp_path / "report.json")


def test_amp_training_loop(tmp_path):
    # A checkpoint path naming "cuda": transfer_to_npu would have written .../npu_model.pt.
    counts = _example("torch_amp_loop", tmp_path, extra=("--checkpoint", "cuda_run/cuda_model.pt"))
    assert (tmp_path / "cuda_run" / "cuda_model.pt").is_file()
    assert counts["torch.Tensor.cuda"] > 0
    assert counts["torch.nn.modules.module.Module.cuda"] == 1
    assert counts["torch.amp.grad_scaler.GradScaler.__init__"] == 1
    assert counts["torch.amp.autocast_mode.autocast.__init__"] > 0
    assert counts["torch.cuda.synchronize"] > 0
    assert counts["torch.serialization.load"] == 1


def test_ddp_with_nccl_under_torchrun(tmp_path):
    counts = _example(
        "torch_ddp", tmp_path, torchrun=True, extra=("--checkpoint", "ckpt/ddp_cuda.pt")
    )
    assert counts["torch.distributed.distributed_c10d.init_process_group"] == 2  # one per rank
    assert counts["torch.distributed.distributed_c10d.is_nccl_available"] == 2
    assert counts["torch.nn.parallel.distributed.DistributedDataParallel.__init__"] == 2
    assert counts["torch.serialization.load"] == 2


def test_dataloader_with_spawned_workers(tmp_path):
    counts = _example("torch_dataloader_spawn", tmp_path)
    assert counts["torch.Tensor.cuda"] > 0


@pytest.mark.parametrize(("name", "torchrun"), [("torch_amp_loop", False), ("torch_ddp", True)])
def test_examples_leave_nothing_in_the_working_directory(name, torchrun, tmp_path):
    """Run as a user runs them (no --checkpoint): no checkpoints/ left where they ran."""
    launcher = TORCHRUN if torchrun else []
    script = EXAMPLES / name / "train.py"
    _run([sys.executable, *launcher, str(script), "--device", "cpu", "--epochs", "1"], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
