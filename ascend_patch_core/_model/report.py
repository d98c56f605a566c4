"""What apply() did: one live record per patch, rule and plugin, printable and JSON-able."""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from .value import Value


__all__ = [
    "APPLIED",
    "FAILED",
    "PENDING",
    "REVERTED",
    "SKIPPED",
    "CallCounters",
    "InstalledPatch",
    "Provenance",
    "Record",
    "Report",
    "Status",
]


class Status(str, enum.Enum):
    """Where a patch, rule or plugin stands."""

    #: Installed (a patch), serving imports (a rule), loaded (a plugin).
    APPLIED = "applied"
    #: Waiting for its target module to be imported.
    PENDING = "pending"
    #: Not applicable here (library absent, version out of range, precheck False, disabled).
    SKIPPED = "skipped"
    #: A bug or a broken environment: an exception, an invalid declaration.
    FAILED = "failed"
    #: Was applied, then undone by revert().
    REVERTED = "reverted"

    __module__ = "ascend_patch_core"

    def __str__(self) -> str:
        return self.value


# The members as plain names: ``Status.PENDING`` goes through the enum metaclass (~50 ns
# a lookup on 3.11), and the engine compares statuses several times per patch.
APPLIED = Status.APPLIED
PENDING = Status.PENDING
SKIPPED = Status.SKIPPED
FAILED = Status.FAILED
REVERTED = Status.REVERTED


class Provenance(Value):
    """Where a patch came from: a plugin's distribution, or the user's own code.

    Immutable by convention; equal when all fields are.
    """

    __slots__ = ("distribution", "entry_point", "file", "plugin", "version")
    _fields = ("plugin", "distribution", "version", "entry_point", "file")

    def __init__(
        self,
        plugin: str | None = None,
        distribution: str | None = None,
        version: str | None = None,
        entry_point: str | None = None,
        file: str | None = None,
    ) -> None:
        self.plugin = plugin
        self.distribution = distribution
        self.version = version
        self.entry_point = entry_point
        self.file = file

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items() if v is not None)
        return f"Provenance({inner})"

    def __str__(self) -> str:
        if self.plugin is None:
            return "user"
        if self.distribution:
            return f"{self.plugin} ({self.distribution} {self.version or '?'})"
        return self.plugin

    def as_dict(self) -> dict[str, str | None]:
        return dict(zip(self._fields, self._key(), strict=True))


Provenance.__module__ = "ascend_patch_core"
USER = Provenance()


class CallCounters:
    """Per-patch call counts of a ``runtime_check`` wrapper.

    Two ``itertools.count`` objects: the wrapper advances one with ``next()``, a single
    C call, atomic under the GIL and a few nanoseconds, cheap enough to leave on in
    production.
    """

    __slots__ = ("fallbacks", "replacements")

    def __init__(self) -> None:
        self.replacements = itertools.count()
        self.fallbacks = itertools.count()

    @staticmethod
    def _value(counter: itertools.count[int]) -> int:
        # repr(count(7)) == "count(7)": the only way to read a count without advancing it.
        return int(repr(counter)[6:-1])

    @property
    def replacement_calls(self) -> int:
        return self._value(self.replacements)

    @property
    def fallback_calls(self) -> int:
        return self._value(self.fallbacks)

    def as_dict(self) -> dict[str, int]:
        return {
            "replacement_calls": self.replacement_calls,
            "fallback_calls": self.fallback_calls,
        }


class _MadeOnUse:
    """A list or dict attribute made on first use: most records never need theirs.

    The value lives in the ``__slots__`` entry of the same name with a leading
    underscore; reading and writing the attribute work as for a plain one.
    """

    __slots__ = ("factory", "slot")

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.slot: Any = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = owner.__dict__["_" + name]

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        try:
            return self.slot.__get__(obj, owner)
        except AttributeError:
            value = self.factory()
            self.slot.__set__(obj, value)
            return value

    def __set__(self, obj: Any, value: Any) -> None:
        self.slot.__set__(obj, value)


class Record:
    """The live state of one patch, rule or plugin. Updated as imports happen."""

    __module__ = "ascend_patch_core"
    __slots__ = (
        "_aliases",
        "_rebound_holders",
        "_stale_holders",
        "_warnings",
        "counters",
        "group",
        "kind",
        "name",
        "note",
        "provenance",
        "reason",
        "status",
        "target",
    )

    #: Modules that still hold the original object (``from x import f`` made before apply).
    stale_holders: list[str] = _MadeOnUse(list)  # type: ignore[assignment]
    #: Holders that were rebound to the replacement (opt-in).
    rebound_holders: list[str] = _MadeOnUse(list)  # type: ignore[assignment]
    #: Status of each alias target, by path.
    aliases: dict[str, str] = _MadeOnUse(dict)  # type: ignore[assignment]
    warnings: list[str] = _MadeOnUse(list)  # type: ignore[assignment]

    def __init__(
        self,
        kind: str,
        name: str,
        target: str,
        status: Status = Status.PENDING,
        reason: str | None = None,
        group: str | None = None,
        provenance: Provenance = USER,
    ) -> None:
        #: "patch", "group", "hook", "legacy", "rule", "plugin", "env" or "setting".
        self.kind = kind
        self.name = name
        self.target = target
        self.status = status
        self.reason = reason
        self.group = group
        self.provenance = provenance
        #: Replacement/fallback call counts of a runtime_check patch.
        self.counters: CallCounters | None = None
        #: A patch's own line on how it works (``AtomicPatch(note=...)``), e.g. its kernel.
        self.note: str | None = None

    def __repr__(self) -> str:
        return f"<Record {self.kind} {self.name!r} {self.status.value}>"

    def set(self, status: Status, reason: str | None = None) -> None:
        self.status = status
        self.reason = reason

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "target": self.target,
            "group": self.group,
            "status": self.status.value,
            "reason": self.reason,
            "provenance": self.provenance.as_dict(),
        }
        if self.aliases:
            data["aliases"] = dict(self.aliases)
        if self.stale_holders:
            data["stale_holders"] = list(self.stale_holders)
        if self.rebound_holders:
            data["rebound_holders"] = list(self.rebound_holders)
        if self.counters is not None:
            data["counters"] = self.counters.as_dict()
        if self.note is not None:
            data["note"] = self.note
        if self.warnings:
            data["warnings"] = list(self.warnings)
        return data


class InstalledPatch:
    """One installed patch, as ``Patcher.installed()`` shows it to tools.

    ``replacement`` is the callable whose code runs in place of ``original`` (a
    runtime_check wrapper and a with_imports trampoline are looked through).
    """

    __module__ = "ascend_patch_core"
    __slots__ = ("original", "record", "replacement")

    def __init__(self, record: Record, original: Any, replacement: Any) -> None:
        self.record = record
        self.original = original
        self.replacement = replacement

    def __repr__(self) -> str:
        return f"<InstalledPatch {self.record.name!r}>"


class Report:
    """A view of a patcher's records. Live: pending patches turn applied as imports happen.

    ``str(report)`` is a compact table; :meth:`to_json` is the stable machine form
    (schema in docs/report-schema.md).
    """

    __module__ = "ascend_patch_core"

    def __init__(
        self,
        records: list[Record],
        warnings: list[str],
        lock: threading.RLock,
        before_read: Callable[[], None] | None = None,
    ) -> None:
        self._records = records
        self._warnings = warnings
        self._lock = lock
        #: Work the patcher defers until someone reads the report (the stale-reference scan).
        self._before_read = before_read

    @property
    def records(self) -> list[Record]:
        if self._before_read is not None:
            self._before_read()
        with self._lock:
            return list(self._records)

    @property
    def warnings(self) -> list[str]:
        if self._before_read is not None:
            self._before_read()
        with self._lock:
            return list(self._warnings)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def by_status(self, status: Status | str) -> list[Record]:
        status = Status(status)
        return [r for r in self.records if r.status is status]

    def get(self, name: str, kind: str | None = None) -> Record:
        """Return the record whose name or target is ``name``: a patch (its name or
        target), a rule (its module), a plugin (its entry-point name).

        A patch's record is named by its target in the module that defines it
        (``torch.serialization.load``); the public names it was also installed under
        (``torch.load``) are its ``aliases`` and find it too.
        """
        records = [r for r in self.records if kind is None or r.kind == kind]
        for record in records:
            if record.name == name:
                return record
        for record in records:
            if record.target == name:
                return record
        for record in records:
            if name in getattr(record, "_aliases", ()):  # without making an empty dict
                return record
        raise KeyError(name)

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.by_status(Status.FAILED)

    def counts(self) -> dict[str, int]:
        """Records by status: every record, shown in the table or not."""
        return _counts(self.records)

    def to_dict(self) -> dict[str, Any]:
        # One snapshot: the counts are those of exactly the records listed, even while
        # imports in other threads turn pending patches applied.
        records = self.records
        return {
            "schema": "ascend-patch-report/1",
            "counts": _counts(records),
            "records": [r.as_dict() for r in records],
            "warnings": self.warnings,
        }

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def table(self, *, verbose: bool = False) -> str:
        """A compact fixed-width table: the caller's own records, then one line per plugin.

        The caller's records (provenance ``plugin`` None) are listed one per line,
        then anything that failed; the plugins' other records are summarised, one
        line per plugin with its counts by status. ``verbose`` lists every record,
        with its aliases and call counters. The first line counts every record and
        says how many are not listed, so the summary and the rows always add up.
        """
        from .report_text import render

        return render(
            self.records, self.warnings, verbose=verbose, statuses=[s.value for s in Status]
        )

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={n}" for s, n in self.counts().items() if n)
        return f"<Report {counts}>"


def _counts(records: list[Record]) -> dict[str, int]:
    result = {status.value: 0 for status in Status}
    for record in records:
        result[record.status.value] += 1
    return result
