"""``ascend-patch scan``: find CUDA-only constructs in a codebase and what covers them.

Static analysis with :mod:`ast`: the scanned code is parsed, never imported or run.
Each finding names a rule, a place and a symbol, and lists the installed plugins'
patches, import rules and module hooks that cover it. Coverage is decided from
declarations alone (see docs/cli.md, "What covers a finding"): a finding is covered
when a patch targets one of its *candidate* targets (or an object containing or
contained in it), or an import rule serves its module.

This module walks the tree and assembles the ``ascend-patch-scan/1`` object; the
finder is :mod:`._scan_visitor`, the coverage index :mod:`._scan_coverage`, the
text report :mod:`._scan_text`, the rule tables :mod:`._scan_rules`.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any

from ._declarations import Inventory
from ._scan_coverage import CoverageIndex
from ._scan_rules import CUDA_ONLY_MODULES
from ._scan_rules import RULES
from ._scan_text import render
from ._scan_visitor import Finding
from ._scan_visitor import scan_source


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

_SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "__pycache__",
    "node_modules",
    "site-packages",
    "build",
    "dist",
}


# ---------------------------------------------------------------------------- the tree


def _python_files(root: str, exclude: Iterable[str]) -> Iterator[str]:
    patterns = list(exclude)
    if os.path.isfile(root):
        yield root
        return
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(
            d
            for d in subdirs
            if d not in _SKIP_DIRS
            and not d.startswith(".venv")
            and not d.endswith(".egg-info")
            and not _excluded(os.path.join(directory, d), root, patterns)
        )
        for name in sorted(files):
            path = os.path.join(directory, name)
            if name.endswith(".py") and not _excluded(path, root, patterns):
                yield path


def _cuda_sources(root: str, exclude: Iterable[str]) -> list[str]:
    if os.path.isfile(root):
        return []
    patterns = list(exclude)
    out = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS and not d.startswith(".venv"))
        for name in sorted(files):
            path = os.path.join(directory, name)
            if name.endswith((".cu", ".cuh")) and not _excluded(path, root, patterns):
                out.append(_relative(path, root))
    return out


def _excluded(path: str, root: str, patterns: list[str]) -> bool:
    relative = _relative(path, root)
    return any(
        fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(os.path.basename(path), p) for p in patterns
    )


def _relative(path: str, root: str) -> str:
    base = root if os.path.isdir(root) else os.path.dirname(root)
    return os.path.relpath(path, base or ".").replace(os.sep, "/")


def scan(
    root: str,
    *,
    inventory: Inventory | None = None,
    exclude: Iterable[str] = (),
) -> dict[str, Any]:
    """Scan every ``.py`` file under ``root``; the ``ascend-patch-scan/1`` JSON object."""
    import tokenize

    index = CoverageIndex(inventory)
    exclude = list(exclude)
    findings: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    files = 0
    files_with = 0
    for path in _python_files(root, exclude):
        files += 1
        relative = _relative(path, root)
        try:
            with tokenize.open(path) as fh:
                source = fh.read()
            found = scan_source(source, relative)
        except SyntaxError as exc:
            errors.append(
                {"path": relative, "line": exc.lineno, "error": f"SyntaxError: {exc.msg}"}
            )
            continue
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            errors.append({"path": relative, "line": None, "error": f"{type(exc).__name__}: {exc}"})
            continue
        except (RecursionError, MemoryError) as exc:
            # Nested beyond what Python's parser can hold even with room to recurse:
            # CPython cannot compile the file either.
            reason = f"{type(exc).__name__}: too deeply nested for Python's parser"
            errors.append({"path": relative, "line": None, "error": reason})
            continue
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
        "files_with_findings": files_with,
        "parse_errors": errors,
        "cuda_source_files": _cuda_sources(root, exclude),
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
    """The exit status of ``ascend-patch scan`` for ``result`` (docs/cli.md).

    1 when files were found but none could be scanned (the report would claim a clean
    codebase it never read); with ``check``, also when a finding is not covered or any
    file could not be scanned (a file not read cannot be vouched for; ``--exclude`` it).
    """
    errors = len(result["parse_errors"])
    if errors and errors == result["files_scanned"]:
        return 1
    if check and (result["summary"]["not_covered"] or errors):
        return 1
    return 0
