"""The text report of ``ascend-patch scan``: counts per rule, the findings not covered, the migration gap."""

from __future__ import annotations

import sys
from typing import Any
from typing import TextIO

from .._model.output import Style
from .._model.output import table
from .rules import RULES


__all__ = ["render"]

#: How the reason of a file that was read but did not parse begins (docs/cli-reference.md).
_PARSE_FAILURES = ("SyntaxError", "ValueError", "RecursionError", "MemoryError")


def render(
    result: dict[str, Any], *, verbose: bool = False, stream: TextIO | None = None, limit: int = 20
) -> str:
    style = Style(stream if stream is not None else sys.stdout)
    summary = result["summary"]
    unread = len(result["parse_errors"])
    lines = [
        style.paint("ascend-patch scan", "bold")
        + f"  {result['root']}  ({result['files_scanned']} Python files scanned"
        + (f", {unread} not scanned" if unread else "")
        + (
            f", {len(result['cuda_source_files'])} CUDA sources"
            if result["cuda_source_files"]
            else ""
        )
        + ")",
        "",
    ]
    rows: list[list[Any]] = [
        [
            ("rule", ("bold",)),
            ("findings", ("bold",)),
            ("covered", ("bold",)),
            ("not covered", ("bold",)),
            ("", ()),
        ]
    ]
    for rule, counts in summary["by_rule"].items():
        if counts["findings"] or verbose:
            rows.append(
                [
                    rule,
                    str(counts["findings"]),
                    str(counts["covered"]),
                    str(counts["not_covered"]),
                    RULES[rule],
                ]
            )
    rows.append(
        [
            "total",
            str(summary["findings"]),
            str(summary["covered"]),
            str(summary["not_covered"]),
            "",
        ]
    )
    lines.extend(table(rows, style))

    shown = result["findings"] if verbose else [f for f in result["findings"] if not f["covered"]]
    if shown:
        lines += ["", style.paint("Findings" if verbose else "Not covered", "bold")]
        rows = []
        for f in shown[: None if verbose else limit]:
            where = f"{f['path']}:{f['line']}:{f['column']}"
            if f["covered"]:
                names = dict.fromkeys(f"{c['plugin']}:{c['name']}" for c in f["covered_by"])
                by = ", ".join(list(names)[:2]) + (", ..." if len(names) > 2 else "")
                state = style.level("covered", f"covered by {by}")
            elif f["possibly_covered_by"] and verbose:
                hooks = ", ".join(
                    f"{c['plugin']}:{c['name']}" for c in f["possibly_covered_by"][:2]
                )
                state = style.paint(f"not covered (module hook {hooks} may patch it)", "yellow")
            else:
                state = style.paint("not covered", "yellow")
            note = " (guarded import)" if f["guarded"] else ""
            rows.append([where, f["rule"], f["symbol"] + note, state])
        lines.extend(table(rows, style, max_width=60))
        if not verbose and len(shown) > limit:
            lines.append(
                f"  ... and {len(shown) - limit} more (-v lists every finding, --json all details)"
            )
    for error in result["parse_errors"]:
        where = f"{error['path']}:{error['line']}" if error["line"] else error["path"]
        lines.append(f"  {style.level('warning')}  {where}: not scanned: {error['error']}")

    total = summary["findings"]
    gap = summary["not_covered"]
    lines.append("")
    if unread and not result["files_scanned"]:
        unparsable = all(e["error"].startswith(_PARSE_FAILURES) for e in result["parse_errors"])
        why = "parses" if unparsable else "could be read and parsed"
        lines.append(
            style.level("error", f"Nothing was scanned: none of the {unread} Python files {why}.")
        )
    elif total == 0:
        lines.append(style.level("ok", "No CUDA-only constructs found."))
    else:
        share = round(100 * gap / total)
        lines.append(
            f"Migration gap: {gap} of {total} CUDA-only constructs in {result['files_with_findings']} files "
            f"are not covered by the installed plugins ({share}%)."
        )
        top = summary["not_covered_symbols"][:5]
        if top:
            lines.append(
                "Most frequent: " + ", ".join(f"{s['symbol']} ({s['count']})" for s in top)
            )
    if unread and result["files_scanned"]:
        found = unread + result["files_scanned"]
        lines.append(f"Not scanned: {unread} of {found} files (listed above).")
    return "\n".join(lines)
