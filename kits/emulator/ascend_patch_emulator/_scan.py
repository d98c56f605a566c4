"""The static half of the contract check: find the torch_npu ops and mx_driving names a
package's sources use.

An ``ast`` scan, per file, for ``torch_npu.<op>(...)``, ``torch.ops.npu.<op>[.<overload>](...)``
(through any alias), names bound by ``from torch_npu import <op>`` or
``with_imports(("torch_npu", "<op> as name"))``, plain references to them,
``getattr(torch_npu, "<op>")`` and ``"torch_npu:<op>"`` replacement strings, plus the
``# contract: torch-npu<specifier>`` comments that limit the versions of a call.
Aliases are collected per module, not per scope: plugin modules bind them at the top
(or through ``with_imports``, which binds module globals).

mx_driving uses are found the same way (:class:`OpCall` rows with ``library
"mx_driving"``): attributes of the module however it is reached (``import
mx_driving [as m]``, ``importlib.import_module("mx_driving")``, or a call of an
accessor named ``mx_driving`` such as ``_kernel_source.mx_driving()``, directly or
through a name bound to its result), names bound by ``from mx_driving import X``,
``.apply``/``.forward`` of them, ``getattr(<module>, "X")`` and ``"mx_driving:X"``
replacement strings. Dunder attributes (``__file__``) are not API uses.
"""

from __future__ import annotations

import ast
import os
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

from ._schemas import available_versions
from ._schemas import load_schemas


__all__ = [
    "MX_DRIVING",
    "OpCall",
    "all_op_names",
    "contract_markers",
    "overload_name",
    "scan_sources",
    "versions_for",
]

#: The library name of mx_driving uses (:attr:`OpCall.library`).
MX_DRIVING = "mx_driving"
#: Attributes of an mx_driving autograd Function class that a call may go through.
_FUNCTION_ATTRIBUTES = frozenset({"apply", "forward", "backward"})
_MARKER = re.compile(r"#\s*contract:\s*torch[-_]npu\s*(?P<spec>[^#]*)", re.IGNORECASE)
#: Attributes of an op packet that are not overload names.
_PACKET_ATTRIBUTES = frozenset({"overloads", "op", "name", "default_overload"})


class OpCall(NamedTuple):
    """One use of a torch_npu op: a call site, or a bare reference to the op."""

    op: str
    #: ``None``: through the packet (any overload may bind); ``""``: the default overload.
    overload: str | None
    #: ``"<path>:<line>"``, the path relative to the scanned package's parent.
    site: str
    #: Positional arguments passed; ``None`` when unknown (``*args``).
    positional: int | None
    keywords: tuple[str, ...]
    #: ``**kwargs`` was passed: other keywords may arrive, required ones may be in it.
    more_keywords: bool = False
    #: ``False`` for a reference (``f = torch_npu.npu_x``): only existence is checked.
    called: bool = True
    #: A version specifier (``">=2.9"``) limiting the versions this call is checked
    #: against (a ``# contract: torch-npu...`` comment); ``""`` for all.
    versions: str = ""
    #: ``"torch_npu"``, or ``"mx_driving"`` for a use of mx_driving's Python API
    #: (``op`` is then the public name, with ``.apply``/``.forward`` when called so).
    library: str = "torch_npu"

    @property
    def target(self) -> str:
        """The op as written: ``npu_x``, ``npu_x.default``, ``npu_x.out``, ``mx_driving.f``."""
        if self.library == MX_DRIVING:
            return f"mx_driving.{self.op}"
        if self.overload is None:
            return self.op
        return f"{self.op}.{self.overload or 'default'}"


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; ``None`` for anything else."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    names.append(node.id)
    return names[::-1]


def _is_op_name(name: str) -> bool:
    """Whether ``torch_npu.<name>`` is an op (not a submodule or a Python helper).

    Every known op name counts, and so does any ``npu_*`` name, so a misspelt op
    (``npu_rms_nrom``) is reported rather than ignored.
    """
    return name in all_op_names() or name.startswith(("npu_", "_npu_"))


@cache
def all_op_names() -> frozenset[str]:
    """Every op name of every version with data."""
    return frozenset(op.name for v in available_versions() for op in load_schemas(v).values())


class _Aliases:
    """The names a module binds to torch, torch_npu, ``torch.ops.npu`` and to single ops."""

    def __init__(self) -> None:
        self.torch: set[str] = set()
        self.torch_npu: set[str] = set()
        self.namespace: set[str] = set()
        self.ops: dict[str, tuple[str, str | None]] = {}
        #: Names bound to the mx_driving module, and to its public names.
        self.mx_module: set[str] = set()
        self.mx_names: dict[str, str] = {}

    def _size(self) -> tuple[int, ...]:
        return (
            len(self.torch),
            len(self.torch_npu),
            len(self.namespace),
            len(self.ops),
            len(self.mx_module),
            len(self.mx_names),
        )

    def collect(self, tree: ast.AST) -> None:
        # Assignments may refer to each other in any order: repeat until nothing new.
        while True:
            before = self._size()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name == "torch":
                            self.torch.add(alias.asname or "torch")
                        elif alias.name == "torch_npu":
                            self.torch_npu.add(alias.asname or "torch_npu")
                        elif alias.name.startswith("torch.") and not alias.asname:
                            self.torch.add("torch")  # `import torch.nn` binds `torch`
                        elif alias.name.startswith("torch_npu.") and not alias.asname:
                            self.torch_npu.add("torch_npu")
                        elif alias.name == MX_DRIVING or (
                            alias.name.startswith("mx_driving.") and not alias.asname
                        ):
                            self.mx_module.add(alias.asname or MX_DRIVING)
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    self._from_import(node)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name):
                        self._assign(target.id, node.value)
                elif isinstance(node, ast.Call) and _chain(node.func) in (
                    ["with_imports"],
                    ["ascend_patch_core", "with_imports"],
                ):
                    self._with_imports(node)
            if before == self._size():
                return

    def _from_import(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            bound = alias.asname or alias.name
            if node.module == "torch_npu" and _is_op_name(alias.name):
                self.ops[bound] = (alias.name, None)
            elif node.module == MX_DRIVING and alias.name != "*":
                self.mx_names[bound] = alias.name
            elif node.module == "torch.ops" and alias.name == "npu":
                self.namespace.add(bound)

    def _assign(self, name: str, value: ast.expr) -> None:
        mx = self.resolve_mx(value)
        if mx == "":
            self.mx_module.add(name)
            return
        if mx is not None:
            self.mx_names[name] = mx
            return
        resolved = self.resolve(value)
        if resolved is not None:
            self.ops[name] = resolved
        elif _chain(value) in [[t, "ops", "npu"] for t in self.torch]:
            self.namespace.add(name)
        elif isinstance(value, ast.Name) and value.id in self.torch_npu:
            self.torch_npu.add(name)

    def _with_imports(self, node: ast.Call) -> None:
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                module, _, alias = arg.value.partition(" as ")
                if module.strip() == "torch_npu":
                    self.torch_npu.add(alias.strip() or "torch_npu")
                elif module.strip() == "torch":
                    self.torch.add(alias.strip() or "torch")
            elif isinstance(arg, (ast.Tuple, ast.List)) and arg.elts:
                items = [e.value for e in arg.elts if isinstance(e, ast.Constant)]
                if len(items) != len(arg.elts) or not all(isinstance(i, str) for i in items):
                    continue
                if str(items[0]).strip() != "torch_npu":
                    continue
                for item in items[1:]:
                    name, _, alias = str(item).partition(" as ")
                    if _is_op_name(name.strip()):
                        self.ops[alias.strip() or name.strip()] = (name.strip(), None)

    def resolve(self, node: ast.expr) -> tuple[str, str | None] | None:
        """(op, overload or None) that ``node`` names, if it names a torch_npu op."""
        chain = _chain(node)
        if chain is None:
            return None
        head, rest = chain[0], chain[1:]
        if head in self.ops:
            op, overload = self.ops[head]
            if not rest:
                return op, overload
            return (op, overload_name(rest[0])) if overload is None and len(rest) == 1 else None
        if head in self.torch and rest[:2] == ["ops", "npu"]:
            rest = rest[2:]
        elif not (
            head in self.namespace or (head in self.torch_npu and rest and _is_op_name(rest[0]))
        ):
            return None
        if len(rest) == 1:
            return rest[0], None
        if len(rest) == 2 and rest[1] not in _PACKET_ATTRIBUTES and not rest[1].startswith("_"):
            return rest[0], overload_name(rest[1])
        return None

    def is_mx_module(self, node: ast.expr) -> bool:
        """Whether ``node`` evaluates to the mx_driving module itself."""
        if isinstance(node, ast.Name):
            return node.id in self.mx_module
        if not isinstance(node, ast.Call):
            return False
        callee = _chain(node.func)
        if callee is None:
            return False
        if not node.args and not node.keywords and callee[-1] == MX_DRIVING:
            return True  # an accessor returning the module: _kernel_source.mx_driving()
        return (
            callee[-1] == "import_module"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == MX_DRIVING
        )

    def resolve_mx(self, node: ast.expr) -> str | None:
        """The mx_driving use ``node`` names: ``""`` for the module itself, ``"f"``,
        ``"F.apply"``; None when it is not one (or only a dunder of the module)."""
        if self.is_mx_module(node):
            return ""
        attributes: list[str] = []
        while isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
            if self.is_mx_module(node):
                break
        else:
            if not (isinstance(node, ast.Name) and node.id in self.mx_names):
                return None
            attributes.append(self.mx_names[node.id])
        attributes.reverse()
        name = attributes[0]
        if name.startswith("__"):
            return None
        if len(attributes) > 1 and attributes[1] in _FUNCTION_ATTRIBUTES:
            return f"{name}.{attributes[1]}"
        return name

    def is_module(self, node: ast.expr) -> bool:
        """Whether ``node`` is torch_npu or ``torch.ops.npu`` (for ``getattr``)."""
        chain = _chain(node)
        return chain is not None and (
            (len(chain) == 1 and (chain[0] in self.torch_npu or chain[0] in self.namespace))
            or (len(chain) == 3 and chain[0] in self.torch and chain[1:] == ["ops", "npu"])
        )


def overload_name(name: str) -> str:
    """``""`` for the default overload, else ``name``."""
    return "" if name == "default" else name


_STRING_REFERENCE = re.compile(r"^torch_npu[.:](?P<op>\w+)$")
_MX_STRING_REFERENCE = re.compile(r"^mx_driving:(?P<name>(?!__)\w+)$")
_GUARDED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.With, ast.Try, ast.For, ast.While)


def contract_markers(source: str, tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, specifier) of every ``# contract: torch-npu...`` comment."""
    lines = source.splitlines()
    found = {
        number: m.group("spec").strip()
        for number, text in enumerate(lines, start=1)
        if (m := _MARKER.search(text))
    }
    if not found:
        return []
    ranges = [(line, line, spec) for line, spec in found.items()]
    for node in ast.walk(tree):
        if isinstance(node, _GUARDED) and node.lineno in found:
            ranges.append((node.lineno, node.end_lineno or node.lineno, found[node.lineno]))
    return ranges


def versions_for(first: int, last: int, ranges: list[tuple[int, int, str]]) -> str:
    """The specifiers of the markers covering lines ``first..last``, joined."""
    specs = {
        spec
        for low, high, spec in ranges
        if (low == high and first <= low <= last) or (low != high and low <= first <= high)
    }
    return ",".join(sorted(specs))


def _scan_file(path: Path, label: str) -> list[OpCall]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    aliases = _Aliases()
    aliases.collect(tree)
    ranges = contract_markers(source, tree)
    handled: set[int] = set()
    calls: list[OpCall] = []

    def add(node: ast.expr, op: str, overload: str | None, call: ast.Call | None) -> None:
        versions = versions_for(node.lineno, node.end_lineno or node.lineno, ranges)
        site = f"{label}:{node.lineno}"
        if call is None:
            calls.append(OpCall(op, overload, site, None, (), called=False, versions=versions))
            return
        starred = any(isinstance(a, ast.Starred) for a in call.args)
        calls.append(
            OpCall(
                op,
                overload,
                site,
                None if starred else len(call.args),
                tuple(k.arg for k in call.keywords if k.arg is not None),
                any(k.arg is None for k in call.keywords),
                True,
                versions,
            )
        )

    def mark(node: ast.expr) -> None:
        while isinstance(node, ast.Attribute):
            handled.add(id(node))
            node = node.value
        handled.add(id(node))

    def add_mx(node: ast.AST, name: str, call: ast.Call | None) -> None:
        site = f"{label}:{getattr(node, 'lineno', 0)}"
        if call is None:
            calls.append(OpCall(name, None, site, None, (), called=False, library=MX_DRIVING))
            return
        starred = any(isinstance(a, ast.Starred) for a in call.args)
        keywords = tuple(k.arg for k in call.keywords if k.arg is not None)
        more = any(k.arg is None for k in call.keywords)
        positional = None if starred else len(call.args)
        calls.append(OpCall(name, None, site, positional, keywords, more, True, "", MX_DRIVING))

    # ast.walk is breadth first: a call is seen before its callee, an outer
    # attribute before the inner ones, so each use is recorded once.
    for node in ast.walk(tree):
        if id(node) in handled:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == MX_DRIVING:
            for alias in node.names:
                if alias.name != "*" and not alias.name.startswith("__"):
                    add_mx(node, alias.name, None)
            continue
        mx = aliases.resolve_mx(node.func) if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Call) and mx:
            mark(node.func)
            add_mx(node, mx, node)
            continue
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            mx = aliases.resolve_mx(node)
            if mx:
                mark(node)
                add_mx(node, mx, None)
                continue
        if isinstance(node, ast.Call):
            if (
                # getattr(mx, "f") must find f; with a default it is a feature test.
                _chain(node.func) == ["getattr"]
                and len(node.args) == 2
                and aliases.is_mx_module(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and not node.args[1].value.startswith("__")
            ):
                add_mx(node, node.args[1].value, None)
                continue
            resolved = aliases.resolve(node.func)
            if resolved is not None:
                mark(node.func)
                add(node, *resolved, node)
            elif (
                _chain(node.func) == ["getattr"]
                and len(node.args) >= 2
                and aliases.is_module(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                # getattr(torch_npu, "npu_x"): the op must exist (hasattr is a feature test).
                add(node, node.args[1].value, None, None)
        elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
            resolved = aliases.resolve(node)
            if resolved is not None:
                mark(node)
                add(node, *resolved, None)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _STRING_REFERENCE.match(node.value)
            if match and _is_op_name(match.group("op")):
                add(node, match.group("op"), None, None)
            elif match := _MX_STRING_REFERENCE.match(node.value):
                add_mx(node, match.group("name"), None)
    return sorted(calls, key=lambda c: (int(c.site.rpartition(":")[2]), c.op))


def scan_sources(root: str | os.PathLike[str]) -> list[OpCall]:
    """Every torch_npu op use in ``root`` (a ``.py`` file, or a folder scanned recursively).

    Sites are ``<path>:<line>`` with the path relative to ``root``'s parent, so a
    package folder ``.../ascend_patch_foo`` gives ``ascend_patch_foo/norm.py:12``.
    """
    root = Path(root)
    if root.is_file():
        return _scan_file(root, root.name)
    if not root.is_dir():
        raise FileNotFoundError(f"no plugin sources at {root}")
    calls: list[OpCall] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        calls.extend(_scan_file(path, relative.as_posix()))
    return calls
