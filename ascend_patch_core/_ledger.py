"""What one patcher planned and did, and the lock that guards it.

The Patcher, the planner, the installer and the undo log all read and write the
same records and entries; the ledger is where they live. It also keeps the index
that makes planning linear: the first live entry per target (collisions).

Thread safety: every mutation happens under ``lock`` (re-entrant), held only for
bookkeeping; no import starts and no user code runs while it is held.
"""

from __future__ import annotations

import threading

from ._entries import NOT_APPLIED
from ._entries import Entry
from ._entries import HookState
from ._entries import LegacyState
from ._entries import norm_target
from ._report import Record


__all__ = ["Ledger"]


class Ledger:
    """Records, warnings and entries of one patcher, with their indexes."""

    __slots__ = (
        "by_target",
        "entries",
        "hooks",
        "legacy",
        "lock",
        "records",
        "warnings",
    )

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Every record of the report, in the order things were declared.
        self.records: list[Record] = []
        self.warnings: list[str] = []
        self.entries: list[Entry] = []
        self.hooks: list[HookState] = []
        self.legacy: list[LegacyState] = []
        #: First live entry per normalized target or alias path.
        self.by_target: dict[str, Entry] = {}

    def warn(self, message: str) -> None:
        with self.lock:
            if message not in self.warnings:
                self.warnings.append(message)

    def add(self, entries: list[Entry], hooks: list[HookState], legacy: list[LegacyState]) -> None:
        """Take planned entries in (the planner has already indexed them)."""
        with self.lock:
            self.entries.extend(entries)
            self.hooks.extend(hooks)
            self.legacy.extend(legacy)

    def holder_of(self, path: str) -> Entry | None:
        """The live entry that patches ``path`` (as target or alias), if any."""
        entry = self.by_target.get(norm_target(path))
        if entry is not None and entry.status in NOT_APPLIED:
            return None
        return entry

    def clear(self) -> tuple[list[Entry], list[HookState], list[LegacyState]]:
        """Forget every entry (revert): return what was there."""
        with self.lock:
            entries, self.entries = self.entries, []
            hooks, self.hooks = self.hooks, []
            legacy, self.legacy = self.legacy, []
            self.by_target = {}
        return entries, hooks, legacy

    def take_report(self) -> tuple[list[Record], list[str]]:
        """Hand the records and warnings over (revert) and start empty ones."""
        with self.lock:
            records, self.records = self.records, []
            warnings, self.warnings = self.warnings, []
        return records, warnings
