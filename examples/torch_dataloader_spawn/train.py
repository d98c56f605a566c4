"""A DataLoader with spawned workers feeding a CUDA model: written for GPUs, never edited for Ascend.

    python train.py                 # on a CUDA GPU
    python train.py --device cpu    # the CPU reference run
    ascend-patch run --emulate-npu migrate_to_ascend/train.py   # NPU code paths, on the CPU

Spawned workers re-import this file in fresh interpreters, so they must be patched
too; each worker builds its samples with torch and reports the device the main
process trains on. Prints one JSON line per epoch and writes them to --out.
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data import Dataset


class Shapes(Dataset):
    """Noisy 1-d signals of three kinds; the sample is built in the worker process."""

    def __init__(self, size: int = 240, length: int = 32) -> None:
        self.size, self.length = size, length

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        generator = torch.Generator().manual_seed(i)
        label = i % 3
        t = torch.linspace(0, 1, self.length)
        clean = [torch.sin(6.28 * t), (t > 0.5).float(), t][label]
        return clean + 0.3 * torch.randn(self.length, generator=generator), label


def seed_worker(worker_id: int) -> None:
    # What CUDA training scripts commonly do in their worker_init_fn.
    torch.manual_seed(torch.initial_seed() % 2**31)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    use_cuda = args.device.startswith("cuda")
    if use_cuda:
        assert torch.cuda.is_available(), "this script needs a CUDA GPU (or --device cpu)"
    device = torch.device(args.device)
    torch.manual_seed(0)
    loader = DataLoader(
        Shapes(),
        batch_size=24,
        shuffle=True,
        num_workers=args.workers,
        multiprocessing_context="spawn",
        persistent_workers=args.workers > 0,
        pin_memory=use_cuda,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(5),
    )
    model = nn.Sequential(
        nn.Conv1d(1, 8, 5, padding=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(4),
        nn.Flatten(),
        nn.Linear(32, 3),
    )
    model = model.cuda() if use_cuda else model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    history = []
    for epoch in range(args.epochs):
        total, seen = 0.0, 0
        for x, y in loader:
            if use_cuda:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            else:
                x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x.unsqueeze(1)), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            seen += len(y)
        if use_cuda:
            torch.cuda.synchronize()
        record = {"epoch": epoch, "loss": total / seen, "samples": seen}
        history.append(record)
        print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    main()
