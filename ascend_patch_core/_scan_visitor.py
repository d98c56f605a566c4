"""The finder of ``ascend-patch scan``: one module's source in, its findings out.

An :class:`ast.NodeVisitor` over the parsed source: the code is never imported or
run. Names are resolved through the file's own imports, so ``import torch as t``
and ``from torch import cuda`` are seen for what they are.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any
from typing import NamedTuple

from ._scan_rules import cuda_only
from ._scan_rules import matches_module


__all__ = ["Finding", "scan_source"]

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


def _is_cuda_string(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"cuda(:\d+)?", value) is not None


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        if matches_module(name, "torch.cuda"):
            self.add("torch-cuda", node, name, (name,), guarded=self._guarded > 0)
        elif cuda_only(name):
            self.add("cuda-import", node, name, (name,), guarded=self._guarded > 0)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self.resolve(node)
        if dotted and matches_module(dotted, "torch.cuda"):
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
            if dotted and matches_module(dotted, "torch.cuda"):
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
