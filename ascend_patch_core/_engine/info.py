"""``Patcher.print_info(diff=...)`` and ``AtomicPatch.get_info()``: the DrivingSDK patcher's listing.

Each patch as ``target: original -> replacement`` with its state, by top-level
module; with ``diff`` the unified diff of the two sources.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any

from .._discovery.metadata import metadata
from .._install.entries import Entry
from .._install.entries import Ledger
from .._model.report import InstalledPatch
from .._model.report import Status
from .plan import plan


if TYPE_CHECKING:
    from .._model.patch import AtomicPatch

__all__ = ["info_line", "installed_patches", "patcher_info"]


def _qualname(obj: Any) -> str:
    if obj is None:
        return "<missing>"
    if isinstance(obj, str):
        return obj
    inner = getattr(obj, "__func__", obj)  # staticmethod / classmethod
    module = getattr(inner, "__module__", None)
    name = getattr(inner, "__qualname__", None) or type(inner).__qualname__
    return f"{module}.{name}" if module else str(name)


def _source(obj: Any) -> list[str]:
    try:
        return inspect.getsource(getattr(obj, "__func__", obj)).splitlines(keepends=True)
    except (OSError, TypeError):
        return []


def info_line(patch: AtomicPatch, original: Any, replacement: Any, diff: bool) -> str:
    """``"target: original -> replacement"``, plus the source diff when asked."""
    line = f"{patch.target}: {_qualname(original)} -> {_qualname(replacement)}"
    if not diff or original is None or replacement is None or isinstance(replacement, str):
        return line
    import difflib

    lines = difflib.unified_diff(
        _source(original), _source(replacement), _qualname(original), _qualname(replacement)
    )
    return line + "\n" + "".join(lines).rstrip("\n")


def patcher_info(
    applied: bool,
    ledger: Ledger,
    items: list[Any],
    disabled: Iterable[str],
    enabled: frozenset[str],
    diff: bool,
) -> str:
    """What ``Patcher.print_info()`` prints: each patch by module, with its state."""
    if applied:
        with ledger.lock:
            entries = list(ledger.entries)
    else:  # planned as apply() would, changing nothing
        entries = plan(
            items, Ledger(), metadata, disabled=frozenset(disabled), enabled=enabled, dry_run=True
        ).entries
    by_module: dict[str, list[Entry]] = {}
    for entry in entries:
        by_module.setdefault(entry.patch.module, []).append(entry)
    out = [f"Patcher Info ({len(by_module)} modules, {len(entries)} patches)"]
    for module, found in by_module.items():
        out.append(f"[{module}] {len(found)} patches")
        for entry in found:
            state = entry.status.value
            if entry.status is Status.SKIPPED and entry.record.reason == "disabled":
                state = "disabled"
            replacement = entry.replacement or entry.patch.replacement
            text = info_line(entry.patch, entry.original, replacement, diff)
            out.append(f"  [{state}] " + text.replace("\n", "\n    "))
    return "\n".join(out)


def installed_patches(ledger: Ledger) -> list[InstalledPatch]:
    """``Patcher.installed()``: record, original and replacement of each installed patch."""
    from .._install.target import inner_callable
    from .._install.with_imports import lazy_imports_of

    with ledger.lock:
        applied = [e for e in ledger.entries if e.status is Status.APPLIED]
    out = []
    for entry in applied:
        replacement = inner_callable(entry.replacement)
        lazy = lazy_imports_of(replacement)
        out.append(InstalledPatch(entry.record, entry.original, lazy.func if lazy else replacement))
    return out
