"""One training session per applied patcher: the step counter and what listens to it.

Nothing here imports torch at ``apply()``: the optimizer-step hooks are registered
when torch is imported (at once if it already is), and the loop hooks are lazy
patches of a private Patcher, installed when their library is imported.
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import TYPE_CHECKING
from typing import Any
from typing import NoReturn

from ascend_patch_core import Record
from ascend_patch_core import Status
from ascend_patch_core import imports

from ._brake import Brake
from ._brake import BrakeExit
from ._loops import loop_patches
from ._msprobe import MsprobeControl
from ._msprobe import msprobe_missing
from ._profiler import ProfilerControl
from ._profiler import ProfilingOptions
from ._steps import StepCounter


if TYPE_CHECKING:
    from ascend_patch_core import Patcher

    from ._precision import PrecisionCheck
    from ._precision import PrecisionOptions

__all__ = ["TrainingSession"]


class TrainingSession:
    """Wires optimizer-step events to the profiler, the brake, msprobe and the precision check."""

    def __init__(
        self,
        patcher: Patcher,
        profiling: ProfilingOptions | None,
        brake_step: int | None,
        precision: PrecisionOptions | None,
    ) -> None:
        self.counter = StepCounter()
        self._lock = threading.RLock()
        self._loops: list[str] = []
        self._closed = False
        self._torch_watch: Any = None
        self._hook_handles: list[Any] = []
        self._forward_hook: Any = None
        self._internal: Patcher | None = None
        self._patcher = patcher

        self.profiler: ProfilerControl | None = None
        self.brake: Brake | None = None
        self.precision: PrecisionCheck | None = None
        self.msprobe: MsprobeControl | None = None
        self._records: list[Record] = []

        if profiling is not None:
            record = Record(
                "setting",
                "profiling",
                f"with_profiling({profiling.path!r}, level={profiling.level})",
                Status.PENDING,
                "waiting for training to start",
            )
            self.profiler = ProfilerControl(profiling, record)
            self._records.append(record)
        if brake_step is not None:
            record = Record(
                "setting",
                "brake",
                f"brake_at({brake_step})",
                Status.PENDING,
                f"waiting for the end of training step {brake_step}",
            )
            self.brake = Brake(
                brake_step, record, before_stop=self._before_stop, active_loop=self._active_loop
            )
            self._records.append(record)
        if precision is not None:
            from ._precision import PrecisionCheck

            self.precision = PrecisionCheck(precision, patcher)
            self._records.extend(self.precision.initial_records())
            if profiling is not None and profiling.level >= 2:
                self.precision.summary.warnings.append(
                    "with_profiling(level=2) traces Python stacks with its own profile function: "
                    "while it traces, calls are not checked; use level 0 or 1 with the precision check"
                )
            if precision.msprobe is not None:
                record = Record("setting", "msprobe", "msprobe.pytorch.PrecisionDebugger")
                missing = msprobe_missing()
                if missing is not None:
                    record.set(Status.SKIPPED, missing)
                else:
                    record.set(Status.PENDING, "waiting for training to start")
                    self.msprobe = MsprobeControl(precision.msprobe, record)
                self._records.append(record)
        self.steps_record = Record(
            "setting",
            "training_steps",
            "optimizer.step() (torch's global optimizer hooks)",
            Status.PENDING,
            "waiting for import of torch",
        )
        if self._counts_steps:
            self._records.insert(0, self.steps_record)

    @property
    def _counts_steps(self) -> bool:
        return self.profiler is not None or self.brake is not None or self.msprobe is not None

    @property
    def records(self) -> list[Record]:
        return list(self._records)

    # -- start and stop -------------------------------------------------------------------

    def start(self) -> None:
        if self._counts_steps:
            from ascend_patch_core import Patcher

            # Never strict: a loop library of another version must not break apply().
            self._internal = Patcher(strict=False).add(*loop_patches(self))
            self._internal.apply()
            self._note_internal_failures()
            self.counter.on_step_end(self._step_ended)
            if self.brake is not None:
                self.counter.on_before_optimizer_step(self.brake.before_optimizer_step)
            torch = sys.modules.get("torch")
            if torch is not None and not imports.is_initializing(torch):
                self._torch_ready()
            else:
                self._torch_watch = imports.on_import("torch", self._torch_imported)
        if self.precision is not None:
            self.precision.start()
        atexit.register(self._at_exit)

    def undo(self) -> None:
        """What ``Patcher.revert()`` calls: remove every hook, flush every output."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._at_exit)
        if self._torch_watch is not None:
            imports.cancel(self._torch_watch)
            self._torch_watch = None
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        self._remove_forward_hook()
        if self._internal is not None:
            self._note_internal_failures()
            self._internal.revert()
            self._internal = None
        self._finish("revert()")

    def _at_exit(self) -> None:
        self._finish("the end of the process")

    def _finish(self, why: str) -> None:
        if self.profiler is not None:
            self.profiler.flush(f"stopped at {why} after {self.counter.completed} training step(s)")
        if self.msprobe is not None:
            self.msprobe.close()
        if self.precision is not None:
            self.precision.stop()

    def _note_internal_failures(self) -> None:
        if self._internal is None:
            return
        for record in self._internal.report.records:
            if record.status is Status.FAILED:
                message = f"loop hook {record.target} failed: {record.reason}"
                if message not in self.steps_record.warnings:
                    self.steps_record.warnings.append(message)

    # -- torch side ------------------------------------------------------------------------

    def _torch_imported(self, module: Any) -> None:
        self._torch_watch = None
        self._torch_ready()

    def _torch_ready(self) -> None:
        if self._closed:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._hook_handles = [
            register_optimizer_step_pre_hook(self._optimizer_pre_hook),
            register_optimizer_step_post_hook(self._optimizer_post_hook),
        ]
        if (self.profiler is not None or self.msprobe is not None) and not self._loops:
            # A plain loop has no "training starts" event: the first forward is the closest.
            self._forward_hook = register_module_forward_pre_hook(self._first_forward)
        self.steps_record.set(Status.APPLIED, "counting optimizer steps; 0 training steps so far")

    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.counter.before_optimizer_step(optimizer)

    def _optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.counter.after_optimizer_step(optimizer)

    def _first_forward(self, module: Any, args: Any) -> None:
        self._remove_forward_hook()
        self._begin(module)

    def _remove_forward_hook(self) -> None:
        hook, self._forward_hook = self._forward_hook, None
        if hook is not None:
            hook.remove()

    def _begin(self, model: Any) -> None:
        if self.profiler is not None:
            self.profiler.restart_if_unused()
        if self.msprobe is not None:
            self.msprobe.begin(model)

    def _step_ended(self, step: int) -> None:
        self.steps_record.set(
            Status.APPLIED, f"counting optimizer steps; {step} training step(s) so far"
        )
        if self.precision is not None:
            self.precision.refresh()
        # When the brake stops here, the profiler is flushed inside this step's window
        # and msprobe not restarted: either would open a window for a step never run.
        braking = self.brake is not None and self.brake.due(step)
        if self.msprobe is not None:
            self.msprobe.step_ended(step, last=braking)
        if self.profiler is not None and not braking:
            self.profiler.step_ended(step)
        if self.brake is not None:
            self.brake.step_ended(step)  # last: it may leave the process

    def _before_stop(self, reason: str) -> None:
        if self.profiler is not None:
            self.profiler.flush(f"flushed by the brake: {reason}")
        if self.msprobe is not None:
            self.msprobe.close()
        if self.precision is not None:
            self.precision.write_output()

    def _active_loop(self) -> str | None:
        with self._lock:
            return self._loops[-1] if self._loops else None

    # -- LoopHost: what the loop hooks call ------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self.brake is not None and self.brake.stop_requested

    def loop_started(self, name: str, model: Any = None) -> None:
        with self._lock:
            if name in self._loops:
                return
            self._loops.append(name)
        self._remove_forward_hook()
        self._note_internal_failures()
        self._begin(model)

    def loop_ended(self, name: str) -> None:
        with self._lock:
            if name not in self._loops:
                return
            self._loops.remove(name)
        if self.brake is not None:
            self.brake.loop_ended()

    def optimizer_steps(self, optimizer: object) -> int:
        return self.counter.optimizer_steps.get(id(optimizer), 0)

    def optimizer_skipped(self, optimizer: object) -> None:
        self.counter.after_optimizer_step(optimizer)

    def loop_escaped(self, name: str) -> NoReturn:
        reason = f"{name} could not stop by itself"
        if self.brake is not None:
            self.brake.stop_process(reason)
        raise BrakeExit(0)
