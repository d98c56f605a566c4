"""torch.distributed written for NCCL/CUDA runs on the (emulated) NPU: nccl -> hccl (gloo here)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ascend_patch_torch.distributed import names_nccl
from ascend_patch_torch.distributed import to_hccl_backend


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("nccl", "hccl"),
        ("NCCL", "hccl"),
        ("cpu:gloo,cuda:nccl", "cpu:gloo,npu:hccl"),
        ("cuda:nccl", "npu:hccl"),
    ],
)
def test_backend_names_are_rewritten_exactly(backend, expected):
    assert names_nccl(backend)
    assert to_hccl_backend(backend) == expected


@pytest.mark.parametrize(
    "backend", ["gloo", "cpu:gloo", "mpi", "file:///tmp/nccl_store", "nccl_x", None, 1]
)
def test_other_backends_and_strings_are_left_alone(backend):
    assert not names_nccl(backend)
    assert to_hccl_backend(backend) is backend


@pytest.fixture
def process_group(redirect, tmp_path, calls):
    # The init_method path names nccl and cuda: transfer_to_npu rewrote both.
    store = tmp_path / "nccl_cuda_store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield store
    finally:
        dist.destroy_process_group()


def test_init_process_group_nccl_runs_on_the_npu_backend(process_group, calls):
    assert dist.get_backend() == "gloo"  # hccl, which the emulator runs on gloo
    assert process_group.exists()  # the file store kept its path
    tensor = torch.ones(3, device="cuda")
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    assert calls("torch.distributed.distributed_c10d.init_process_group") == (1, 0)


def test_is_nccl_available_asks_for_the_npu_backend(redirect, calls):
    assert dist.is_nccl_available()
    assert calls("torch.distributed.distributed_c10d.is_nccl_available") == (1, 0)


def test_new_group_with_nccl(process_group, calls):
    group = dist.new_group([0], backend="nccl")
    tensor = torch.full((2,), 2.0, device="cuda")
    dist.all_reduce(tensor, group=group)
    assert tensor.tolist() == [2.0, 2.0]
    assert calls("torch.distributed.distributed_c10d.new_group")[0] == 1


@pytest.mark.parametrize(
    "ids",
    [
        {"device_ids": ["cuda:0"], "output_device": "cuda:0"},
        {"device_ids": [torch.device("cuda", 0)]},
        {"device_ids": [0], "output_device": 0},  # the usual [local_rank]
    ],
)
def test_ddp_with_device_ids_trains(process_group, calls, ids):
    model = torch.nn.Linear(4, 2).cuda()
    # On the emulator the NPU is the CPU, for which DDP takes no device ids: the patch
    # drops them there (and only there).
    ddp = torch.nn.parallel.DistributedDataParallel(model, **ids)
    ddp(torch.randn(3, 4, device="cuda")).sum().backward()
    assert model.weight.grad is not None
    assert calls("torch.nn.parallel.distributed.DistributedDataParallel.__init__") == (1, 0)


def test_ddp_without_device_ids_is_left_alone(process_group, calls):
    model = torch.nn.Linear(4, 2).cuda()
    torch.nn.parallel.DistributedDataParallel(model, device_ids=None)
    assert calls("torch.nn.parallel.distributed.DistributedDataParallel.__init__") == (0, 1)


def test_device_mesh_for_cuda(process_group, calls):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (1,))
    assert mesh.device_type == "npu"
    assert calls("torch.distributed.device_mesh.init_device_mesh")[0] == 1


def test_fsdp_with_a_cuda_device_id(process_group, calls):
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = torch.nn.Linear(4, 2)
    wrapped = FullyShardedDataParallel(model, device_id=torch.device("cuda", 0))
    assert wrapped.compute_device == torch.device("npu", 0)
    assert calls(
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.__init__"
    ) == (1, 0)


def test_get_backend_for_cuda_gives_the_npu_backend(process_group, calls):
    group = dist.group.WORLD
    assert group._get_backend(torch.device("cuda")) is group._get_backend(torch.device("cpu"))
    assert calls("torch.distributed.ProcessGroup._get_backend")[0] == 1


def test_process_group_nccl_is_the_npu_process_group(redirect):
    # hccl's class on an NPU; gloo's under the emulator (its collectives run on gloo).
    assert dist.ProcessGroupNCCL is dist.ProcessGroupGloo
    assert dist.distributed_c10d.ProcessGroupNCCL is dist.ProcessGroupGloo


def test_process_group_nccl_alias_is_removed_on_revert(npu_emulator, isolated_patcher):
    from ascend_patch_torch.groups import Distributed

    had = hasattr(dist, "ProcessGroupNCCL")
    isolated_patcher.add(Distributed).apply()
    assert hasattr(dist, "ProcessGroupNCCL")
    isolated_patcher.revert()
    assert hasattr(dist, "ProcessGroupNCCL") == had


def test_init_process_group_without_a_backend_uses_the_npu_one(redirect, tmp_path):
    assert "cuda" not in dist.Backend.default_device_backend_map
    # Without the patch torch finds no backend for the npu accelerator under the emulator
    # (torch_npu registers npu: hccl; the emulator's NPU gets gloo).
    dist.init_process_group(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.get_backend_config() == "npu:gloo"
    finally:
        dist.destroy_process_group()


def test_pipeline_stage_on_cuda_is_built_on_the_npu(process_group, calls):
    from torch.distributed.pipelining import PipelineStage

    stage = PipelineStage(torch.nn.Linear(2, 2), 0, 1, "cuda")
    assert torch.device(stage.device) == torch.device("npu")
    stage = PipelineStage(torch.nn.Linear(2, 2), 0, 1, device=torch.device("cuda", 0))
    assert stage.device == torch.device("npu", 0)
    assert calls("torch.distributed.pipelining.stage.PipelineStage.__init__") == (2, 0)
