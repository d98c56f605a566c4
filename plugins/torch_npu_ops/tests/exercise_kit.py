"""What the exercises of test_every_item_runs.py share: the registry, the context, helpers.

Loaded by that test (by path: the tests directory is not a package) before the
``exercises_*.py`` files, which register one exercise per item or patch name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


__all__ = ["C0", "EXERCISES", "T0", "WITH_NPU_PROFILER", "Ctx", "Exercise", "check", "equal",
           "exercise", "npu"]  # fmt: skip

C0, T0 = "cuda:0", torch.device("cuda", 0)


class Ctx:
    """What an exercise may use besides the object under test."""

    def __init__(self, tmp_path: Any, monkeypatch: Any) -> None:
        self.tmp_path, self.monkeypatch = tmp_path, monkeypatch

    @contextlib.contextmanager
    def process_group(self) -> Any:
        # "nccl", and a store path naming nccl and cuda: transfer_to_npu rewrote both.
        dist.init_process_group("nccl", init_method=f"file://{self.tmp_path}/nccl_cuda", rank=0,
                                world_size=1)  # fmt: skip
        try:
            yield dist.group.WORLD
        finally:
            dist.destroy_process_group()


Exercise = Callable[[Any, Ctx], None]
EXERCISES: dict[str, Exercise] = {}
#: Exercises of torch_npu.profiler's names; they run with a stand-in torch_npu.profiler.
WITH_NPU_PROFILER: set[str] = set()


def exercise(*names: str, npu_profiler: bool = False) -> Callable[[Exercise], Exercise]:
    def register(function: Exercise) -> Exercise:
        for name in names:
            EXERCISES[name] = function
            if npu_profiler:
                WITH_NPU_PROFILER.add(name)
        return function

    return register


def npu(tensor: Any) -> Any:
    assert isinstance(tensor, torch.Tensor) and tensor.is_npu, tensor
    return tensor


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a is b or a == b)


def check(ok: bool) -> None:
    assert ok
