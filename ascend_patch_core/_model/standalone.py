"""The seam between the declarations and what applies one of them alone.

The DrivingSDK patcher's ``AtomicPatch(...).apply()`` and ``Patch.apply_all()`` run
on a Patcher of their own (``_compat.per_patch``). The Patcher imports the
declarations, so the declarations never import it, nor look it up: the package root
hands over how to load it (:func:`use_standalone`) and the declarations call what
that gives, on first use (docs/core.md: no circles, run time included). Most
programs never apply a patch alone, so none of it is imported at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
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

_load: Callable[[], Standalone] | None = None
_runner: Standalone | None = None


def use_standalone(load: Callable[[], Standalone]) -> None:
    """Set how to get what :meth:`AtomicPatch.apply` and :meth:`Patch.apply_all` run on."""
    global _load, _runner
    _load, _runner = load, None


def standalone() -> Standalone:
    """What the ``load`` given to :func:`use_standalone` returns (called once)."""
    global _runner
    if _runner is None:
        if _load is None:  # pragma: no cover - ascend_patch_core registers it
            raise RuntimeError("import ascend_patch_core first")
        _runner = _load()
    return _runner
