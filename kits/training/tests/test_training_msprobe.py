"""with_precision_check(msprobe=...) with the real mindstudio-probe PrecisionDebugger, on CPU.

Runs in the nox session ``training_msprobe``. Elsewhere it skips when mindstudio-probe
is missing; in that session ASCEND_PATCH_TEST_REQUIRE=msprobe makes that a failure.
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
    if os.environ.get("ASCEND_PATCH_TEST_REQUIRE") == "msprobe":
        return importlib.import_module(module)  # in its own session, missing is an error
    return pytest.importorskip(module)


torch = require("torch")
require("msprobe.pytorch")


def test_the_debugger_dumps_each_training_step_and_stops_with_the_brake(
    tmp_path: Path, patcher: Patcher
) -> None:
    """One dump folder per training step; the brake stops the debugger before leaving."""
    dump = tmp_path / "dump"
    report = (
        patcher.brake_at(3)
        .with_precision_check(
            patches=(), msprobe={"dump_path": str(dump), "task": "statistics", "level": "L1"}
        )
        .apply()
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(SystemExit):
        for _ in range(10):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
    assert report.get("msprobe").status is Status.APPLIED
    steps = sorted(p.name for p in dump.iterdir())
    assert steps == ["step0", "step1", "step2"]
    for step in steps:
        dumped = json.loads(next((dump / step).rglob("dump.json")).read_text())
        assert dumped["data"], step  # the forward and backward of that step were recorded
