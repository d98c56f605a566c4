"""``brake_at(N)``: stop training cleanly after N training steps, on every rank.

When N steps have ended, the profiler is flushed first. Then:

* inside a loop that can stop by itself (the Hugging Face Trainer, an mmengine
  Runner, an mmcv 1.x runner), the loop is asked to stop at the end of the current
  iteration: its own end-of-training hooks run and ``train()``/``run()`` returns,
  so the script goes on (saving, evaluating) and exits normally;
* in any other loop (plain PyTorch) there is no cooperative way to leave the user's
  ``for`` loop, so the brake raises ``SystemExit(0)`` from the optimizer-step hook,
  after a barrier when ``torch.distributed`` is initialized, so that no rank leaves
  while another is still in a collective. Exit status 0, like the DrivingSDK patcher's brake.

Every rank counts the same optimizer steps, so every rank stops at the same step.
If a loop was asked to stop but steps the optimizer again anyway (a custom loop that
ignores the request), the brake falls back to ``SystemExit(0)`` before that step.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ascend_patch_core import Record
from ascend_patch_core import Status


__all__ = ["Brake", "BrakeExit", "announce", "rank"]


class BrakeExit(SystemExit):
    """``SystemExit(0)`` raised by the brake in a plain loop (a subclass, so tests can tell)."""


def rank() -> int:
    """This process's rank: torch.distributed's when initialized, else from the launcher's RANK."""
    dist = _distributed()
    if dist is not None:
        return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def announce(message: str) -> None:
    """Print one line for the user on stderr, from rank 0 only."""
    if rank() == 0:
        print(f"ascend-patch: {message}", file=sys.stderr, flush=True)


def _distributed() -> Any:
    """torch.distributed when it is imported and initialized, else None (never imports it)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


class Brake:
    """Listens for the end of training step N and stops the loop."""

    def __init__(
        self,
        step: int,
        record: Record,
        *,
        before_stop: Callable[[str], None],
        active_loop: Callable[[], str | None],
    ) -> None:
        self.step = step
        self.record = record
        #: Called with the reason before stopping: flushes the profiler and the reports.
        self._before_stop = before_stop
        #: The name of the cooperative loop running now, if any.
        self._active_loop = active_loop
        self._lock = threading.Lock()
        self.fired = False
        #: Set while a cooperative loop has been asked to stop and has not yet ended.
        self.stop_requested = False

    def due(self, step: int) -> bool:
        """Whether the end of training step ``step`` fires the brake."""
        return not self.fired and step >= self.step

    def step_ended(self, step: int) -> None:
        with self._lock:
            if self.fired or step < self.step:
                return
            self.fired = True
        reason = f"brake_at({self.step}): training step {step} ended"
        self._before_stop(reason)
        loop = self._active_loop()
        if loop is not None:
            self.stop_requested = True
            self.record.set(
                Status.APPLIED, f"{reason}; {loop} stopped at the end of that iteration"
            )
            announce(f"{reason}; stopping {loop} at the end of this iteration")
            return
        self.stop_process(reason)

    def before_optimizer_step(self) -> None:
        """A stop was requested but the loop steps again: it ignored the request."""
        if self.stop_requested:
            self.stop_requested = False
            self.stop_process(
                f"brake_at({self.step}): the training loop did not stop when asked and stepped again"
            )

    def loop_ended(self) -> None:
        """The cooperative loop has stopped (or ended by itself): nothing more to do."""
        self.stop_requested = False

    def stop_process(self, reason: str) -> None:
        """Leave a plain loop: barrier across ranks, a message, ``SystemExit(0)``."""
        dist = _distributed()
        if dist is not None:
            try:
                dist.barrier()
            except Exception as exc:  # a broken group must not hide why we stop
                announce(f"barrier before stopping failed: {exc!r}")
        self.record.set(Status.APPLIED, f"{reason}; the process exited with status 0")
        announce(f"{reason}; exiting with status 0 (no cooperative loop to stop)")
        raise BrakeExit(0)
