"""Loop-specific hooks, only where the generic optimizer-step hooks are not enough.

Steps are counted from optimizer steps in every loop (``_steps``). Loops need hooks
for two things only: to know when training starts (the profiler's step 1 and
msprobe's ``start(model)`` begin there, not at the first forward) and to stop
cooperatively at the end of an iteration instead of raising ``SystemExit``:

* Hugging Face ``Trainer``: a ``TrainerCallback`` (added to
  ``transformers.trainer.DEFAULT_CALLBACKS``) sets ``control.should_training_stop``.
* mmengine ``Runner``: a ``Hook`` registered at ``Runner.train`` with the lowest
  priority (so the iteration's logger and checkpoint hooks run first) sets the
  train loop's ``stop_training``; an epoch-based loop is left at the start of the
  next iteration (``EpochBasedTrainLoop.run_epoch`` catches that), so the cut epoch
  skips ``after_train_epoch`` while ``after_train`` and ``after_run`` still run.
* mmcv 1.x runners: a ``Hook`` registered at ``run``; ``IterBasedRunner`` ends by
  lowering its ``_max_iters``, ``EpochBasedRunner`` leaves the epoch the same way as
  mmengine's epoch loop and lowers ``_max_epochs``.
* ``GradScaler.step``: a step it skips (inf/NaN gradients) still counts as a step.

They are installed by a private, reversible Patcher of the training session, lazily
(when the library is imported), like any other patch.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any
from typing import NoReturn
from typing import Protocol

from ascend_patch_core import AtomicPatch


__all__ = ["LoopBrake", "LoopHost", "loop_patches"]


class LoopBrake(Exception):
    """Raised by a loop hook to leave an epoch early; caught by the loop's own wrapper."""


class LoopHost(Protocol):
    """What the loop hooks need from the training session."""

    @property
    def stop_requested(self) -> bool: ...

    def loop_started(self, name: str, model: Any = None) -> None: ...

    def loop_ended(self, name: str) -> None: ...

    def optimizer_steps(self, optimizer: object) -> int: ...

    def optimizer_skipped(self, optimizer: object) -> None: ...

    def loop_escaped(self, name: str) -> NoReturn: ...


def loop_patches(host: LoopHost) -> list[AtomicPatch]:
    def patch(target: str, wrapper: Callable[[Any], Any]) -> AtomicPatch:
        return AtomicPatch(target, target_wrapper=wrapper, name=f"training: {target}")

    return [
        patch("torch.amp.grad_scaler:GradScaler.step", functools.partial(_grad_scaler_step, host)),
        patch(
            "transformers.trainer:DEFAULT_CALLBACKS", functools.partial(_trainer_callbacks, host)
        ),
        patch("mmengine.runner.runner:Runner.train", functools.partial(_mmengine_train, host)),
        patch(
            "mmengine.runner.loops:EpochBasedTrainLoop.run_epoch",
            functools.partial(_leave_epoch, host, _stop_mmengine_epoch_loop),
        ),
        patch(
            "mmcv.runner.epoch_based_runner:EpochBasedRunner.run",
            functools.partial(_mmcv_run, host, "the mmcv EpochBasedRunner"),
        ),
        patch(
            "mmcv.runner.iter_based_runner:IterBasedRunner.run",
            functools.partial(_mmcv_run, host, "the mmcv IterBasedRunner"),
        ),
        patch(
            "mmcv.runner.epoch_based_runner:EpochBasedRunner.train",
            functools.partial(_leave_epoch, host, _stop_mmcv_epoch_runner),
        ),
    ]


# -- torch ------------------------------------------------------------------------------


def _grad_scaler_step(host: LoopHost, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = host.optimizer_steps(optimizer)
        result = original(self, optimizer, *args, **kwargs)
        if host.optimizer_steps(optimizer) == before:
            host.optimizer_skipped(optimizer)
        return result

    return step


# -- Hugging Face Trainer -----------------------------------------------------------------


def _trainer_callbacks(host: LoopHost, original: list[Any]) -> list[Any]:
    TrainerCallback: Any = importlib.import_module("transformers.trainer_callback").TrainerCallback

    name = "the Hugging Face Trainer"

    class AscendPatchTrainingCallback(TrainerCallback):  # type: ignore[misc]
        """ascend-patch training utilities: loop start/end and the brake's cooperative stop."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            host.loop_started(name, kwargs.get("model"))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if host.stop_requested:
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            host.loop_ended(name)

    return [*original, AscendPatchTrainingCallback]


# -- mmengine -----------------------------------------------------------------------------


def _mmengine_train(host: LoopHost, original: Callable[..., Any]) -> Callable[..., Any]:
    Hook: Any = importlib.import_module("mmengine.hooks").Hook
    EpochBasedTrainLoop: Any = importlib.import_module("mmengine.runner.loops").EpochBasedTrainLoop

    name = "the mmengine Runner"

    class AscendPatchTrainingHook(Hook):  # type: ignore[misc]
        """ascend-patch training utilities: loop start/end and the brake's cooperative stop.

        Registered twice: with the highest priority for the ``before_*`` events (leave
        before any other hook prepares an iteration that will not run) and with the
        lowest for the ``after_*`` ones (stop after the iteration's logger and
        checkpoint hooks ran).
        """

        def __init__(self, first: bool) -> None:
            super().__init__()
            self.first = first

        def before_train(self, runner: Any) -> None:
            if self.first:
                host.loop_started(name, getattr(runner, "model", None))

        def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
            if (
                self.first
                and host.stop_requested
                and isinstance(runner.train_loop, EpochBasedTrainLoop)
            ):
                raise LoopBrake(name)

        def after_train_iter(
            self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None
        ) -> None:
            if not self.first and host.stop_requested:
                runner.train_loop.stop_training = True

        def after_train(self, runner: Any) -> None:
            if not self.first:
                host.loop_ended(name)

    return _with_runner_hooks(host, name, original, AscendPatchTrainingHook)


def _stop_mmengine_epoch_loop(loop: Any) -> None:
    loop.stop_training = True


# -- mmcv 1.x -----------------------------------------------------------------------------


def _mmcv_run(host: LoopHost, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    runner_module: Any = importlib.import_module("mmcv.runner")
    EpochBasedRunner: Any = runner_module.EpochBasedRunner
    Hook: Any = runner_module.Hook

    class AscendPatchTrainingHook(Hook):  # type: ignore[misc]
        """ascend-patch training utilities (registered twice, as for mmengine)."""

        def __init__(self, first: bool) -> None:
            super().__init__()
            self.first = first

        def before_run(self, runner: Any) -> None:
            if self.first:
                host.loop_started(name, getattr(runner, "model", None))

        def before_train_iter(self, runner: Any) -> None:
            if self.first and host.stop_requested and isinstance(runner, EpochBasedRunner):
                raise LoopBrake(name)

        def after_train_iter(self, runner: Any) -> None:
            if not self.first and host.stop_requested and not isinstance(runner, EpochBasedRunner):
                # IterBasedRunner.run loops while iter < _max_iters; iter becomes
                # runner.iter + 1 right after this hook.
                runner._max_iters = runner.iter + 1

        def after_run(self, runner: Any) -> None:
            if not self.first:
                host.loop_ended(name)

    return _with_runner_hooks(host, name, original, AscendPatchTrainingHook)


def _stop_mmcv_epoch_runner(runner: Any) -> None:
    # The cut epoch did not reach `_epoch += 1`; EpochBasedRunner.run stops once
    # epoch >= _max_epochs.
    runner._max_epochs = runner.epoch


def _leave_epoch(
    host: LoopHost, stop: Callable[[Any], None], original: Callable[..., Any]
) -> Callable[..., Any]:
    """Wrap one epoch's loop: a LoopBrake from the next iteration's hook ends the epoch there."""

    @functools.wraps(original)
    def run_epoch(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except LoopBrake:
            stop(self)
            return None

    return run_epoch


def _with_runner_hooks(
    host: LoopHost, name: str, original: Callable[..., Any], hook_class: Any
) -> Callable[..., Any]:
    """Wrap a runner's train/run method: register the hook pair once, end the loop cleanly.

    mmengine's and mmcv 1.x's runners share the shape: hooks with priorities, one
    registered first (HIGHEST) and one last (LOWEST) so the utilities see the step
    before and after everyone else.
    """

    @functools.wraps(original)
    def run_with_hooks(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(isinstance(hook, hook_class) for hook in self._hooks):
            self.register_hook(hook_class(first=True), priority="HIGHEST")
            self.register_hook(hook_class(first=False), priority="LOWEST")
        try:
            return original(self, *args, **kwargs)
        except LoopBrake:
            host.loop_escaped(name)
        finally:
            host.loop_ended(name)

    return run_with_hooks
