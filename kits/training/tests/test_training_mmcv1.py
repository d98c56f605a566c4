"""with_profiling and brake_at under mmcv 1.x's EpochBasedRunner and IterBasedRunner.

Runs in the nox session ``openmmlab1_emulated`` (mmcv 1.7.2, no compiled ops). Elsewhere
it skips when mmcv 1.x is missing; in that session ASCEND_PATCH_TEST_REQUIRE=mmcv1
makes a missing mmcv a failure instead. mmcv.runner imports torchvision, which has no
CPU build for torch 2.13 (see the environment notes): a stand-in module is enough.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import Patcher
from ascend_patch_core import Status


REQUIRED = os.environ.get("ASCEND_PATCH_TEST_REQUIRE") == "mmcv1"


def require(module: str) -> Any:
    if REQUIRED:
        return importlib.import_module(module)  # in its own session, missing is an error
    return pytest.importorskip(module)


torch = require("torch")
mmcv = require("mmcv")
if not mmcv.__version__.startswith("1.") and not REQUIRED:
    pytest.skip(f"mmcv {mmcv.__version__} has no mmcv.runner (1.x only)", allow_module_level=True)
if "torchvision" not in sys.modules:
    stand_in = types.ModuleType("torchvision")
    stand_in.__version__ = "0.0.0+stand-in"  # type: ignore[attr-defined]
    stand_in.__path__ = []  # type: ignore[attr-defined]
    sys.modules["torchvision"] = stand_in

from mmcv.runner import EpochBasedRunner  # noqa: E402
from mmcv.runner import Hook  # noqa: E402
from mmcv.runner import IterBasedRunner  # noqa: E402


ITERS_PER_EPOCH = 4


@pytest.fixture(autouse=True)
def _no_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmcv's runners sleep 1-2 s at every epoch change and at the end of run()."""
    import mmcv.runner.epoch_based_runner as epoch_based
    import mmcv.runner.iter_based_runner as iter_based

    fast = types.SimpleNamespace(sleep=lambda s: None, time=time.time)
    monkeypatch.setattr(epoch_based, "time", fast)
    monkeypatch.setattr(iter_based, "time", fast)


class Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def train_step(self, data_batch, optimizer, **kwargs):
        loss = self.linear(data_batch[0]).pow(2).mean()
        return {
            "loss": loss,
            "log_vars": {"loss": float(loss.detach())},
            "num_samples": len(data_batch[0]),
        }


class Events(Hook):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def after_train_epoch(self, runner) -> None:
        self.seen.append("after_train_epoch")

    def after_run(self, runner) -> None:
        self.seen.append("after_run")


def make_runner(kind: type, tmp_path: Path, **limits: int) -> tuple[Any, Events, Any]:
    torch.manual_seed(0)
    model = Toy()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = kind(
        model,
        optimizer=optimizer,
        work_dir=str(tmp_path / "work"),
        logger=logging.getLogger("mmcv-test"),
        **limits,
    )
    runner.register_optimizer_hook(dict(grad_clip=None))
    events = Events()
    runner.register_hook(events)
    data = torch.utils.data.TensorDataset(torch.randn(2 * ITERS_PER_EPOCH, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=False)
    return runner, events, loader


def adam_steps(runner: Any) -> int:
    return int(next(iter(runner.optimizer.state.values()))["step"])


def test_epoch_based_runner_stops_mid_epoch_at_step_n(
    tmp_path: Path, patcher: Patcher, capsys
) -> None:
    """brake_at(6), 4 iterations per epoch: run() returns after 6 steps and after_run still runs."""
    report = patcher.brake_at(6).apply()
    runner, events, loader = make_runner(EpochBasedRunner, tmp_path, max_epochs=5)
    runner.run([loader], [("train", 1)])
    assert adam_steps(runner) == 6 and runner.iter == 6
    assert events.seen == ["after_train_epoch", "after_run"]
    assert "stopping the mmcv EpochBasedRunner" in capsys.readouterr().err
    assert report.get("brake").status is Status.APPLIED


def test_epoch_based_runner_stops_at_an_epoch_boundary(tmp_path: Path, patcher: Patcher) -> None:
    patcher.brake_at(ITERS_PER_EPOCH).apply()
    runner, events, loader = make_runner(EpochBasedRunner, tmp_path, max_epochs=5)
    runner.run([loader], [("train", 1)])
    assert adam_steps(runner) == ITERS_PER_EPOCH and runner.epoch == 1
    assert events.seen == ["after_train_epoch", "after_run"]


def test_iteration_based_runner_stops_at_step_n(tmp_path: Path, patcher: Patcher) -> None:
    patcher.brake_at(7).apply()
    runner, events, loader = make_runner(IterBasedRunner, tmp_path, max_iters=50)
    runner.run([loader], [("train", 1)])
    assert adam_steps(runner) == 7 and runner.iter == 7
    assert events.seen == ["after_run"]


@pytest.mark.parametrize("kind", [EpochBasedRunner, IterBasedRunner], ids=["epoch", "iter"])
def test_profiling_traces_the_active_steps(tmp_path: Path, patcher: Patcher, kind: type) -> None:
    trace = tmp_path / "trace"
    patcher.with_profiling(str(trace), skip_first=2, wait=1, warmup=1, active=2, repeat=0).apply()
    limits = {"max_epochs": 3} if kind is EpochBasedRunner else {"max_iters": 10}
    runner, _, loader = make_runner(kind, tmp_path, **limits)
    runner.run([loader], [("train", 1)])
    files = list(trace.glob("*.pt.trace.json"))
    assert len(files) == 1
    names = {e.get("name", "") for e in json.loads(files[0].read_text())["traceEvents"]}
    assert sorted(int(n.split("#")[1]) + 1 for n in names if n.startswith("ProfilerStep#")) == [
        5,
        6,
    ]
