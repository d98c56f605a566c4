"""Training utilities behind ``with_profiling``, ``brake_at`` and ``with_precision_check``.

The Patcher calls :func:`start_training_utilities` from ``apply()`` and keeps the
records and the undo function it returns; ``revert()`` calls the undo. The pieces:

* ``_steps``: one notion of a training step, counted from optimizer steps;
* ``_profiler``: torch_npu.profiler / torch.profiler on the seed's schedule;
* ``_brake``: a clean stop after N steps on every rank;
* ``_loops``: loop-specific hooks (Trainer, mmengine, mmcv 1.x) for starting and
  for stopping cooperatively;
* ``_precision``, ``_rerun``, ``_compare``: the precision check of patches on live inputs;
* ``_msprobe``: mindstudio-probe's PrecisionDebugger around each step;
* ``_session``: the session tying them together.

See docs/training.md for the user's view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from .._report import Record


if TYPE_CHECKING:
    from .._patcher import Patcher

__all__ = ["start_training_utilities"]


def start_training_utilities(
    *,
    profiling: dict[str, Any] | None,
    brake_step: int | None,
    precision_check: dict[str, Any] | None,
    patcher: Patcher,
) -> tuple[list[Record], Callable[[], None]]:
    """Install what was asked for; return its records and a function undoing it.

    Raises :class:`PatchDefinitionError` for invalid ``with_precision_check`` options,
    before anything is installed.
    """
    from ._profiler import ProfilingOptions
    from ._session import TrainingSession

    precision = None
    if precision_check is not None:
        from ._precision import PrecisionOptions

        precision = PrecisionOptions.parse(precision_check)
    session = TrainingSession(
        patcher,
        None if profiling is None else ProfilingOptions.from_patcher(profiling),
        brake_step,
        precision,
    )
    session.start()
    return session.records, session.undo
