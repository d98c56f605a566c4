"""DistributedDataParallel across nodes on NCCL: written for GPUs, never edited for Ascend.

One torchrun launcher per node, each starting one rank per GPU:

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 train.py --out-dir run     # node 0 (node 1: --node-rank 1)

Under ascend-patch the same command runs on Ascend NPUs over HCCL, and with
``--emulate-npu`` on the CPU, where each rank gets as many emulated NPUs as the node
has ranks (LOCAL_WORLD_SIZE), so ``torch.cuda.set_device(LOCAL_RANK)`` works:

    ascend-patch run --emulate-npu -m torch.distributed.run --nnodes 2 --node-rank 0 \\
        --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:29400 \\
        train.py --out-dir run

Every rank writes ``rank<RANK>.json`` into ``--out-dir``: its node, the loss averaged
over all ranks after each epoch, a checksum of its parameters, and whether the
checkpoint rank 0 wrote reloads into a model equal to its own.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler
from torch.utils.data import TensorDataset


def make_dataset(samples: int = 256, features: int = 8) -> TensorDataset:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(samples, features, generator=generator)
    labels = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a gloo reference run")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out-dir", default="run")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)  # one GPU per rank on every node
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    model = model.cuda() if args.device == "cuda" else model
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if args.device == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack(
                [loss.detach() * len(x), torch.tensor(float(len(x)), device=device)]
            )
        dist.all_reduce(total)
        losses.append((total[0] / total[1]).item())

    checkpoint = os.path.join(args.out_dir, "checkpoint.pt")
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    dist.barrier()
    # A checkpoint written on rank 0's GPU, loaded onto this rank's GPU.
    location = {"cuda:0": f"cuda:{local_rank}"} if args.device == "cuda" else "cpu"
    state = torch.load(checkpoint, map_location=location)
    reloaded = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    reloaded.load_state_dict(state["model"])
    same = all(
        torch.equal(mine, theirs)
        for mine, theirs in zip(
            model.state_dict().values(), reloaded.state_dict().values(), strict=True
        )
    )
    result = {
        "rank": rank,
        "local_rank": local_rank,
        "node": int(os.environ.get("GROUP_RANK", 0)),
        "world": world,
        "device_count": torch.cuda.device_count() if args.device == "cuda" else 0,
        "losses": losses,
        "checksum": sum(p.double().sum().item() for p in model.parameters()),
        "checkpoint_reloads": same,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as file:
        json.dump(result, file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
