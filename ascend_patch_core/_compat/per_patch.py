"""Applying one patch or one group on its own, and ``Patcher.print_info()``.

The DrivingSDK patcher's ``AtomicPatch(...).apply()``, ``.is_applied``,
``.get_info()`` and ``Patch.apply_all()`` (``Patcher.print_info()``: ``_engine.info``). Each
patch or group applied alone gets a Patcher of its own, so it is lazy and reversible
like everything else: ``apply()`` returns the patch's record, which says ``pending``
until the target module is imported, and ``revert()`` undoes it.

The declarations (``_model.patch``) cannot import the Patcher (it imports them): the
package root tells them how to load this module (``_model.standalone``), which they
do on first use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._engine.patcher import Patcher
from .._model.patch import AtomicPatch
from .._model.patch import Patch
from .._model.report import Record
from .._model.report import Status
from .._model.work_locks import work_lock


__all__ = [
    "apply_group",
    "apply_one",
    "fold",
    "info_line",
    "record_of",
    "revert_group",
    "revert_one",
]


#: Two threads applying the same patch or group alone must share one Patcher: two would
#: install it twice, and revert() would undo only the one it finds. (Re-entrant: a
#: fork() child makes it new unless the forking thread holds it; see _fork.)
_own_lock = work_lock()


def info_line(patch: AtomicPatch, original: Any, replacement: Any, diff: bool) -> str:
    """``AtomicPatch.get_info()``'s line (:func:`._info.info_line`, imported on first use:
    every ``apply()`` imports this module, few programs ask for the line)."""
    from .._engine.info import info_line as line

    return line(patch, original, replacement, diff)


def apply_one(patch: AtomicPatch) -> Record:
    """Apply ``patch`` on a Patcher of its own (once); return its record."""
    with _own_lock:
        own: Patcher | None = getattr(patch, "_own_patcher", None)
        if own is None:
            own = Patcher().add(patch)
            patch._own_patcher = own  # type: ignore[attr-defined]
    return _record_of(own.apply(), patch)


def revert_one(patch: AtomicPatch) -> Record | None:
    own: Patcher | None = getattr(patch, "_own_patcher", None)
    return None if own is None else _record_of(own.revert(), patch)


def record_of(patch: AtomicPatch) -> Record | None:
    own: Patcher | None = getattr(patch, "_own_patcher", None)
    return None if own is None else _record_of(own.report, patch)


def _record_of(records: Iterable[Record], patch: AtomicPatch) -> Record:
    for record in records:
        if record.kind == "patch" and record.name == patch.name:
            return record
    raise LookupError(f"no record for {patch!r}")  # pragma: no cover - add() always makes one


def apply_group(group: type[Patch], options: Any) -> list[Record]:
    """``Patch.apply_all()``: the group's patches applied on a Patcher of its own."""
    with _own_lock:
        own: Patcher | None = group.__dict__.get("_own_patcher")
        # Not applied (never, or reverted): a new one, so these options reach patches().
        if own is None or not own.is_applied:
            own = Patcher().add(group, options=options)
            group._own_patcher = own  # type: ignore[attr-defined]
    report = own.apply()
    return [r for r in report.records if r.group == group.name or r.name == group.name]


def revert_group(group: type[Patch]) -> list[Record]:
    """``Patch.revert_all()``: undo :func:`apply_group`."""
    own: Patcher | None = group.__dict__.get("_own_patcher")
    if own is None:
        return []
    return [r for r in own.revert() if r.group == group.name or r.name == group.name]


def fold(records: list[Record], name: str) -> Record:
    """One record for a group: failed if one failed, applied if one applied, ..."""
    statuses = {r.status for r in records}
    for status in (Status.FAILED, Status.APPLIED, Status.PENDING, Status.SKIPPED):
        if status in statuses:
            reasons = sorted({r.reason for r in records if r.status is status and r.reason})
            return Record("group", name, name, status, "; ".join(reasons) or None, name)
    return Record("group", name, name, Status.SKIPPED, "declares no patch", name)
