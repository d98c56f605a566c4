"""One notion of a training step for every loop: a step of the optimizer.

Plain loops, mmengine, mmcv and the Hugging Face Trainer all end a training step
with ``optimizer.step()``; torch calls global hooks around every such call, so
counting them needs nothing loop-specific. With gradient accumulation one step is
one optimizer step, which is what users mean by a step.

Several optimizers (a GAN's generator and discriminator) step once each per
training step. The *lead* is the first optimizer that steps; the others that stepped
between the lead's previous two steps are its *companions*. A training step ends
once the lead and all its companions have stepped, or at the latest right before the
lead steps again. Step 1 cannot know its companions yet, so it ends with the lead's
first step. An optimizer that steps twice while the lead does not becomes the lead
(a second training phase with a new optimizer).

A step that ``GradScaler`` skips (inf/NaN gradients) still counts, as it does for
the Trainer's ``global_step`` and mmengine's iterations: the loop did the step's work.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any


__all__ = ["StepCounter"]

StepListener = Callable[[int], None]


class StepCounter:
    """Turns optimizer-step events into "training step N ended" calls to listeners.

    Pure bookkeeping, no torch: the training session feeds it the events.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Training steps completed so far in this process.
        self.completed = 0
        #: Optimizer steps seen per optimizer (including skipped ones), by id.
        self.optimizer_steps: dict[int, int] = {}
        self._listeners: list[StepListener] = []
        self._before_step: list[Callable[[], None]] = []
        self._lead: weakref.ReferenceType[Any] | None = None
        self._since_lead: set[int] = set()
        self._waiting: set[int] | None = None

    def on_step_end(self, listener: StepListener) -> None:
        """Call ``listener(step)`` when training step ``step`` (1-based) has ended."""
        self._listeners.append(listener)

    def on_before_optimizer_step(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` before every optimizer step (after any step it ends)."""
        self._before_step.append(callback)

    # -- events ---------------------------------------------------------------------

    def before_optimizer_step(self, optimizer: object) -> None:
        """``optimizer.step()`` is about to run."""
        with self._lock:
            ended = self._waiting is not None and self._is_lead(optimizer)
            step = self._end_step() if ended else 0
        if ended:
            self._notify(step)
        for callback in self._before_step:
            callback()

    def after_optimizer_step(self, optimizer: object) -> None:
        """``optimizer.step()`` has run, or ``GradScaler`` skipped it."""
        ended: list[int] = []
        with self._lock:
            key = id(optimizer)
            self.optimizer_steps[key] = self.optimizer_steps.get(key, 0) + 1
            lead = self._lead() if self._lead is not None else None
            if lead is None:
                self._set_lead(optimizer)
            elif lead is not optimizer and key in self._since_lead:
                # Stepped twice while the lead did not: it drives the steps now.
                self._since_lead.discard(key)
                self._set_lead(optimizer)
            if self._is_lead(optimizer):
                if self._waiting is not None:  # a companion skipped its step
                    ended.append(self._end_step())
                self._waiting = set(self._since_lead)
                self._since_lead = set()
                if not self._waiting:
                    ended.append(self._end_step())
            else:
                self._since_lead.add(key)
                if self._waiting is not None:
                    self._waiting.discard(key)
                    if not self._waiting:
                        ended.append(self._end_step())
        for step in ended:
            self._notify(step)

    # -- internals ------------------------------------------------------------------

    def _set_lead(self, optimizer: object) -> None:
        try:
            self._lead = weakref.ref(optimizer)
        except TypeError:  # not weak-referenceable: keep it alive instead
            self._lead = _StrongRef(optimizer)  # type: ignore[assignment]

    def _is_lead(self, optimizer: object) -> bool:
        return self._lead is not None and self._lead() is optimizer

    def _end_step(self) -> int:
        self._waiting = None
        self.completed += 1
        return self.completed

    def _notify(self, step: int) -> None:
        for listener in self._listeners:
            listener(step)


class _StrongRef:
    __slots__ = ("_obj",)

    def __init__(self, obj: object) -> None:
        self._obj = obj

    def __call__(self) -> object:
        return self._obj
