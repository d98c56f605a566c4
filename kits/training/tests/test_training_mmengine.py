"""with_profiling and brake_at under mmengine's Runner (epoch- and iteration-based loops).

Runs in the nox session ``openmmlab_emulated`` (mmengine 0.10.7). Elsewhere it skips
when mmengine is missing; in that session ASCEND_PATCH_TEST_REQUIRE=mmengine makes
a missing mmengine a failure instead.
"""

from __future__ import annotations

import importlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import Patcher
from ascend_patch_core import Status


def require(module: str) -> Any:
    if os.environ.get("ASCEND_PATCH_TEST_REQUIRE") == "mmengine":
        return importlib.import_module(module)  # in its own session, missing is an error
    return pytest.importorskip(module)


torch = require("torch")
require("mmengine")

from mmengine.hooks import Hook  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmengine.runner import Runner  # noqa: E402


ITERS_PER_EPOCH = 4


@pytest.fixture(autouse=True)
def _no_epoch_transition_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmengine's iteration loop sleeps 2 s whenever its data loader starts over."""
    import time
    import types

    import mmengine.runner.loops as loops

    monkeypatch.setattr(loops, "time", types.SimpleNamespace(sleep=lambda s: None, time=time.time))


class Toy(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        out = self.linear(inputs)
        if mode == "loss":
            return {"loss": out.pow(2).mean()}
        return out


class Events(Hook):
    """Records the loop's hook calls, to show which ones still ran after a brake."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def after_train_epoch(self, runner) -> None:
        self.seen.append("after_train_epoch")

    def after_train(self, runner) -> None:
        self.seen.append("after_train")

    def after_run(self, runner) -> None:
        self.seen.append("after_run")


def make_runner(tmp_path: Path, train_cfg: dict, accumulate: int = 1) -> tuple[Runner, Events]:
    torch.manual_seed(0)
    data = [dict(inputs=torch.randn(4)) for _ in range(2 * ITERS_PER_EPOCH)]
    events = Events()
    runner = Runner(
        model=Toy(),
        work_dir=str(tmp_path / "work"),
        experiment_name=uuid.uuid4().hex,
        train_dataloader=dict(
            dataset=data,
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
            batch_size=2,
        ),
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type="Adam", lr=0.01), accumulative_counts=accumulate),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[events],
        log_level="WARNING",
    )
    return runner, events


def adam_steps(runner: Runner) -> int:
    return int(next(iter(runner.optim_wrapper.optimizer.state.values()))["step"])


def test_epoch_based_runner_stops_mid_epoch_at_step_n(
    tmp_path: Path, patcher: Patcher, capsys
) -> None:
    """brake_at(6) with 4 iterations per epoch: train() returns after 6 steps; after_train and after_run still run."""
    report = patcher.brake_at(6).apply()
    runner, events = make_runner(tmp_path, dict(by_epoch=True, max_epochs=5))
    runner.train()  # returns: no SystemExit in a loop that can stop by itself
    assert adam_steps(runner) == 6 and runner.iter == 6
    assert events.seen == ["after_train_epoch", "after_train", "after_run"]
    assert "stopping the mmengine Runner" in capsys.readouterr().err
    assert "stopped at the end of that iteration" in (report.get("brake").reason or "")


def test_epoch_based_runner_stops_at_an_epoch_boundary(tmp_path: Path, patcher: Patcher) -> None:
    """A brake on the last iteration of an epoch ends that epoch normally and trains no further."""
    patcher.brake_at(ITERS_PER_EPOCH).apply()
    runner, events = make_runner(tmp_path, dict(by_epoch=True, max_epochs=5))
    runner.train()
    assert adam_steps(runner) == ITERS_PER_EPOCH and runner.epoch == 1
    assert events.seen == ["after_train_epoch", "after_train", "after_run"]


def test_iteration_based_runner_stops_at_step_n(tmp_path: Path, patcher: Patcher) -> None:
    patcher.brake_at(7).apply()
    runner, events = make_runner(tmp_path, dict(by_epoch=False, max_iters=50))
    runner.train()
    assert adam_steps(runner) == 7 and runner.iter == 7
    assert events.seen[-2:] == ["after_train", "after_run"]


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path, patcher: Patcher) -> None:
    """accumulative_counts=2: brake_at(3) means 3 optimizer steps, i.e. 6 runner iterations."""
    patcher.brake_at(3).apply()
    runner, _ = make_runner(tmp_path, dict(by_epoch=False, max_iters=50), accumulate=2)
    runner.train()
    assert adam_steps(runner) == 3 and runner.iter == 6


@pytest.mark.parametrize("by_epoch", [True, False], ids=["epoch", "iter"])
def test_profiling_traces_the_active_steps(
    tmp_path: Path, patcher: Patcher, by_epoch: bool
) -> None:
    """The schedule counts steps from the start of runner.train(); one trace with the active steps."""
    trace = tmp_path / "trace"
    report = patcher.with_profiling(
        str(trace), skip_first=2, wait=1, warmup=1, active=2, repeat=0
    ).apply()
    cfg = dict(by_epoch=True, max_epochs=3) if by_epoch else dict(by_epoch=False, max_iters=10)
    runner, _ = make_runner(tmp_path, cfg)
    runner.train()
    files = list(trace.glob("*.pt.trace.json"))
    assert len(files) == 1
    names = {e.get("name", "") for e in json.loads(files[0].read_text())["traceEvents"]}
    steps = sorted(int(n.split("#")[1]) + 1 for n in names if n.startswith("ProfilerStep#"))
    assert steps == [5, 6]
    assert report.get("profiling").status is Status.APPLIED


def test_a_second_train_call_is_not_braked_again(tmp_path: Path, patcher: Patcher) -> None:
    """The brake fires once: training again afterwards (fine-tuning) runs to its own end."""
    patcher.brake_at(2).apply()
    runner, _ = make_runner(tmp_path, dict(by_epoch=False, max_iters=5))
    runner.train()
    assert adam_steps(runner) == 2
    second, _ = make_runner(tmp_path, dict(by_epoch=False, max_iters=5))
    second.train()
    assert adam_steps(second) == 5
