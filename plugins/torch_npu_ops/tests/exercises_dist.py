"""Exercises of the torch.distributed and profiler items for test_every_item_runs.py."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist
from exercise_kit import C0
from exercise_kit import T0
from exercise_kit import Ctx
from exercise_kit import exercise
from exercise_kit import npu


# --------------------------------------------------------------------------- torch.distributed


@exercise(
    "torch.distributed.distributed_c10d.init_process_group", "torch.distributed.init_process_group"
)
def _init(fn: Any, ctx: Ctx) -> None:
    with ctx.process_group():
        assert dist.get_backend() == "gloo"  # hccl, which the emulator runs on gloo
        tensor = torch.ones(2, device="cuda")
        dist.all_reduce(tensor)
        assert tensor.tolist() == [1.0, 1.0]
        assert (ctx.tmp_path / "nccl_cuda").exists()  # the store kept its path


@exercise("torch.distributed.distributed_c10d.new_group")
def _new_group(fn: Any, ctx: Ctx) -> None:
    with ctx.process_group():
        tensor = torch.full((2,), 2.0, device="cuda")
        dist.all_reduce(tensor, group=dist.new_group([0], backend="nccl"))
        assert tensor.tolist() == [2.0, 2.0]


@exercise("torch.distributed.distributed_c10d.is_nccl_available")
def _is_nccl_available(fn: Any, ctx: Ctx) -> None:
    assert dist.is_nccl_available() and dist.distributed_c10d.is_nccl_available()


@exercise("torch.nn.parallel.distributed.DistributedDataParallel.__init__")
def _ddp(fn: Any, ctx: Ctx) -> None:
    with ctx.process_group():
        model = torch.nn.Linear(4, 2).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], output_device=C0)
        ddp(torch.randn(3, 4, device="cuda")).sum().backward()
        assert npu(model.weight.grad) is not None
        # Dropped while the process group still holds the backend. Dropped after
        # destroy_process_group(), DDP's Reducer holds the last reference, and freeing
        # it joins gloo's worker threads with the GIL held (torch's process-group
        # bindings release the GIL on destruction, the Reducer's does not): a hang
        # whenever a worker still needs the GIL to free its last work. It hung a full
        # `dev.py test` run once (py-spy: the main thread in ~ProcessGroupGloo's join,
        # a worker in ~AsyncWork waiting for the GIL).
        del ddp


@exercise("torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.__init__")
def _fsdp(fn: Any, ctx: Ctx) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    with ctx.process_group():
        wrapped = FullyShardedDataParallel(torch.nn.Linear(4, 2), device_id=T0)
        assert wrapped.compute_device == torch.device("npu", 0)


@exercise(
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.distributed.device_mesh.DeviceMesh.__init__",
)
def _device_mesh(fn: Any, ctx: Ctx) -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.device_mesh import init_device_mesh

    with ctx.process_group():
        assert init_device_mesh("cuda", (1,)).device_type == "npu"
        assert DeviceMesh("cuda", [0]).device_type == "npu"


@exercise("torch.distributed.ProcessGroup._get_backend")
def _get_backend(fn: Any, ctx: Ctx) -> None:
    with ctx.process_group() as group:
        assert group._get_backend(T0) is group._get_backend(torch.device("cpu"))


@exercise(
    "torch.distributed.ProcessGroupNCCL", "torch.distributed.distributed_c10d.ProcessGroupNCCL"
)
def _process_group_class(fn: Any, ctx: Ctx) -> None:
    # hccl's class on an NPU; gloo's under the emulator.
    assert dist.ProcessGroupNCCL is dist.distributed_c10d.ProcessGroupNCCL is dist.ProcessGroupGloo


@exercise("torch.distributed.distributed_c10d.Backend.default_device_backend_map")
def _backend_map(fn: Any, ctx: Ctx) -> None:
    assert "cuda" not in dist.Backend.default_device_backend_map
    dist.init_process_group(init_method=f"file://{ctx.tmp_path}/store", rank=0, world_size=1)
    try:
        assert dist.get_backend_config() == "npu:gloo"
    finally:
        dist.destroy_process_group()


@exercise(
    "torch.distributed.pipelining.stage.PipelineStage.__init__",
    "torch.distributed.pipelining.stage.build_stage",
)
def _pipelining(fn: Any, ctx: Ctx) -> None:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import build_stage
    from torch.distributed.pipelining import pipeline

    with ctx.process_group():
        stage = PipelineStage(torch.nn.Linear(2, 2), 0, 1, device=T0)
        assert stage.device == torch.device("npu", 0)
        pipe = pipeline(torch.nn.Sequential(torch.nn.Linear(2, 2)), mb_args=(torch.ones(1, 2),))
        built = build_stage(pipe.get_stage_module(0), 0, pipe.info(), C0)
        assert torch.device(built.device) == torch.device("npu", 0)


# --------------------------------------------------------------------------- profiler

_ACTIVITIES = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


@exercise("torch.profiler.profile: CUDA activity on the emulated NPU")
def _emulated_profile(fn: Any, ctx: Ctx) -> None:
    with torch.profiler.profile(activities=_ACTIVITIES) as prof:
        (torch.ones(4, device="cuda") * 2).sum()
    assert prof.activities == {torch.profiler.ProfilerActivity.CPU}
    assert any(event.name == "aten::mul" for event in prof.events())


@exercise("torch.profiler export_memory_timeline: CUDA device on the emulated NPU")
def _emulated_timeline(fn: Any, ctx: Ctx) -> None:
    with torch.profiler.profile(activities=_ACTIVITIES, profile_memory=True, record_shapes=True,
                                with_stack=True) as prof:  # fmt: skip
        x = torch.randn(16, 16, device="cuda", requires_grad=True)
        (x @ x).sum().backward()
    points = {}
    for device in ("cpu", C0, T0, None):
        path = ctx.tmp_path / f"{device}.json"
        prof.export_memory_timeline(str(path), device=device)
        points[str(device)] = json.loads(path.read_text())
    assert points["cpu"][0] and points[C0] == points[str(T0)] == points["None"] == points["cpu"]


@exercise("torch.profiler.profile -> torch_npu.profiler", npu_profiler=True)
def _npu_profile(fn: Any, ctx: Ctx) -> None:
    import torch_npu.profiler as npu_profiler  # the stand-in (test_every_item_runs.py)

    prof = torch.profiler.profile(activities=_ACTIVITIES, record_shapes=True,
                                  experimental_config=torch._C._profiler._ExperimentalConfig())  # fmt: skip
    assert isinstance(prof, npu_profiler.profile)
    assert prof.activities == ["npu-profiler CPU", "npu-profiler NPU"]
    assert prof.kwargs == {"record_shapes": True}  # CUDA's experimental_config dropped
    prof.export_memory_timeline("timeline.json", device=T0)
    assert prof.timelines == [("timeline.json", "npu:0")]


@exercise("torch.profiler.schedule -> torch_npu.profiler",
          "torch.profiler.tensorboard_trace_handler -> torch_npu.profiler",
          "torch.profiler.ProfilerAction -> torch_npu.profiler", npu_profiler=True)  # fmt: skip
def _npu_profiler_names(fn: Any, ctx: Ctx) -> None:
    assert torch.profiler.schedule(wait=1, active=2)[0] == "npu schedule"
    assert torch.profiler.tensorboard_trace_handler("./log")[0] == "npu handler"
    assert torch.profiler.ProfilerAction.RECORD == "npu RECORD"
