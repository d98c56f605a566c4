"""``ascend-patch scan``: find CUDA-only constructs in a codebase and what covers them.

Static analysis with :mod:`ast`: the scanned code is parsed, never imported or run.
Each finding names a rule, a place and a symbol, and lists the installed plugins'
patches, import rules and module hooks that cover it. Coverage is decided from
declarations alone (see docs/cli-reference.md, "What covers a finding"): a finding is covered
when a patch targets one of its *candidate* targets (or an object containing or
contained in it), or an import rule serves its module.

This module assembles the ``ascend-patch-scan/1`` object; the files come from
:mod:`.files` (regular files only), the finder is :mod:`.visitor`, the
coverage index :mod:`.coverage`, the text report :mod:`.text`, the rule
tables :mod:`.rules`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from .._engine.declarations import Inventory
from .coverage import CoverageIndex
from .files import NotARegularFile
from .files import cuda_sources
from .files import python_files
from .files import read_source
from .files import relative
from .rules import CUDA_ONLY_MODULES
from .rules import RULES
from .text import render
from .visitor import Finding
from .visitor import scan_source


__all__ = [
    "CUDA_ONLY_MODULES",
    "RULES",
    "SCHEMA",
    "CoverageIndex",
    "Finding",
    "exit_status",
    "render",
    "scan",
    "scan_source",
]

SCHEMA = "ascend-patch-scan/1"


def scan(
    root: str,
    *,
    inventory: Inventory | None = None,
    exclude: Iterable[str] = (),
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    """Scan every ``.py`` file under ``root``; the ``ascend-patch-scan/1`` JSON object.

    ``files_scanned`` counts the files read and parsed; every other ``.py`` entry --
    a file that does not parse or cannot be read, a FIFO, a device -- is listed under
    ``parse_errors`` with the reason, and counted by ``files_not_scanned``.

    ``progress(done, total, where)`` is called before each file (``where``: its
    directory, relative to ``root``) and once at the end; the files are listed first
    so that the total is known (the walk costs little next to parsing them).
    """
    index = CoverageIndex(inventory)
    exclude = list(exclude)
    findings: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    files = 0
    files_with = 0
    paths = list(python_files(root, exclude))
    for done, path in enumerate(paths):
        rel = relative(path, root)
        if progress is not None:
            progress(done, len(paths), os.path.dirname(rel))
        try:
            found = scan_source(read_source(path), rel)
        except SyntaxError as exc:
            errors.append({"path": rel, "line": exc.lineno, "error": f"SyntaxError: {exc.msg}"})
            continue
        except NotARegularFile as exc:
            errors.append({"path": rel, "line": None, "error": str(exc)})
            continue
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            errors.append({"path": rel, "line": None, "error": f"{type(exc).__name__}: {exc}"})
            continue
        except (RecursionError, MemoryError) as exc:
            # Nested beyond what Python's parser can hold even with room to recurse:
            # CPython cannot compile the file either.
            reason = f"{type(exc).__name__}: too deeply nested for Python's parser"
            errors.append({"path": rel, "line": None, "error": reason})
            continue
        files += 1
        files_with += bool(found)
        for finding in found:
            is_covered, covered_by, possibly = index.judge(finding.candidates, finding.uses)
            findings.append(
                {
                    "rule": finding.rule,
                    "path": finding.path,
                    "line": finding.line,
                    "column": finding.column,
                    "symbol": finding.symbol,
                    "code": finding.code,
                    "guarded": finding.guarded,
                    "candidates": list(finding.candidates),
                    "uses": [list(group) for group in finding.uses],
                    "covered": is_covered,
                    "covered_by": covered_by,
                    "possibly_covered_by": possibly,
                }
            )
    if progress is not None:
        progress(len(paths), len(paths), "")
    findings.sort(key=lambda f: (f["path"], f["line"], f["column"], f["rule"]))
    by_rule = {
        rule: {
            "findings": sum(f["rule"] == rule for f in findings),
            "covered": sum(f["rule"] == rule and f["covered"] for f in findings),
        }
        for rule in RULES
    }
    for counts in by_rule.values():
        counts["not_covered"] = counts["findings"] - counts["covered"]
    gaps = Counter((f["rule"], _gap_symbol(f)) for f in findings if not f["covered"])
    covered = sum(f["covered"] for f in findings)
    plugins = []
    if inventory is not None:
        plugins = [
            {
                "name": p.name,
                "distribution": p.provenance.distribution,
                "version": p.provenance.version,
                "status": p.status,
            }
            for p in inventory.plugins
        ]
    return {
        "schema": SCHEMA,
        "root": os.path.abspath(root),
        "files_scanned": files,
        "files_not_scanned": len(errors),
        "files_with_findings": files_with,
        "parse_errors": errors,
        "cuda_source_files": cuda_sources(root, exclude),
        "plugins": plugins,
        "summary": {
            "findings": len(findings),
            "covered": covered,
            "not_covered": len(findings) - covered,
            "by_rule": by_rule,
            "not_covered_symbols": [
                {"rule": rule, "symbol": symbol, "count": count}
                for (rule, symbol), count in sorted(gaps.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
        },
        "findings": findings,
    }


def _gap_symbol(finding: dict[str, Any]) -> str:
    """What to group uncovered findings by: the API, not the literal arguments."""
    if finding["rule"] in ("cuda-device", "nccl", "cuda-extension"):
        return str(finding["symbol"]).partition("(")[0] or str(finding["symbol"])
    return str(finding["symbol"])


def exit_status(result: dict[str, Any], *, check: bool = False) -> int:
    """The exit status of ``ascend-patch scan`` for ``result`` (docs/cli-reference.md).

    1 when files were found but none could be scanned (the report would claim a clean
    codebase it never read); with ``check``, also when a finding is not covered or any
    file could not be scanned (a file not read cannot be vouched for; ``--exclude`` it).
    """
    errors = len(result["parse_errors"])
    if errors and not result["files_scanned"]:
        return 1
    if check and (result["summary"]["not_covered"] or errors):
        return 1
    return 0
