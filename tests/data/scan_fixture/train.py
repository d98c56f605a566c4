"""Train a small model on one GPU, or with DDP over NCCL."""

import argparse

import torch
import torch.distributed as dist
from models.net import Net
from torch.cuda.amp import GradScaler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--distributed", action="store_true")
    args = parser.parse_args()
    if args.distributed:
        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().cuda()
    scaler = GradScaler()
    data = torch.randn(8, 16, device="cuda")
    target = torch.zeros(8, dtype=torch.long).to("cuda:0")
    with torch.autocast("cuda"):
        loss = torch.nn.functional.cross_entropy(model(data), target)
    scaler.scale(loss).backward()
    torch.cuda.synchronize()
    print(loss.item(), device)


if __name__ == "__main__":
    main()
