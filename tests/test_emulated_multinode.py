"""A two-node torchrun rehearsal on one machine, under ``ascend-patch run --emulate-npu``.

Two torchrun launchers play two nodes (``--nnodes 2``, c10d rendezvous on localhost,
two ranks each) running ``examples/torch_ddp_multinode/train.py``, an unmodified
CUDA-written DDP script (``torch.cuda.set_device(LOCAL_RANK)``, ``init_process_group
("nccl")``, ``model.cuda()``). All four ranks must train, agree on the loss (and on
the CPU reference run's), hold the same parameters, and reload rank 0's checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch


pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "torch_ddp_multinode" / "train.py"
#: What a torchrun rank prints when torch 2.13's gloo teardown aborts it after the
#: script has finished (seen in the unpatched reference runs too): worth one more try.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"
TIMEOUT = 600


def _ascend_patch() -> list[str]:
    script = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "ascend_patch_core._cli"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for name in ("ASCEND_PATCH_RUN", "ASCEND_PATCH_EMULATED_DEVICES", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    return env


def _launch_nodes(out_dir: Path) -> list[subprocess.CompletedProcess[str]]:
    """Both launchers at once, as two nodes would start; their outcomes."""
    port, run_id = _free_port(), f"rehearsal-{uuid.uuid4().hex[:8]}"
    launchers = []
    for node in (0, 1):
        command = [
            *_ascend_patch(),
            "run",
            "--emulate-npu",
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--local-addr",
            "127.0.0.1",
            str(SCRIPT),
            "--out-dir",
            str(out_dir),
        ]
        launchers.append(
            (
                command,
                subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=_env(),
                    cwd=out_dir.parent,
                ),
            )
        )
    results = []
    for command, process in launchers:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for _, other in launchers:
                other.kill()
            raise
        results.append(subprocess.CompletedProcess(command, process.returncode, stdout, stderr))
    return results


def _run_two_nodes(tmp_path: Path) -> Path:
    for attempt in range(2):  # one more try, only after the gloo teardown abort
        out_dir = tmp_path / f"emulated{attempt}"
        results = _launch_nodes(out_dir)
        failed = [r for r in results if r.returncode != 0]
        if not failed or not all(GLOO_TEARDOWN_ABORT in r.stderr for r in failed):
            break
    for result in results:
        assert result.returncode == 0, (
            f"{' '.join(result.args)} failed:\n{result.stdout}\n{result.stderr[-6000:]}"
        )
    return out_dir


def _reference(tmp_path: Path) -> dict[str, object]:
    """The same four ranks, unpatched, on the CPU with gloo (one launcher)."""
    out_dir = tmp_path / "reference"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        str(SCRIPT),
        "--device",
        "cpu",
        "--out-dir",
        str(out_dir),
    ]
    for _ in range(2):
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), check=False
        )
        if result.returncode == 0 or GLOO_TEARDOWN_ABORT not in result.stderr:
            break
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads((out_dir / "rank0.json").read_text())


def test_two_nodes_of_two_ranks_train_agree_and_reload_the_checkpoint(tmp_path):
    out_dir = _run_two_nodes(tmp_path)
    ranks = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(4)]
    reference = _reference(tmp_path)

    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {(r["node"], r["local_rank"]) for r in ranks} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert all(r["world"] == 4 for r in ranks)
    # Each rank saw one emulated NPU per rank of its node, so set_device(LOCAL_RANK) worked.
    assert all(r["device_count"] == 2 for r in ranks)
    # They trained: the loss fell, every rank agrees on it, and it is the CPU reference's.
    losses = ranks[0]["losses"]
    assert losses[-1] < losses[0]
    for r in ranks:
        assert r["losses"] == losses
        assert r["checksum"] == pytest.approx(ranks[0]["checksum"], rel=1e-12)
    assert losses == pytest.approx(reference["losses"], rel=1e-5)
    assert ranks[0]["checksum"] == pytest.approx(reference["checksum"], rel=1e-5)
    # Rank 0's checkpoint reloads on every rank, and in a plain process.
    assert all(r["checkpoint_reloads"] for r in ranks)
    state = torch.load(out_dir / "checkpoint.pt", map_location="cpu")
    checksum = sum(t.double().sum().item() for t in state["model"].values())
    assert checksum == pytest.approx(ranks[0]["checksum"], rel=1e-12)
