"""with_profiling and brake_at under the Hugging Face Trainer.

Runs in the nox session ``training_hf`` (transformers + accelerate, pinned in
requirements/training-hf.txt). Elsewhere it skips when they are missing; in that
session ASCEND_PATCH_TEST_REQUIRE=hf makes a missing stack a failure instead.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import Patcher
from ascend_patch_core import Status


def require(module: str) -> Any:
    if os.environ.get("ASCEND_PATCH_TEST_REQUIRE") == "hf":
        return importlib.import_module(module)  # in its own session, missing is an error
    return pytest.importorskip(module)


torch = require("torch")
require("accelerate")
transformers = require("transformers")


class Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": (out - labels).pow(2).mean(), "logits": out}


class Events(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.seen.append(f"train_end at {state.global_step}")


def make_trainer(tmp_path: Path, max_steps: int = 40, accumulate: int = 1) -> tuple[Any, Events]:
    torch.manual_seed(0)
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(16)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulate,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    events = Events()
    trainer = transformers.Trainer(model=Toy(), args=args, train_dataset=data, callbacks=[events])
    return trainer, events


def adam_steps(trainer: Any) -> int:
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return int(next(iter(optimizer.state.values()))["step"])


def test_the_trainer_stops_at_step_n_and_train_returns(
    tmp_path: Path, patcher: Patcher, capsys
) -> None:
    """brake_at(5): train() returns after 5 optimizer steps; on_train_end runs; no SystemExit."""
    report = patcher.brake_at(5).apply()
    trainer, events = make_trainer(tmp_path)
    output = trainer.train()
    assert output.global_step == 5 and adam_steps(trainer) == 5
    assert events.seen == ["train_end at 5"]
    assert "stopping the Hugging Face Trainer" in capsys.readouterr().err
    assert report.get("brake").status is Status.APPLIED


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path, patcher: Patcher) -> None:
    """gradient_accumulation_steps=2: brake_at(3) is 3 optimizer steps (the Trainer's global_step)."""
    patcher.brake_at(3).apply()
    trainer, _ = make_trainer(tmp_path, accumulate=2)
    assert trainer.train().global_step == 3
    assert adam_steps(trainer) == 3


def test_profiling_traces_the_active_steps(tmp_path: Path, patcher: Patcher) -> None:
    trace = tmp_path / "trace"
    report = patcher.with_profiling(
        str(trace), skip_first=2, wait=1, warmup=1, active=2, repeat=1
    ).apply()
    trainer, _ = make_trainer(tmp_path, max_steps=12)
    trainer.train()
    steps = []
    for path in sorted(trace.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime_ns):
        names = {e.get("name", "") for e in json.loads(path.read_text())["traceEvents"]}
        steps.append(
            sorted(int(n.split("#")[1]) + 1 for n in names if n.startswith("ProfilerStep#"))
        )
    assert steps == [[5, 6], [9, 10]]
    assert "done" in (report.get("profiling").reason or "")


def test_a_trainer_made_before_apply_is_still_braked(tmp_path: Path, patcher: Patcher) -> None:
    """Without the callback (the Trainer existed before apply()), the generic brake still stops at N."""
    trainer, _ = make_trainer(tmp_path)
    patcher.brake_at(4).apply()
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == 0
    assert adam_steps(trainer) == 4
