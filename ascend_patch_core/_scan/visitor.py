"""The finder of ``ascend-patch scan``: one module's source in, its findings out.

A walk over the parsed source: the code is never imported or run. Names are
resolved through the file's own imports, so ``import torch as t`` and ``from torch
import cuda`` are seen for what they are. The walk keeps its own stack instead of
recursing, so a valid file of any depth (``x = a + a + ... + a`` with thousands of
terms, long call chains) is scanned like any other (:mod:`.parse` parses it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any
from typing import NamedTuple

from .parse import parse
from .rules import DEVICE_FIRST_ARGUMENT
from .rules import DEVICE_KEYWORDS
from .rules import cuda_only
from .rules import is_cuda_string
from .rules import matches_module
from .values import DeviceValues
from .values import Uses
from .values import parameter_defaults


__all__ = ["Finding", "scan_source"]

_INDEX_KEYWORDS = ("device", "device_id")
_CPP_EXTENSION = "torch.utils.cpp_extension"
#: A dotted name longer than this is no API (and building it for a 10,000-link chain costs).
_MAX_NAME_PARTS = 32
_TRY_NODES = tuple(getattr(ast, name) for name in ("Try", "TryStar") if hasattr(ast, name))


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
    #: For a device value consumed elsewhere: one group of candidates per use; it is
    #: also covered when every use is (:mod:`.values`).
    uses: Uses = ()


class _Scanner:
    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.lines = source.splitlines()
        self.aliases: dict[str, str] = {}
        self.findings: list[Finding] = []
        self.parents: dict[int, ast.AST] = {}
        self._done: set[int] = set()
        self._resolved: dict[int, str | None] = {}
        #: (index in findings, value node, parameter name) of device values.
        self._values: list[tuple[int, ast.AST, str | None]] = []
        #: ``dev = "cuda"``: (the string, the name); a finding if the name is passed as a device.
        self._bound: list[tuple[ast.Constant, str]] = []

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
        """The dotted name an expression refers to, if it is an imported name or an attribute of one.

        Without recursion, and remembered per node: the walk asks for every link of a chain.
        """
        chain: list[ast.Attribute] = []
        while isinstance(node, ast.Attribute) and id(node) not in self._resolved:
            chain.append(node)
            node = node.value
        base: str | None
        if isinstance(node, ast.Attribute):
            base = self._resolved[id(node)]
        elif isinstance(node, ast.Name):
            base = self.aliases.get(node.id, "torch" if node.id == "torch" else None)
        else:
            base = None
        for link in reversed(chain):
            short = base is not None and base.count(".") < _MAX_NAME_PARTS
            base = f"{base}.{link.attr}" if short else None
            self._resolved[id(link)] = base
        return base

    def callee_candidates(self, call: ast.Call) -> tuple[str, ...]:
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
    ) -> int:
        line, col = (
            at if at is not None else (getattr(node, "lineno", 1), getattr(node, "col_offset", 0))
        )
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        if len(code) > 120:
            code = code[:117] + "..."
        self.findings.append(
            Finding(rule, self.path, line, col + 1, symbol, code, guarded, tuple(candidates))
        )
        return len(self.findings) - 1

    # -- the walk ----------------------------------------------------------------------

    def walk(self, tree: ast.AST) -> None:
        """Visit every node once, parents before children, in source order."""
        stack: list[tuple[ast.AST, bool]] = [(tree, False)]
        while stack:
            node, guarded = stack.pop()
            children: list[tuple[ast.AST, bool]]
            if isinstance(node, _TRY_NODES):
                # Imports in the body of a try that catches ImportError are optional.
                parts: Any = node
                catches = guarded or any(_catches_import_error(h.type) for h in parts.handlers)
                children = [(s, catches) for s in parts.body]
                rest = (*parts.handlers, *parts.orelse, *parts.finalbody)
                children += [(c, guarded) for c in rest]
            elif self._visit(node, guarded):
                children = [(c, guarded) for c in ast.iter_child_nodes(node)]
            else:
                continue
            for child, child_guarded in reversed(children):
                self.parents[id(child)] = node
                stack.append((child, child_guarded))

    def _visit(self, node: ast.AST, guarded: bool) -> bool:
        """Record what ``node`` is; whether to walk into its children."""
        if isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, ast.Attribute):
            return self._attribute(node)
        elif isinstance(node, ast.Name):
            self._name(node)
        elif isinstance(node, ast.Constant):
            if id(node) not in self._done and node.value == "nccl":
                self.add("nccl", node, '"nccl"', ("torch.distributed.init_process_group",))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self._import(node, alias.name, guarded)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                for alias in node.names:
                    name = node.module if alias.name == "*" else f"{node.module}.{alias.name}"
                    self._import(node, name, guarded)
        elif isinstance(node, ast.arguments):
            self._defaults(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            self._assignment(node)
        return True

    def _assignment(self, node: ast.Assign | ast.AnnAssign) -> None:
        """``dev = "cuda"`` (one plain name, a CUDA string): judged in finish()."""
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        if (
            len(targets) == 1
            and isinstance(targets[0], ast.Name)
            and isinstance(value, ast.Constant)
            and is_cuda_string(value.value)
        ):
            self._bound.append((value, targets[0].id))

    def _import(self, node: ast.AST, name: str, guarded: bool) -> None:
        if matches_module(name, "torch.cuda"):
            self.add("torch-cuda", node, name, (name,), guarded=guarded)
        elif cuda_only(name):
            self.add("cuda-import", node, name, (name,), guarded=guarded)

    def _attribute(self, node: ast.Attribute) -> bool:
        dotted = self.resolve(node)
        if dotted and matches_module(dotted, "torch.cuda"):
            self.add("torch-cuda", node, dotted, (dotted,))
            return False  # the outermost torch.cuda chain is the finding
        if node.attr == "NCCL" and (
            (dotted or "").endswith(".Backend.NCCL")
            or (isinstance(node.value, ast.Name) and node.value.id == "Backend")
        ):
            self.add(
                "nccl", node, dotted or "Backend.NCCL", ("torch.distributed.init_process_group",)
            )
            return False
        if dotted == "torch.distributed.is_nccl_available":
            self.add("nccl", node, dotted, (dotted,))
            return False
        return True

    def _name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            dotted = self.aliases.get(node.id)
            if dotted and matches_module(dotted, "torch.cuda"):
                self.add("torch-cuda", node, dotted, (dotted,))

    def _call(self, node: ast.Call) -> None:
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

    def _device_arguments(self, node: ast.Call, callee: str | None) -> None:
        label = self._callee_label(node)
        for keyword in node.keywords:
            value = keyword.value
            if not isinstance(value, ast.Constant):
                continue
            if callee == "torch.device" and keyword.arg == "type" and is_cuda_string(value.value):
                self._done.add(id(value))
                index = self.add("cuda-device", value, f"{label}(type={value.value!r})", (callee,))
                self._values.append((index, node, None))
                continue
            if keyword.arg not in DEVICE_KEYWORDS:
                continue
            if is_cuda_string(value.value) or (
                keyword.arg in _INDEX_KEYWORDS and _is_index(value.value)
            ):
                self._done.add(id(value))
                self.add(
                    "cuda-device",
                    value,
                    f"{label}({keyword.arg}={value.value!r})",
                    self.callee_candidates(node),
                )
        if not node.args or not isinstance(node.args[0], ast.Constant):
            return
        first = node.args[0]
        is_to = isinstance(node.func, ast.Attribute) and node.func.attr == "to" and callee is None
        if (is_to and (is_cuda_string(first.value) or _is_index(first.value))) or (
            callee in DEVICE_FIRST_ARGUMENT
            and (
                is_cuda_string(first.value) or (callee == "torch.device" and _is_index(first.value))
            )
        ):
            self._done.add(id(first))
            index = self.add(
                "cuda-device", first, f"{label}({first.value!r})", self.callee_candidates(node)
            )
            if callee == "torch.device":  # a device object, consumed wherever it goes
                self._values.append((index, node, None))

    def _defaults(self, node: ast.arguments) -> None:
        """``def f(x, device="cuda")``: a CUDA device every call that leaves it out uses."""
        function = self.parents.get(id(node))
        defined = getattr(function, "name", None)
        name = f"def {defined}" if defined else "lambda"
        for parameter, default in parameter_defaults(node):
            if isinstance(default, ast.Constant) and is_cuda_string(default.value):
                self._done.add(id(default))
                symbol = f"{name}({parameter}={default.value!r})"
                index = self.add("cuda-device", default, symbol, ())
                self._values.append((index, default, parameter))

    def _nccl_arguments(self, node: ast.Call) -> None:
        values = [*node.args, *(k.value for k in node.keywords)]
        for value in values:
            if (
                isinstance(value, ast.Constant)
                and value.value == "nccl"
                and id(value) not in self._done
            ):
                self._done.add(id(value))
                candidates = self.callee_candidates(node) or (
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

    def finish(self) -> list[Finding]:
        """The findings, device values with their uses, in source order."""
        values = DeviceValues(self.resolve, self.callee_candidates, self.parents)
        for index, node, parameter in self._values:
            finding = self.findings[index]
            self.findings[index] = finding._replace(uses=values.uses(node, parameter=parameter))
        for literal, name in self._bound:
            uses = values.bound_string(literal, name)
            if uses is not None:
                index = self.add("cuda-device", literal, f"{name} = {literal.value!r}", ())
                self.findings[index] = self.findings[index]._replace(uses=uses)
        return sorted(self.findings, key=lambda f: (f.line, f.column, f.rule))


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
    """Findings in one module's source.

    Raises what parsing raises: SyntaxError (also for a file too deep for Python's
    parser), ValueError, RecursionError or MemoryError when even a deep parse fails.
    """
    tree = parse(source, path)
    scanner = _Scanner(path, source)
    scanner.collect_aliases(tree)
    scanner.walk(tree)
    return scanner.finish()
