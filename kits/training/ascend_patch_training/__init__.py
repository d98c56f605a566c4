"""Training utilities for ascend-patch: ``with_profiling``, ``brake_at``, ``with_precision_check``.

The engine (ascend-patch-core) records what a patcher asks for and, at ``apply()``,
hands it to :data:`settings`, which this distribution publishes in the entry-point
group ``ascend_patch.settings``. The engine never imports this package; this
package uses only the engine's public API (``Patcher.installed()``, its report,
``ascend_patch_core.imports``). The pieces:

* ``_steps``: one notion of a training step, counted from optimizer steps;
* ``_profiler``: torch_npu.profiler / torch.profiler on the DrivingSDK patcher's schedule;
* ``_brake``: a clean stop after N steps on every rank;
* ``_loops``: loop-specific hooks (Trainer, mmengine, mmcv 1.x) for starting and
  for stopping cooperatively;
* ``_precision`` (with ``_precision_options``, ``_precision_records``,
  ``_precision_calls``), ``_rerun``, ``_compare``: the precision check of patches on
  live inputs;
* ``_msprobe``: mindstudio-probe's PrecisionDebugger around each step;
* ``_session``: the session tying them together.

Importing this package imports no torch. See docs/training.md for the user's view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import PatchDefinitionError


if TYPE_CHECKING:
    from ascend_patch_core import Patcher

    from ._session import TrainingSession

__all__ = ["TrainingSettings", "settings"]

_PROFILING_COUNTS = ("skip_first", "wait", "warmup", "active", "repeat")


class TrainingSettings:
    """The provider of the settings ``profiling``, ``brake`` and ``precision_check``."""

    names = ("profiling", "brake", "precision_check")

    def check(self, name: str, value: Any) -> None:
        """Validate one setting as the Patcher method received it; PatchDefinitionError if bad."""
        if name == "profiling":
            if value.get("level") not in (0, 1, 2):
                raise PatchDefinitionError(
                    f"with_profiling: level must be 0, 1 or 2, got {value.get('level')!r}"
                )
            for option in _PROFILING_COUNTS:
                count = value.get(option)
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise PatchDefinitionError(
                        f"with_profiling: {option} must be a non-negative int, got {count!r}"
                    )
        elif name == "brake":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PatchDefinitionError(f"brake_at: step must be a positive int, got {value!r}")
        elif name == "precision_check":
            from ._precision import PrecisionOptions

            PrecisionOptions.parse(value)
        else:
            raise PatchDefinitionError(f"ascend-patch-training provides no setting {name!r}")

    def start(self, patcher: Patcher, settings: dict[str, Any]) -> TrainingSession:
        """Install what was asked for; the session's ``undo()`` removes it (``revert()``)."""
        from ._profiler import ProfilingOptions
        from ._session import TrainingSession

        profiling = settings.get("profiling")
        precision = settings.get("precision_check")
        if precision is not None:
            from ._precision import PrecisionOptions

            precision = PrecisionOptions.parse(precision)
        session = TrainingSession(
            patcher,
            None if profiling is None else ProfilingOptions.from_patcher(profiling),
            settings.get("brake"),
            precision,
        )
        session.start()
        return session


#: What the entry points ``profiling``, ``brake`` and ``precision_check`` name.
settings = TrainingSettings()
