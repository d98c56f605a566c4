"""Per-call cost of the torch plugin's patches on hot torch functions (CPU, NPU emulator).

    .nox/tests/bin/python plugins/torch_npu_ops/benchmarks/run.py [--number N] [--rounds R]

For each call the unpatched and the patched form are timed side by side, interleaved
in a shuffled order each round (the machine is shared and noisy); medians are
reported in microseconds per call. The numbers quoted in docs/torch-plugin.md come
from this script.
"""

from __future__ import annotations

import argparse
import random
import statistics
import timeit
import warnings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    from ascend_patch_emulator import activate

    from ascend_patch_core import Patch
    from ascend_patch_core import Patcher

    activate()
    import torch
    from ascend_patch_torch import plugin
    from ascend_patch_torch.groups import TensorIndex

    x = torch.arange(64.0).reshape(16, 4)
    mask = torch.arange(16) % 3 == 0
    a, b = torch.randn(2, 2, 8, 8), torch.randn(2, 2, 8, 1)
    calls = {
        "x[bool_mask] (TensorIndex replacement)": lambda: x[mask],
        "x[0] (TensorIndex check, fallback)": lambda: x[0],
        "x[:, 1] (TensorIndex check, fallback)": lambda: x[:, 1],
        "t.to(torch.float64) (redirect check, fallback)": lambda: x.to(torch.float64),
        "torch.zeros(4) (redirect check, fallback)": lambda: torch.zeros(4),
        "torch.zeros(4, device='npu') (redirect check, fallback)": lambda: torch.zeros(
            4, device="npu"
        ),
        "torch.cuda.current_device() (delegate to torch.npu)": lambda: torch.npu.current_device(),
        "torch.matmul 4-d column (BatchMatmul replacement)": lambda: torch.matmul(a, b),
        "torch.matmul 2-d (BatchMatmul check, fallback)": lambda: torch.matmul(x, x.T),
    }
    patched_calls = dict(calls)
    patched_calls["torch.cuda.current_device() (delegate to torch.npu)"] = lambda: (
        torch.cuda.current_device()
    )

    patcher = Patcher(autoload=False)
    # The default groups (BatchMatmul among them), and the opt-in TensorIndex: a group
    # added by hand is on.
    groups: list[type[Patch]] = [g for g in plugin.register_patches() if not g.opt_in]
    groups.append(TensorIndex)
    for group in groups:
        patcher.add(group)

    results: dict[str, dict[str, list[float]]] = {
        name: {"plain": [], "patched": []} for name in calls
    }
    for _ in range(args.rounds):
        order = [(name, state) for name in calls for state in ("plain", "patched")]
        random.shuffle(order)
        for name, state in order:
            function = patched_calls[name] if state == "patched" else calls[name]
            if state == "patched":
                patcher.apply()
            try:
                seconds = timeit.timeit(function, number=args.number)
            finally:
                if state == "patched":
                    patcher.revert()
            results[name][state].append(seconds / args.number * 1e6)

    width = max(map(len, results))
    print(f"{'call':{width}}  unpatched  patched  added (us/call, median of {args.rounds})")
    for name, times in results.items():
        plain, patched = statistics.median(times["plain"]), statistics.median(times["patched"])
        print(f"{name:{width}}  {plain:9.2f}  {patched:7.2f}  {patched - plain:+6.2f}")


if __name__ == "__main__":
    main()
