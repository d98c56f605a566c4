"""``ascend-patch scan``: find CUDA-only constructs in a codebase and what covers them.

Static analysis with :mod:`ast`: the scanned code is parsed, never imported or run.
Each finding names a rule, a place and a symbol, and lists the installed plugins'
patches, import rules and module hooks that cover it. Coverage is decided from
declarations alone (see docs/cli.md, "What covers a finding"): a finding is covered
when a patch targets one of its *candidate* targets (or an object containing or
contained in it), or an import rule serves its module.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple
from typing import TextIO

from ._declarations import Inventory
from ._output import Style
from ._output import table


__all__ = [
    "CUDA_ONLY_MODULES",
    "RULES",
    "SCHEMA",
    "CoverageIndex",
    "Finding",
    "render",
    "scan",
    "scan_source",
]

SCHEMA = "ascend-patch-scan/1"

#: Rule id -> what it finds.
RULES: dict[str, str] = {
    "cuda-call": "a .cuda() call",
    "torch-cuda": "the torch.cuda API (use or import)",
    "cuda-device": 'a CUDA device given as "cuda", "cuda:N" or an integer index',
    "nccl": "the NCCL backend",
    "cuda-import": "an import of a CUDA-only package",
    "cuda-extension": "a CUDA extension built or loaded with torch.utils.cpp_extension",
}

#: Packages that need CUDA to import or to work, with what they are.
CUDA_ONLY_MODULES: dict[str, str] = {
    "flash_attn": "FlashAttention CUDA kernels",
    "flash_attn_2_cuda": "FlashAttention CUDA extension",
    "xformers": "xFormers CUDA kernels",
    "apex": "NVIDIA Apex (fused optimizers, amp)",
    "torch_scatter": "PyG scatter CUDA extension",
    "torch_sparse": "PyG sparse CUDA extension",
    "torch_cluster": "PyG cluster CUDA extension",
    "spconv": "sparse convolution CUDA library",
    "mmcv.ops": "mmcv's compiled CUDA ops",
    "mmcv._ext": "mmcv's compiled extension",
    "cupy": "CuPy (CUDA arrays)",
    "pycuda": "PyCUDA",
    "bitsandbytes": "bitsandbytes CUDA kernels",
}

_DEVICE_KEYWORDS = ("device", "device_type", "map_location", "device_id")
_INDEX_KEYWORDS = ("device", "device_id")
_DEVICE_FIRST_ARG = (
    "torch.device",
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.GradScaler",
    "torch.set_default_device",
)
_CPP_EXTENSION = "torch.utils.cpp_extension"
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


def _is_cuda_string(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"cuda(:\d+)?", value) is not None


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _matches_module(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def _cuda_only(name: str) -> str | None:
    return next((m for m in CUDA_ONLY_MODULES if _matches_module(name, m)), None)


class Finding(NamedTuple):
    rule: str
    path: str
    line: int
    column: int
    symbol: str
    code: str
    #: An import inside ``try: ... except ImportError`` (the code runs without the package).
    guarded: bool
    #: Targets whose patching would cover this finding.
    candidates: tuple[str, ...]


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.lines = source.splitlines()
        self.aliases: dict[str, str] = {}
        self.findings: list[Finding] = []
        self._guarded = 0
        self._done: set[int] = set()

    # -- names -----------------------------------------------------------------------

    def collect_aliases(self, tree: ast.AST) -> None:
        """Import bindings anywhere in the file (a module-wide view: good enough for scanning)."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.partition(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to, if it is an imported name or an attribute of one."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, "torch" if node.id == "torch" else None)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _callee_candidates(self, call: ast.Call) -> tuple[str, ...]:
        callee = self.resolve(call.func)
        if callee:
            if callee.startswith("torch.distributed.") and ".distributed_c10d." not in callee:
                twin = "torch.distributed.distributed_c10d." + callee.rpartition(".")[2]
                return (callee, twin)
            return (callee,)
        if isinstance(call.func, ast.Attribute):  # a method of an object: a tensor or a module
            return (f"torch.Tensor.{call.func.attr}", f"torch.nn.Module.{call.func.attr}")
        return ()

    def _callee_label(self, call: ast.Call) -> str:
        callee = self.resolve(call.func)
        if callee:
            return callee
        if isinstance(call.func, ast.Attribute):
            return f".{call.func.attr}"
        if isinstance(call.func, ast.Name):
            return call.func.id
        return "(call)"

    # -- recording ---------------------------------------------------------------------

    def add(
        self,
        rule: str,
        node: ast.AST,
        symbol: str,
        candidates: Iterable[str],
        *,
        guarded: bool = False,
        at: tuple[int, int] | None = None,
    ) -> None:
        line, col = (
            at if at is not None else (getattr(node, "lineno", 1), getattr(node, "col_offset", 0))
        )
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        if len(code) > 120:
            code = code[:117] + "..."
        self.findings.append(
            Finding(rule, self.path, line, col + 1, symbol, code, guarded, tuple(candidates))
        )

    # -- visitors ----------------------------------------------------------------------

    def visit_Try(self, node: ast.Try) -> None:
        self._visit_try(node)

    def visit_TryStar(self, node: ast.AST) -> None:  # Python 3.11+
        self._visit_try(node)

    def _visit_try(self, node: Any) -> None:
        catches = any(_catches_import_error(h.type) for h in node.handlers)
        self._guarded += int(catches)
        for statement in node.body:
            self.visit(statement)
        self._guarded -= int(catches)
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(part)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._import(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for alias in node.names:
            self._import(node, node.module if alias.name == "*" else f"{node.module}.{alias.name}")

    def _import(self, node: ast.AST, name: str) -> None:
        if _matches_module(name, "torch.cuda"):
            self.add("torch-cuda", node, name, (name,), guarded=self._guarded > 0)
        elif _cuda_only(name):
            self.add("cuda-import", node, name, (name,), guarded=self._guarded > 0)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self.resolve(node)
        if dotted and _matches_module(dotted, "torch.cuda"):
            self.add("torch-cuda", node, dotted, (dotted,))
            return  # the outermost torch.cuda chain is the finding
        if node.attr == "NCCL" and (
            (dotted or "").endswith(".Backend.NCCL")
            or (isinstance(node.value, ast.Name) and node.value.id == "Backend")
        ):
            self.add(
                "nccl", node, dotted or "Backend.NCCL", ("torch.distributed.init_process_group",)
            )
            return
        if dotted == "torch.distributed.is_nccl_available":
            self.add("nccl", node, dotted, (dotted,))
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            dotted = self.aliases.get(node.id)
            if dotted and _matches_module(dotted, "torch.cuda"):
                self.add("torch-cuda", node, dotted, (dotted,))

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) not in self._done and node.value == "nccl":
            self.add("nccl", node, '"nccl"', ("torch.distributed.init_process_group",))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        callee = self.resolve(func)
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and callee is None:
            line = func.end_lineno or node.lineno
            col = (func.end_col_offset or 0) - len("cuda") - 1
            self.add(
                "cuda-call",
                node,
                ".cuda()",
                ("torch.Tensor.cuda", "torch.nn.Module.cuda"),
                at=(line, max(col, 0)),
            )
        self._device_arguments(node, callee)
        self._nccl_arguments(node)
        if callee and callee.startswith(_CPP_EXTENSION + "."):
            self._extension(node, callee)
        self.generic_visit(node)

    def _device_arguments(self, node: ast.Call, callee: str | None) -> None:
        label = self._callee_label(node)
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg not in _DEVICE_KEYWORDS or not isinstance(value, ast.Constant):
                continue
            if _is_cuda_string(value.value) or (
                keyword.arg in _INDEX_KEYWORDS and _is_index(value.value)
            ):
                self._done.add(id(value))
                self.add(
                    "cuda-device",
                    value,
                    f"{label}({keyword.arg}={value.value!r})",
                    self._callee_candidates(node),
                )
        if not node.args or not isinstance(node.args[0], ast.Constant):
            return
        first = node.args[0]
        is_to = isinstance(node.func, ast.Attribute) and node.func.attr == "to" and callee is None
        if (is_to and (_is_cuda_string(first.value) or _is_index(first.value))) or (
            callee in _DEVICE_FIRST_ARG
            and (
                _is_cuda_string(first.value)
                or (callee == "torch.device" and _is_index(first.value))
            )
        ):
            self._done.add(id(first))
            self.add(
                "cuda-device", first, f"{label}({first.value!r})", self._callee_candidates(node)
            )

    def _nccl_arguments(self, node: ast.Call) -> None:
        values = [*node.args, *(k.value for k in node.keywords)]
        for value in values:
            if (
                isinstance(value, ast.Constant)
                and value.value == "nccl"
                and id(value) not in self._done
            ):
                self._done.add(id(value))
                candidates = self._callee_candidates(node) or (
                    "torch.distributed.init_process_group",
                )
                self.add("nccl", value, f'{self._callee_label(node)}("nccl")', candidates)

    def _extension(self, node: ast.Call, callee: str) -> None:
        function = callee.rpartition(".")[2]
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        name_node = keywords.get("name") or (node.args[0] if node.args else None)
        name = (
            name_node.value
            if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)
            else None
        )
        if function == "CUDAExtension":
            cuda = True
        elif function in ("load", "load_inline"):
            with_cuda = keywords.get("with_cuda")
            if isinstance(with_cuda, ast.Constant) and with_cuda.value is False:
                return
            sources = keywords.get("sources") or (node.args[1] if len(node.args) > 1 else None)
            cuda = (
                (isinstance(with_cuda, ast.Constant) and with_cuda.value is True)
                or "cuda_sources" in keywords
                or "extra_cuda_cflags" in keywords
                or _has_cuda_source(sources)
            )
        else:
            return
        if cuda:
            symbol = f"{callee}({name!r})" if name else callee
            candidates = (callee, name) if name else (callee,)
            self.add("cuda-extension", node, symbol, candidates)


def _has_cuda_source(node: ast.AST | None) -> bool:
    if node is None:
        return False
    return any(
        isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value.endswith((".cu", ".cuh"))
        for n in ast.walk(node)
    )


def _catches_import_error(node: ast.AST | None) -> bool:
    if node is None:
        return True
    names = node.elts if isinstance(node, ast.Tuple) else [node]
    return any(
        isinstance(n, (ast.Name, ast.Attribute))
        and (n.id if isinstance(n, ast.Name) else n.attr)
        in ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")
        for n in names
    )


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """Findings in one module's source (raises SyntaxError if it does not parse)."""
    tree = ast.parse(source, filename=path)
    scanner = _Scanner(path, source)
    scanner.collect_aliases(tree)
    scanner.visit(tree)
    return sorted(scanner.findings, key=lambda f: (f.line, f.column, f.rule))


# ---------------------------------------------------------------------------- coverage


class CoverageIndex:
    """The installed plugins' declarations, indexed for finding what covers a target."""

    def __init__(self, inventory: Inventory | None) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.hooks: list[tuple[str, dict[str, Any]]] = []
        self.rules: list[tuple[str, str | None, dict[str, Any]]] = []
        if inventory is None:
            return
        for patch in inventory.patches():
            entry = {
                "plugin": patch.plugin,
                "kind": patch.kind,
                "name": patch.name,
                "applicable": patch.applicable,
            }
            if patch.kind == "hook":
                self.hooks.append((patch.target, {**entry, "target": patch.target}))
            elif patch.kind == "patch":
                for target in (patch.target, *patch.aliases):
                    self.patches.append((target, {**entry, "target": target}))
        for rule in inventory.rules():
            entry = {
                "plugin": rule.plugin,
                "kind": "rule",
                "name": rule.description,
                "target": rule.module,
            }
            self.rules.append(
                (rule.kind, rule.attribute, {**entry, "module": rule.module, "applicable": True})
            )

    def covering(
        self, candidates: Iterable[str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """What covers these candidate targets, and which module hooks might.

        A module hook's patches exist only once its module is imported, so a hook whose
        pattern matches a module that may contain the target is reported as a possibility,
        never counted as coverage.
        """
        found: dict[tuple[str, str, str], dict[str, Any]] = {}
        possible: dict[tuple[str, str], dict[str, Any]] = {}
        for candidate in candidates:
            for target, entry in self.patches:
                if _matches_module(candidate, target) or target.startswith(candidate + "."):
                    found.setdefault((entry["plugin"], entry["kind"], target), entry)
            for kind, attribute, entry in self.rules:
                module = entry["module"]
                hit = (
                    candidate == f"{module}.{attribute}"
                    if kind == "inject"
                    else _matches_module(candidate, module)
                )
                if hit:
                    found.setdefault((entry["plugin"], "rule", entry["name"]), entry)
            containers = _containers(candidate)
            for pattern, entry in self.hooks:
                if any(fnmatch.fnmatchcase(c, pattern) for c in containers):
                    possible.setdefault((entry["plugin"], pattern), entry)
        return [_public(e) for e in found.values()], [_public(e) for e in possible.values()]


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "module"}


def _containers(name: str) -> list[str]:
    """Modules that may define ``name``: its strict prefixes, the top-level package only for ``pkg.attr``."""
    parts = name.split(".")
    first = 1 if len(parts) == 2 else 2
    return [".".join(parts[:i]) for i in range(first, len(parts))]


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
        files_with += bool(found)
        for finding in found:
            covered_by, possibly = index.covering(finding.candidates)
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
                    "covered": bool(covered_by),
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


# ---------------------------------------------------------------------------- text


def render(
    result: dict[str, Any], *, verbose: bool = False, stream: TextIO | None = None, limit: int = 20
) -> str:
    style = Style(stream if stream is not None else sys.stdout)
    summary = result["summary"]
    lines = [
        style.paint("ascend-patch scan", "bold")
        + f"  {result['root']}  ({result['files_scanned']} Python files"
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
    if total == 0:
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
    return "\n".join(lines)
