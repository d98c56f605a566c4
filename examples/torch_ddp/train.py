"""DistributedDataParallel on NCCL, launched by torchrun: written for GPUs, never edited for Ascend.

    torchrun --nproc-per-node 2 train.py                 # on 2 CUDA GPUs
    torchrun --nproc-per-node 2 train.py --device cpu    # the CPU reference run (gloo)
    ascend-patch run --emulate-npu -m torch.distributed.run --nproc-per-node 2 \\
        migrate_to_ascend/train.py                       # NPU code paths, on the CPU

Rank 0 prints one JSON line per epoch, saves a checkpoint (a CUDA checkpoint on
GPUs), and every rank loads it back with map_location before a last evaluation.
"""

import argparse
import json
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler
from torch.utils.data import TensorDataset


def make_dataset(samples: int = 192, features: int = 8) -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(samples, features, generator=generator)
    labels = (x[:, :3].sum(dim=1) > 0).long()
    return TensorDataset(x, labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--checkpoint", default=None, help="where to save it (default: a temporary file)"
    )
    args = parser.parse_args()

    use_cuda = args.device.startswith("cuda")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        assert dist.is_nccl_available(), "NCCL is needed (or --device cpu)"
        # One GPU per rank; this sketch runs its 2 ranks on one device when there is only one.
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, pin_memory=use_cuda)

    history = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack(
                [loss.detach() * len(x), torch.tensor(float(len(x)), device=device)]
            )
        dist.all_reduce(total)
        record = {"epoch": epoch, "loss": (total[0] / total[1]).item()}
        history.append(record)
        if rank == 0:
            print(json.dumps(record), flush=True)

    # Unless told where, a temporary file that rank 0 removes at the end (a run leaves
    # nothing in the working directory); every rank is a child of the same torchrun
    # agent, so its pid and port name one file for the whole job.
    job = f"{os.getppid()}-{os.environ.get('MASTER_PORT', 0)}"
    default = os.path.join(tempfile.gettempdir(), f"ascend-patch-ddp-{job}", "ddp_cuda.pt")
    checkpoint = args.checkpoint or default
    if rank == 0:
        os.makedirs(os.path.dirname(checkpoint) or ".", exist_ok=True)
        torch.save(
            {"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint
        )
    dist.barrier()
    location = {"cuda:0": f"cuda:{device.index}"} if use_cuda else "cpu"
    state = torch.load(checkpoint, map_location=location)
    model.load_state_dict(state["model"])
    x, y = dataset.tensors
    with torch.no_grad():
        accuracy = (model(x.to(device)).argmax(dim=1) == y.to(device)).float().mean()
    dist.all_reduce(accuracy)
    history.append({"accuracy": accuracy.item() / world})
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(history, f)
    dist.barrier()
    if rank == 0 and not args.checkpoint:
        shutil.rmtree(os.path.dirname(checkpoint), ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
