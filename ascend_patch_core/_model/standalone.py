"""The seam between the declarations and what applies one of them alone.

The DrivingSDK patcher's ``AtomicPatch(...).apply()`` and ``Patch.apply_all()`` run
on a Patcher of their own (``_compat.per_patch``, in the compat layer). The Patcher imports
the declarations, so the declarations never import it, nor look it up: the compat
layer hands itself over (:func:`use_standalone`) when the package is imported, and
the declarations call what they were given (docs/core.md: no circles, run time
included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any


if TYPE_CHECKING:
    from typing import Protocol

    # Only for annotations: creating a Protocol class costs ~75 us at import. The
    # patches are Any here: naming their classes would import _patch, which imports this.

    class Standalone(Protocol):
        """What applies a patch or group alone."""

        def apply_one(self, patch: Any) -> Any: ...
        def revert_one(self, patch: Any) -> Any: ...
        def record_of(self, patch: Any) -> Any: ...
        def info_line(self, patch: Any, original: Any, new: Any, diff: bool) -> str: ...
        def apply_group(self, group: Any, options: Any) -> list[Any]: ...
        def revert_group(self, group: Any) -> list[Any]: ...
        def fold(self, records: list[Any], name: str) -> Any: ...


__all__ = ["standalone", "use_standalone"]

_runner: Standalone | None = None


def use_standalone(runner: Standalone) -> None:
    """Set what :meth:`AtomicPatch.apply` and :meth:`Patch.apply_all` run on."""
    global _runner
    _runner = runner


def standalone() -> Standalone:
    """What :func:`use_standalone` was given."""
    if _runner is None:  # pragma: no cover - ascend_patch_core registers it
        raise RuntimeError("import ascend_patch_core first")
    return _runner
