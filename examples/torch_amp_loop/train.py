"""A plain CUDA training loop with AMP: written for NVIDIA GPUs, never edited for Ascend.

    python train.py                 # on a CUDA GPU
    python train.py --device cpu    # the CPU reference run
    ascend-patch run --emulate-npu migrate_to_ascend/train.py   # NPU code paths, on the CPU

Prints one JSON line per epoch ({"epoch", "loss"}) and writes them to --out.
"""

import argparse
import json
import os
import tempfile

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def make_data(samples: int = 256, features: int = 16):
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, features, generator=generator)
    w = torch.randn(features, generator=generator)
    y = x @ w + 0.1 * torch.randn(samples, generator=generator)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--checkpoint", default=None, help="where to save it (default: a temporary file)"
    )
    args = parser.parse_args()

    use_cuda = args.device.startswith("cuda")
    if use_cuda:
        assert torch.cuda.is_available(), "this script needs a CUDA GPU (or --device cpu)"
        torch.cuda.set_device(0)
        torch.cuda.manual_seed_all(0)
        torch.backends.cudnn.benchmark = True
        print(f"training on {torch.cuda.get_device_name(0)}")
    device = torch.device(args.device)
    torch.manual_seed(0)

    model = Regressor()
    model = model.cuda() if use_cuda else model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.cuda.amp.GradScaler() if use_cuda else torch.amp.GradScaler("cpu")
    x_all, y_all = make_data()

    history = []
    for epoch in range(args.epochs):
        total = 0.0
        for start in range(0, len(x_all), args.batch_size):
            x = x_all[start : start + args.batch_size]
            y = y_all[start : start + args.batch_size]
            if use_cuda:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            else:
                x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                prediction = model(x)
            loss = nn.functional.mse_loss(prediction.float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total += loss.item() * len(x)
        if use_cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        else:
            peak = 0.0
        record = {"epoch": epoch, "loss": total / len(x_all), "peak_mib": peak}
        history.append(record)
        print(json.dumps(record))

    # A checkpoint round trip: saved from the device, loaded back onto it. Unless told
    # where, in a temporary directory: a run leaves nothing in the working directory.
    with tempfile.TemporaryDirectory(prefix="ascend-patch-example-") as tmp:
        checkpoint = args.checkpoint or os.path.join(tmp, "cuda_model.pt")
        os.makedirs(os.path.dirname(checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(), "epoch": args.epochs}, checkpoint)
        state = torch.load(checkpoint, map_location="cuda" if use_cuda else "cpu")
    model.load_state_dict(state["model"])
    with torch.no_grad():
        check = nn.functional.mse_loss(
            model(x_all.to(next(model.parameters()).device)), y_all.to(device)
        )
    history.append({"reloaded_loss": check.item()})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    main()
