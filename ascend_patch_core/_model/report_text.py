"""The text form of a report: ``str(report)`` and ``report.table(verbose=...)``.

The short table leads with what the caller asked for -- their own patches, groups,
hooks and rules (provenance ``plugin`` None) -- and summarises the installed
plugins' records in one line per plugin (counts by status), because a machine with
the three first-party plugins has ~90 of them and a user's one patch used to come
last. Anything that failed is always listed in full, whoever declared it.
``verbose`` lists every record, as before. The first line counts every record, and
the records not listed are counted there, so the counts always add up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Protocol


__all__ = ["render"]


class _Status(Protocol):
    @property
    def value(self) -> str: ...


class _Provenance(Protocol):
    @property
    def plugin(self) -> str | None: ...


class _Counters(Protocol):
    @property
    def replacement_calls(self) -> int: ...
    @property
    def fallback_calls(self) -> int: ...


class Record(Protocol):
    """What the table reads of a record (``_model.report.Record``).

    A protocol, not the class: ``_model.report`` loads this module (on the first
    ``str(report)``), so naming its class here would make a circle. mypy checks the
    records against it where the Report hands them to :func:`render`.
    """

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def status(self) -> _Status: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def note(self) -> str | None: ...
    @property
    def provenance(self) -> _Provenance: ...
    @property
    def counters(self) -> _Counters | None: ...
    @property
    def aliases(self) -> Mapping[str, str]: ...
    @property
    def stale_holders(self) -> Sequence[str]: ...


#: How a skipped group says it is opt-in (the patcher's reason, docs/core.md).
_OPT_IN = "opt-in:"


def render(
    records: Sequence[Record], warnings: Sequence[str], *, verbose: bool, statuses: Sequence[str]
) -> str:
    """The table; ``statuses``: every status value, in the order to count them in."""
    rows = [r for r in records if verbose or not _summarised(r)]
    lines: list[str] = []
    totals = Counter(r.status.value for r in records)
    counts = ", ".join(f"{totals[s]} {s}" for s in statuses if totals[s])
    hidden = len(records) - len(rows)
    if hidden:
        counts += (
            f" ({hidden} plugin record{'s' if hidden != 1 else ''} not listed:"
            " -v or table(verbose=True) lists them)"
        )
    lines.append(f"ascend-patch: {counts or 'nothing registered'}")
    if not verbose:
        # The caller's own records first, then the plugins' failures.
        rows.sort(key=lambda r: r.provenance.plugin is not None)
    lines.extend(_rows(rows, verbose=verbose))
    if hidden:
        lines.extend(_plugin_summary([r for r in records if _summarised(r)], statuses))
    lines.extend(f"  warning: {w}" for w in warnings)
    return "\n".join(line.rstrip() for line in lines)


def _summarised(record: Record) -> bool:
    """A record the short table counts in its plugin's line instead of listing it."""
    if record.status.value == "failed":
        return False
    return record.kind == "plugin" or record.provenance.plugin is not None


def _rows(rows: Sequence[Record], *, verbose: bool) -> list[str]:
    if not rows:
        return []
    lines = []
    width = min(max(len(r.target) for r in rows), 72)
    for r in rows:
        reason = f"  {r.reason}" if r.reason else ""
        if r.note:
            reason = f"  ({r.note}){reason}"
        origin = "" if r.provenance.plugin is None else f"  [{r.provenance.plugin}]"
        lines.append(f"  {r.status.value:<8} {r.kind:<6} {r.target:<{width}}{origin}{reason}")
        if verbose:
            lines.extend(f"           alias {path}: {state}" for path, state in r.aliases.items())
            if r.counters is not None:
                c = r.counters
                lines.append(
                    f"           calls: {c.replacement_calls} replacement,"
                    f" {c.fallback_calls} fallback"
                )
        if r.stale_holders:
            lines.append(f"           still holding the original: {', '.join(r.stale_holders)}")
    return lines


def _plugin_summary(records: Sequence[Record], statuses: Sequence[str]) -> list[str]:
    """One line per plugin: whether it loaded, and its other records by status."""
    by_plugin: dict[str, list[Record]] = {}
    for r in records:
        name = r.name if r.kind == "plugin" else r.provenance.plugin
        by_plugin.setdefault(name or "?", []).append(r)
    width = max(len(name) for name in by_plugin)
    lines = ["  plugins:"]
    for name, own in by_plugin.items():
        parts = []
        for r in own:
            if r.kind == "plugin":
                loaded = r.status.value == "applied"
                parts.append("loaded" if loaded else f"{r.status.value} ({r.reason})")
        counts = Counter(r.status.value for r in own if r.kind != "plugin")
        for status in statuses:
            if counts[status]:
                text = f"{counts[status]} {status}"
                opt_in = sum(
                    r.kind != "plugin"
                    and r.status.value == status
                    and (r.reason or "").startswith(_OPT_IN)
                    for r in own
                )
                if opt_in:
                    text += f" ({opt_in} opt-in)"
                parts.append(text)
        lines.append(f"    {name:<{width}}  {', '.join(parts) or 'nothing registered'}")
    return lines
