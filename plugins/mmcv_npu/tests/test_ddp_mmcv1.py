"""DDP: mmcv 1.x's ``MMDistributedDataParallel`` forward on torch 2.13, in real processes.

mmcv 1.7.2's ``_run_ddp_forward`` reads ``_use_replicated_tensor_module``, which torch
>= 2.0 no longer sets: every ``forward`` of the wrapper raises ``AttributeError``.
Each test starts worker processes that run a CUDA-era script unchanged (``nccl``,
``.cuda()``) under the NPU emulator with ``ascend_patch_core.apply()``: the torch
plugin makes that ``hccl`` -- ``gloo`` under the emulator, whose NPU tensors are CPU
tensors -- and the mmcv plugin's default DDP group fixes the forward. Two ranks on
halves of a batch must give the gradients one process computes on the whole batch.

Runs in the nox session ``openmmlab1_emulated`` (mmcv 1.7.2); skipped where mmcv 1.x
is missing, a failure there (ASCEND_PATCH_TEST_REQUIRE=mmcv1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mmcv_stacks import require_module
from mmcv_stacks import require_stack


require_stack("mmcv1")
torch = require_module("torch", "mmcv1")

TARGET = "mmcv.parallel.distributed:MMDistributedDataParallel._run_ddp_forward"

WORKER = """
import sys

rank, world, init_file, out_file, patched = sys.argv[1:6]
rank, world, patched = int(rank), int(world), patched == "1"

import ascend_patch_emulator

ascend_patch_emulator.activate()
import ascend_patch_core

# Unpatched: everything but the group under test (the torch plugin still serves nccl, .cuda()).
if not patched:
    ascend_patch_core.default_patcher.disable("DDP")
report = ascend_patch_core.apply()

# From here on: a CUDA-era mmcv 1.x script, unchanged.
import torch
import torch.distributed as dist
from mmcv.parallel import MMDistributedDataParallel

dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
).cuda()
ddp = MMDistributedDataParallel(model)
batch = torch.randn(8, 4).cuda()
shard = batch.chunk(world)[rank]
result = {"backend": dist.get_backend()}
try:
    # Positional and keyword inputs both go through mmcv's _run_ddp_forward.
    out = ddp(shard)
    again = ddp(input=shard)
except AttributeError as error:
    result["error"] = str(error)
else:
    out.pow(2).mean().backward()
    result["out"] = out.detach()
    result["again"] = again.detach()
    result["grads"] = [p.grad for p in model.parameters()]
if patched:
    record = report.get("{target}")
    result["status"] = record.status.name
    result["note"] = record.note
torch.save(result, out_file)
dist.destroy_process_group()
""".replace("{target}", TARGET)


def run_ranks(tmp_path: Path, world: int, patched: bool) -> list[dict[str, Any]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    init_file = tmp_path / "init"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("ASCEND_PATCH_EMULATED_DEVICES", None)  # one emulated NPU per rank
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(world)]
    flag = "1" if patched else "0"
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), str(init_file), str(out), flag],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, out in enumerate(outs)
    ]
    logs = [worker.communicate(timeout=300)[0] for worker in workers]
    for worker, log in zip(workers, logs, strict=True):
        assert worker.returncode == 0, log
    return [torch.load(out) for out in outs]


def single_process_reference() -> tuple[Any, list[Any]]:
    """The same model and batch in one process, without DDP."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    batch = torch.randn(8, 4)
    out = model(batch)
    out.pow(2).mean().backward()
    return out.detach(), [p.grad for p in model.parameters()]


def test_without_the_group_the_forward_fails_on_this_torch(tmp_path: Path) -> None:
    """The bug the group fixes is real with mmcv 1.7.2 and the torch installed here."""
    (result,) = run_ranks(tmp_path, world=1, patched=False)
    assert "_use_replicated_tensor_module" in result["error"]


def test_two_ranks_match_one_process(tmp_path: Path) -> None:
    results = run_ranks(tmp_path, world=2, patched=True)
    ref_out, ref_grads = single_process_reference()
    for rank, result in enumerate(results):
        assert "error" not in result, result["error"]
        # Applied by default (no opt-in), and the collectives ran on the emulator's gloo.
        assert result["status"] == "APPLIED"
        assert result["backend"] == "gloo"
        shard = ref_out.chunk(2)[rank]
        torch.testing.assert_close(result["out"], shard, rtol=0, atol=0)
        torch.testing.assert_close(result["again"], shard, rtol=0, atol=0)
        # DDP averaged the ranks' gradients: the mean of two half-batch means is the
        # whole-batch mean, so the gradients equal the single-process ones.
        for got, want in zip(result["grads"], ref_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
