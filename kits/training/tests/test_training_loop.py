"""with_profiling and brake_at in a plain PyTorch loop (CPU, torch.profiler)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from ascend_patch_training._profiler import ProfilingOptions
from ascend_patch_training._profiler import _build_profiler

from ascend_patch_core import Patcher
from ascend_patch_core import Status


def traced_steps(directory: Path) -> list[list[int]]:
    """The 1-based training steps in each trace file (one file per profiling cycle)."""
    files = []
    for path in sorted(directory.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime_ns):
        events = json.loads(path.read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        files.append(
            sorted(int(n.split("#")[1]) + 1 for n in names if n.startswith("ProfilerStep#"))
        )
    return files


def train(
    steps: int, state: dict | None = None, *, scaler=None, skip: tuple[int, ...] = ()
) -> dict:
    """A plain loop; ``state`` (returned) gets the model, the optimizer and the iterations that completed."""
    state = {} if state is None else state
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    done: list[int] = []
    state.update(model=model, optimizer=optimizer, done=done)
    for iteration in range(1, steps + 1):
        optimizer.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            if iteration in skip:  # an overflow: GradScaler skips this optimizer step
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
        done.append(iteration)
    return state


def adam_steps(optimizer: torch.optim.Optimizer) -> int:
    return int(next(iter(optimizer.state.values()))["step"])


SCHEDULES = [
    dict(skip_first=2, wait=1, warmup=1, active=2, repeat=1),
    dict(skip_first=0, wait=0, warmup=0, active=1, repeat=0),
    dict(skip_first=3, wait=0, warmup=1, active=3, repeat=0),
    dict(skip_first=1, wait=2, warmup=0, active=1, repeat=2),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(map(str, s.values())))
def test_profiling_traces_the_scheduled_steps(tmp_path: Path, patcher: Patcher, schedule) -> None:
    """One trace per cycle, holding exactly the active steps; total = skip_first + (wait+warmup+active)*(repeat+1)."""
    options = ProfilingOptions(path=str(tmp_path / "trace"), level=0, **schedule)
    report = patcher.with_profiling(options.path, **schedule).apply()
    record = report.get("profiling")
    train(options.total_steps + 3)
    expected = options.active_steps
    files = traced_steps(tmp_path / "trace")
    assert len(files) == schedule["repeat"] + 1
    assert [step for f in files for step in f] == expected
    assert len(expected) == schedule["active"] * (schedule["repeat"] + 1)
    assert record.status is Status.APPLIED
    assert "done" in (record.reason or "")


def test_the_seed_formula_for_the_total_number_of_steps() -> None:
    """with_profiling's defaults: 20 skipped, then 2 cycles of wait/warmup/active = 26 steps; active steps 23 and 26."""
    options = ProfilingOptions("p", 0, skip_first=20, wait=1, warmup=1, active=1, repeat=1)
    assert options.total_steps == 20 + (1 + 1 + 1) * (1 + 1)
    assert options.active_steps == [23, 26]


def test_brake_stops_a_plain_loop_at_exactly_n_optimizer_steps(patcher: Patcher, capsys) -> None:
    """brake_at(N): SystemExit(0) right after the N-th optimizer step, with a message saying why."""
    report = patcher.brake_at(4).apply()
    holder: dict[str, object] = {}

    def loop() -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        holder["optimizer"] = optimizer = torch.optim.Adam(model.parameters())
        for _ in range(10):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            holder["iterations"] = holder.get("iterations", 0) + 1  # type: ignore[operator]

    with pytest.raises(SystemExit) as stopped:
        loop()
    assert stopped.value.code == 0
    assert adam_steps(holder["optimizer"]) == 4  # type: ignore[arg-type]
    assert holder["iterations"] == 3  # the 4th iteration stopped inside optimizer.step()
    assert "brake_at(4)" in capsys.readouterr().err
    record = report.get("brake")
    assert record.status is Status.APPLIED and "exited with status 0" in (record.reason or "")
    assert "4 training step(s)" in (report.get("training_steps").reason or "")


def test_brake_with_gradient_accumulation_counts_optimizer_steps(patcher: Patcher) -> None:
    """Four micro-batches per optimizer step: brake_at(3) stops after 3 optimizer steps, 12 backward passes."""
    patcher.brake_at(3).apply()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward = 0
    with pytest.raises(SystemExit):
        for micro in range(1, 100):
            model(torch.randn(2, 4)).sum().backward()
            backward += 1
            if micro % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
    assert backward == 12


def test_steps_skipped_by_grad_scaler_still_count(patcher: Patcher) -> None:
    """An overflowing step (GradScaler skips optimizer.step) is still a training step, as in the Trainer and mmengine."""
    patcher.brake_at(3).apply()
    state: dict = {}
    with pytest.raises(SystemExit):
        train(10, state, scaler=torch.amp.GradScaler("cpu"), skip=(1,))
    # Iterations 1 (skipped), 2 and 3: the brake fires inside the third scaler.step().
    assert state["done"] == [1, 2]
    assert adam_steps(state["optimizer"]) == 2


def test_brake_flushes_the_profiler_inside_an_active_window(
    tmp_path: Path, patcher: Patcher
) -> None:
    """A brake in the middle of the active steps writes the trace with the steps run so far."""
    trace = tmp_path / "trace"
    report = (
        patcher.with_profiling(str(trace), skip_first=1, wait=0, warmup=1, active=5, repeat=0)
        .brake_at(5)
        .apply()
    )
    with pytest.raises(SystemExit):
        train(20)
    assert traced_steps(trace) == [[3, 4, 5]]
    assert "flushed by the brake" in (report.get("profiling").reason or "")


def test_the_profiler_starts_at_the_first_forward_not_at_apply(
    tmp_path: Path, patcher: Patcher
) -> None:
    """Step 1 of a plain loop begins at the first forward: model setup before it is not traced."""
    trace = tmp_path / "trace"
    patcher.with_profiling(str(trace), skip_first=0, wait=0, warmup=0, active=1, repeat=0).apply()
    with torch.profiler.record_function("setup_before_training"):
        torch.ones(3).sum()
    train(2)
    events = json.loads(next(trace.glob("*.json")).read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "ProfilerStep#0" in names and "setup_before_training" not in names


def test_revert_removes_every_hook_and_restores_grad_scaler(patcher: Patcher) -> None:
    """After revert(), optimizer steps are not counted and GradScaler.step is the original again."""
    from torch.optim import optimizer as optimizer_module

    original_step = torch.amp.GradScaler.step
    hooks_before = (
        len(optimizer_module._global_optimizer_pre_hooks),
        len(optimizer_module._global_optimizer_post_hooks),
    )
    report = patcher.brake_at(2).apply()
    assert torch.amp.GradScaler.step is not original_step
    patcher.revert()
    assert torch.amp.GradScaler.step is original_step
    assert (
        len(optimizer_module._global_optimizer_pre_hooks),
        len(optimizer_module._global_optimizer_post_hooks),
    ) == hooks_before
    train(4)  # would stop at step 2 if anything were left
    assert report.get("brake").status is Status.PENDING


def test_apply_imports_no_torch(tmp_path: Path) -> None:
    """Declaring every training utility and applying imports neither torch nor a loop library."""
    code = (
        "import sys\n"
        "from ascend_patch_core import Patcher\n"
        f"p = Patcher().with_profiling({str(tmp_path)!r}).brake_at(3).with_precision_check()\n"
        "p.apply()\n"
        "heavy = [m for m in ('torch', 'transformers', 'mmengine', 'mmcv') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "p.revert()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_hooks_install_when_torch_is_imported_after_apply(tmp_path: Path) -> None:
    """apply() before `import torch`: the step hooks arrive with torch and the brake works."""
    code = (
        "from ascend_patch_core import Patcher\n"
        "Patcher().brake_at(2).apply()\n"
        "import torch\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(5):\n"
        "    m(torch.ones(1, 2)).sum().backward(); o.step(); print('step', i + 1, flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["step", "1"]
    assert "brake_at(2)" in result.stderr


class _Recorder:
    """Stands in for torch_npu.profiler: records how the profiler was built."""

    def __init__(self) -> None:
        self.calls: dict[str, object] = {}
        self.ProfilerActivity = types.SimpleNamespace(NPU="NPU", CPU="CPU")
        self.ProfilerLevel = types.SimpleNamespace(Level0="L0", Level1="L1", Level2="L2")

    def schedule(self, **kwargs):
        self.calls["schedule"] = kwargs
        return "schedule"

    def tensorboard_trace_handler(self, path):
        self.calls["handler"] = path
        return "handler"

    def _ExperimentalConfig(self, **kwargs):
        self.calls["experimental"] = kwargs
        return "experimental"

    def profile(self, **kwargs):
        self.calls["profile"] = kwargs
        return "profiler"


@pytest.mark.parametrize("level", [0, 1, 2])
def test_on_an_npu_torch_npu_profiler_gets_the_schedule_by_keyword(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    """torch_npu.profiler: warmup and active by keyword (the DrivingSDK patcher swapped them), repeat+1 cycles, the DrivingSDK patcher's levels."""
    recorder = _Recorder()
    package = types.ModuleType("torch_npu")
    package.profiler = recorder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", package)
    monkeypatch.setitem(sys.modules, "torch_npu.profiler", recorder)  # type: ignore[arg-type]
    options = ProfilingOptions(
        str(tmp_path), level, skip_first=7, wait=2, warmup=5, active=10, repeat=1
    )
    profiler, backend = _build_profiler(options)
    assert (profiler, backend) == ("profiler", "torch_npu.profiler")
    assert recorder.calls["schedule"] == dict(skip_first=7, wait=2, warmup=5, active=10, repeat=2)
    kwargs = recorder.calls["profile"]
    assert kwargs["activities"] == (["NPU"] if level == 0 else ["NPU", "CPU"])
    assert kwargs["record_shapes"] is (level >= 1)
    assert kwargs["with_stack"] is (level == 2) and kwargs["profile_memory"] is (level == 2)
    assert recorder.calls["experimental"] == {"profiler_level": ["L0", "L1", "L2"][level]}
    assert recorder.calls["handler"] == str(tmp_path)


def test_apply_revert_apply_counts_from_zero_again(patcher: Patcher) -> None:
    """Each apply() starts a new count: the brake of the second one fires after its own N steps."""
    patcher.brake_at(2)
    patcher.apply()
    train(1)
    patcher.revert()
    report = patcher.apply()
    state: dict = {}
    with pytest.raises(SystemExit):
        train(5, state)
    assert adam_steps(state["optimizer"]) == 2
    assert report.get("brake").status is Status.APPLIED
