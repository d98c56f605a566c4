"""What the precision check found: per-patch results, their records, the report.

A patch's :class:`PrecisionRecord` (kind ``precision``) carries its :class:`PatchResult`
and states its verdict from it; :class:`PrecisionSummaryRecord` is the
``precision_check`` setting in the patcher's report. The JSON report (schema
``ascend-patch-precision/1``) and the end-of-run table are made here from the records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import Record
from ascend_patch_core import Status


if TYPE_CHECKING:
    from ._compare import Deviation
    from ._precision import PrecisionCheck
    from ._precision_options import PrecisionOptions
    from ._rerun import Outcome

__all__ = [
    "PatchResult",
    "PrecisionRecord",
    "PrecisionSummaryRecord",
    "render_table",
    "report",
    "verdict",
    "write_report",
]


class PatchResult:
    """What the checks of one patch found so far."""

    def __init__(self) -> None:
        self.calls = 0
        self.checked = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.grad_max_abs: float | None = None
        self.grad_max_rel: float | None = None
        self.dtypes: set[str] = set()
        self.tolerances: dict[str, tuple[float, float]] = {}
        self.exceeded: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, call: int, deviations: Iterable[Deviation], gradient: bool) -> None:
        for d in deviations:
            self.dtypes.add(d.dtype)
            self.tolerances[d.dtype] = (d.atol, d.rtol)
            if gradient:
                self.grad_max_abs = max(self.grad_max_abs or 0.0, d.max_abs)
                self.grad_max_rel = max(self.grad_max_rel or 0.0, d.max_rel)
            else:
                self.max_abs = max(self.max_abs, d.max_abs)
                self.max_rel = max(self.max_rel, d.max_rel)
            if d.exceeded and len(self.exceeded) < 10:
                self.exceeded.append({"call": call, **d.as_dict()})

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "checked": self.checked,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "grad_max_abs": self.grad_max_abs,
            "grad_max_rel": self.grad_max_rel,
            "dtypes": sorted(self.dtypes),
            "tolerances": {k: list(v) for k, v in sorted(self.tolerances.items())},
            "exceeded": list(self.exceeded),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        tol = "; ".join(
            f"{k}: atol {a:g}, rtol {r:g}" for k, (a, r) in sorted(self.tolerances.items())
        )
        text = f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"
        if self.grad_max_abs is not None:
            text += f"; gradients max abs {self.grad_max_abs:.3g}, max rel {self.grad_max_rel or 0.0:.3g}"
        return f"{text} ({tol or 'no tensor compared'})"


class PrecisionRecord(Record):
    """A record of kind ``precision``: one patch's replacement compared with its original."""

    __slots__ = ("result",)

    def __init__(self, patch_record: Record) -> None:
        super().__init__(
            "precision",
            patch_record.name,
            patch_record.target,
            Status.PENDING,
            "waiting for a call",
            patch_record.group,
            patch_record.provenance,
        )
        self.result = PatchResult()

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        data["precision"] = self.result.as_dict()
        return data

    def add_outcome(self, call: int, outcome: Outcome) -> bool:
        """Count one comparison; True when the patch cannot be compared any more."""
        if outcome.no_tensor:
            self.set(Status.SKIPPED, f"its result holds no tensor (seen at call {call})")
            return True
        if outcome.error is not None:
            self.set(Status.SKIPPED, f"cannot compare: {outcome.error}")
            return True
        found = self.result
        found.checked += 1
        found.add(call, outcome.deviations, gradient=False)
        found.add(call, outcome.gradient_deviations, gradient=True)
        for note in outcome.notes:
            found.note(note)
        self.conclude()
        return False

    def conclude(self) -> None:
        """The status the checks so far earn: FAILED from the first exceeded tolerance on."""
        result = self.result
        checked = f"{result.checked} call(s) checked"
        if result.exceeded:
            worst = result.exceeded[0]
            detail = worst["problem"] or (
                f"max abs {worst['max_abs']:.3g}, max rel {worst['max_rel']:.3g}"
            )
            self.set(
                Status.FAILED,
                f"EXCEEDS {worst['dtype']} tolerance (atol {worst['atol']:g}, rtol {worst['rtol']:g}) "
                f"at call {worst['call']}, {worst['where']}: {detail}; {checked}",
            )
            message = f"replacement deviates from the original: {self.reason}"
            if message not in self.warnings:
                self.warnings[:] = [message]
        else:
            self.set(Status.APPLIED, f"{checked}, within tolerance: {result.summary()}")


class PrecisionSummaryRecord(Record):
    """The ``precision_check`` setting: options and every patch's result (later ones included)."""

    __slots__ = ("check",)

    def __init__(self, check: PrecisionCheck) -> None:
        super().__init__("setting", "precision_check", "with_precision_check")
        self.check = check

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        data["precision"] = self.check.to_dict()
        return data


def verdict(options: PrecisionOptions, records: Sequence[PrecisionRecord]) -> tuple[Status, str]:
    """The summary record's status and reason: how many patches were checked, which failed."""
    failed = [r.name for r in records if r.status is Status.FAILED]
    checked = [r for r in records if r.result.checked]
    how = f"first {options.first} call(s)"
    if options.every:
        how += f" and every {options.every}th"
    text = f"{len(records)} patch(es) selected, {len(checked)} checked ({how} each)"
    if failed:
        text += f"; exceeding their tolerance: {', '.join(failed)}"
    return Status.FAILED if failed else Status.APPLIED, text


def report(options: PrecisionOptions, records: Sequence[PrecisionRecord]) -> dict[str, Any]:
    """The ``ascend-patch-precision/1`` JSON object."""
    as_dict = options._asdict()
    as_dict["thresholds"] = {k: list(v) for k, v in sorted(options.thresholds.items())}
    return {
        "schema": "ascend-patch-precision/1",
        "options": as_dict,
        "exceeded": [r.name for r in records if r.status is Status.FAILED],
        "patches": [r.as_dict() for r in records],
    }


def render_table(records: Iterable[PrecisionRecord]) -> str:
    """One line per checked patch, worst first."""
    order = {Status.FAILED: 0, Status.APPLIED: 1, Status.PENDING: 2, Status.SKIPPED: 3}
    lines = ["ascend-patch precision check:"]
    for r in sorted(records, key=lambda r: (order.get(r.status, 4), r.name)):
        label = "EXCEEDS" if r.status is Status.FAILED else r.status.value
        lines.append(f"  {label:<8} {r.target}  {r.reason or ''}".rstrip())
    return "\n".join(lines)


def write_report(path: str, data: dict[str, Any]) -> None:
    """Write the JSON report to ``path``, making its directory; OSError if that fails."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False)
