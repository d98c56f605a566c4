"""``with_profiling``: torch_npu.profiler on an NPU, torch.profiler elsewhere, stepped per training step.

Schedule semantics are the DrivingSDK patcher's documented ones: ``skip_first`` steps are ignored,
then ``repeat + 1`` cycles of ``wait`` idle, ``warmup`` and ``active`` traced steps,
so ``skip_first + (wait + warmup + active) * (repeat + 1)`` steps in all; ``repeat=0``
means one cycle (not "until training stops", as torch's own ``repeat=0`` would).
The schedule is always built with keywords (the DrivingSDK patcher passed warmup and active
positionally, in swapped order). Each cycle writes one trace under ``path``; once
the last cycle is written the profiler stops, so it costs nothing afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any
from typing import NamedTuple

from ascend_patch_core import Record
from ascend_patch_core import Status


__all__ = ["ProfilerControl", "ProfilingOptions"]


class ProfilingOptions(NamedTuple):
    """The validated arguments of ``Patcher.with_profiling``."""

    path: str
    level: int
    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int

    @property
    def cycles(self) -> int:
        return self.repeat + 1

    @property
    def total_steps(self) -> int:
        """Steps until the last trace is written: skip_first + (wait+warmup+active) x (repeat+1)."""
        return self.skip_first + (self.wait + self.warmup + self.active) * self.cycles

    @property
    def active_steps(self) -> list[int]:
        """The 1-based training steps that are traced."""
        steps: list[int] = []
        cycle = self.wait + self.warmup + self.active
        for index in range(self.cycles):
            first = self.skip_first + index * cycle + self.wait + self.warmup + 1
            steps.extend(range(first, first + self.active))
        return steps

    @classmethod
    def from_patcher(cls, options: dict[str, Any]) -> ProfilingOptions:
        return cls(**{field: options[field] for field in cls._fields})


class ProfilerControl:
    """Owns the one profiler of a training session: start, step, flush."""

    def __init__(self, options: ProfilingOptions, record: Record) -> None:
        self.options = options
        self.record = record
        self.backend: str | None = None
        self._lock = threading.RLock()
        self._profiler: Any = None
        self._steps = 0
        self._finished = False

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def start(self) -> None:
        """Start profiling from here: the next training step is step 1 of the schedule."""
        with self._lock:
            if self._profiler is not None or self._finished:
                return
            if self.options.active == 0:
                self._finish("active=0: nothing to trace")
                return
            try:
                self._profiler, self.backend = _build_profiler(self.options)
                self._profiler.start()
            except Exception as exc:
                self._profiler = None
                self._finished = True
                self.record.set(Status.FAILED, f"cannot start the profiler: {exc!r}")
                return
            self.record.set(
                Status.APPLIED,
                f"{self.backend}: tracing training steps {_ranges(self.options.active_steps)} "
                f"into {self.options.path}",
            )

    def restart_if_unused(self) -> None:
        """A training loop starts: begin step 1 here unless a step was already profiled."""
        with self._lock:
            if self._profiler is not None and self._steps == 0:
                discarded, self._profiler = self._profiler, None
                # Whatever it saw happened before training: no trace for it.
                discarded.on_trace_ready = None
                with contextlib.suppress(Exception):  # nothing it saw is worth reporting
                    discarded.stop()
        self.start()

    def step_ended(self, step: int) -> None:
        with self._lock:
            if self._profiler is None:
                return
            self._steps += 1
            try:
                self._profiler.step()
            except Exception as exc:
                self._drop(f"the profiler failed at step {step}: {exc!r}")
                return
            if self._steps >= self.options.total_steps:
                self.flush(f"done: {self.options.cycles} trace(s) written to {self.options.path}")

    def flush(self, why: str | None = None) -> None:
        """Stop the profiler; a cycle in progress is written out."""
        with self._lock:
            profiler, self._profiler = self._profiler, None
            if profiler is None:
                return
            try:
                profiler.stop()
            except Exception as exc:
                self._finished = True
                self.record.set(Status.FAILED, f"the profiler failed to stop: {exc!r}")
                return
            self._finish(
                why
                or f"stopped after {self._steps} training step(s); traces in {self.options.path}"
            )

    def _finish(self, why: str) -> None:
        self._finished = True
        self.record.set(Status.APPLIED, f"{self.backend or 'profiler'}: {why}")

    def _drop(self, why: str) -> None:
        self._profiler = None
        self._finished = True
        self.record.set(Status.FAILED, why)


def _ranges(steps: list[int]) -> str:
    """[21, 22, 25] -> '21-22, 25'."""
    parts: list[str] = []
    start = previous = None
    for step in [*steps, None]:
        if start is not None and (step is None or step != previous + 1):  # type: ignore[operator]
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = None
        if step is not None and start is None:
            start = step
        previous = step
    return ", ".join(parts) or "none"


def _npu_profiler_module() -> Any:
    """torch_npu.profiler when torch_npu is imported and has it (a real NPU stack), else None."""
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is None:
        return None
    try:
        import importlib

        module = importlib.import_module("torch_npu.profiler")
    except Exception:
        return None
    needed = ("profile", "schedule", "tensorboard_trace_handler", "ProfilerActivity")
    return module if all(hasattr(module, name) for name in needed) else None


def _build_profiler(options: ProfilingOptions) -> tuple[Any, str]:
    os.makedirs(options.path, exist_ok=True)
    npu = _npu_profiler_module()
    if npu is not None:
        return _build_npu_profiler(npu, options), "torch_npu.profiler"
    import torch.profiler

    activities = [torch.profiler.ProfilerActivity.CPU]
    import torch

    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(
            skip_first=options.skip_first,
            wait=options.wait,
            warmup=options.warmup,
            active=options.active,
            repeat=options.cycles,
        ),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(options.path),
        record_shapes=options.level >= 1,
        profile_memory=options.level >= 2,
        with_stack=options.level >= 2,
    )
    return profiler, "torch.profiler"


def _build_npu_profiler(npu: Any, options: ProfilingOptions) -> Any:
    """The DrivingSDK patcher's mapping: level 0 traces the NPU only, 1 adds the CPU and shapes, 2 memory and stacks."""
    activities = [npu.ProfilerActivity.NPU]
    if options.level >= 1:
        activities.append(npu.ProfilerActivity.CPU)
    kwargs: dict[str, Any] = {
        "activities": activities,
        "schedule": npu.schedule(
            skip_first=options.skip_first,
            wait=options.wait,
            warmup=options.warmup,
            active=options.active,
            repeat=options.cycles,
        ),
        "on_trace_ready": npu.tensorboard_trace_handler(options.path),
        "record_shapes": options.level >= 1,
        "profile_memory": options.level >= 2,
        "with_stack": options.level >= 2,
    }
    levels = getattr(npu, "ProfilerLevel", None)
    config = getattr(npu, "_ExperimentalConfig", None)
    if levels is not None and config is not None:
        names = ("Level0", "Level1", "Level2")
        level = getattr(levels, names[options.level], None) or levels.Level1
        kwargs["experimental_config"] = config(profiler_level=level)
    return npu.profile(**kwargs)
