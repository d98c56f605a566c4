"""Training utilities behind ``with_profiling``, ``brake_at`` and ``with_precision_check``.

Placeholder: the utilities are not implemented yet, so the patcher reports them as
skipped instead of ignoring them silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from ._report import Record
from ._report import Status


if TYPE_CHECKING:
    from ._patcher import Patcher

__all__ = ["start_training_utilities"]


def start_training_utilities(
    *,
    profiling: dict[str, Any] | None,
    brake_step: int | None,
    precision_check: dict[str, Any] | None,
    patcher: Patcher,
) -> tuple[list[Record], Callable[[], None]]:
    """Install what was asked for; return its records and a function undoing it."""
    record = Record("setting", "training", "with_profiling/brake_at/with_precision_check")
    record.set(
        Status.SKIPPED,
        "profiling, brake and precision check need the training utilities, which this version does not ship yet",
    )
    return [record], lambda: None
