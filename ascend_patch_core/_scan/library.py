"""Where an installed library defines a name, read from its source: nothing is imported.

Code names an API the way its documentation spells it (``torch.cuda.amp.GradScaler``,
``torch.nn.Module.to``); plugins patch it where it is defined
(``torch.amp.grad_scaler.GradScaler.__init__``, ``torch.nn.modules.module.Module.to``).
For ``ascend-patch scan`` to judge a finding by the declarations the run applies, it
follows a name the way Python would find it -- through the library's re-exports
(``from .x import y``, ``y = x.y``, ``from m import *``) and, for a class, its base
classes -- by parsing the library's ``.py`` files, found on ``sys.path`` as the
import system would find them. A name that cannot be followed (a library that is not
installed, a compiled module, a module ``__getattr__``) is simply not expanded.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple


__all__ = ["Definition", "LibrarySource"]

# Deeper than any real chain of re-exports and base classes; a guard against cycles.
_MAX_DEPTH = 24
# Module look-ups per name: bounds the time one name can take, whatever the library does.
_MAX_LOOKUPS = 2_000


class Definition(NamedTuple):
    """A name under which the object, or what constructing it runs, is defined."""

    name: str
    #: "same" (the very object, named where it is defined), "constructor" (``__init__``
    #: or ``__new__`` of a base class, which constructing the class runs), "delegate"
    #: (what a function that only forwards calls), "calls" (a function or class of the
    #: class's own module that its methods call: ``DeformConv2d.forward`` calls
    #: ``deform_conv2d``, so patching that serves the class) or "base" (a base class:
    #: only a patch of that class itself, or of what contains it, counts -- not one of a
    #: method it lends to every subclass).
    role: str = "same"


class _Binding(NamedTuple):
    #: "def", "class", "ref" (a dotted name) or "expr" (a simple alias expression).
    kind: str
    value: Any


class _Module:
    def __init__(self, name: str, is_package: bool, locations: Sequence[str]) -> None:
        self.name = name
        self.is_package = is_package
        self.locations = list(locations)
        self.bindings: dict[str, list[_Binding]] = {}
        self.stars: list[str] = []
        #: ``__all__`` when the module spells it out as a list or tuple of strings.
        self.public: list[str] | None = None

    def bind(self, name: str, binding: _Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)

    def read(self, tree: ast.Module) -> None:
        """Module-level bindings, including those under ``if``/``try`` at module level."""
        package = self.name if self.is_package else self.name.rpartition(".")[0]
        pending: list[ast.stmt] = list(tree.body)
        while pending:
            node = pending.pop(0)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.bind(node.name, _Binding("def", _delegated(node)))
            elif isinstance(node, ast.ClassDef):
                self.bind(node.name, _Binding("class", node))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bind(alias.asname, _Binding("ref", alias.name))
                    else:
                        top = alias.name.partition(".")[0]
                        self.bind(top, _Binding("ref", top))
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node.module, node.level, package)
                for alias in node.names if source else ():
                    if alias.name == "*":
                        self.stars.append(source)
                    else:
                        self.bind(
                            alias.asname or alias.name, _Binding("ref", f"{source}.{alias.name}")
                        )
            elif isinstance(node, ast.Assign) and _declares_all(node):
                self.public = _strings(node.value)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                node.value, (ast.Name, ast.Attribute)
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.bind(target.id, _Binding("expr", node.value))
            elif isinstance(node, (ast.If, ast.Try, ast.With)) or type(node).__name__ == "TryStar":
                parts: Any = node
                for field in ("body", "orelse", "finalbody"):
                    pending.extend(getattr(parts, field, ()))
                for handler in getattr(parts, "handlers", ()):
                    pending.extend(handler.body)


def _absolute(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return ""
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


class LibrarySource:
    """The installed libraries' source, parsed on demand and remembered."""

    def __init__(self) -> None:
        self._modules: dict[str, _Module | None] = {}
        self._definitions: dict[str, tuple[Definition, ...]] = {}
        self._lookups: dict[tuple[str, tuple[str, ...]], list[Definition]] = {}
        self._budget = _MAX_LOOKUPS

    def definitions(self, name: str) -> tuple[Definition, ...]:
        """Where ``name`` is defined, if that is elsewhere: its definition and, for a
        class, its base classes' constructors (empty when it cannot be followed)."""
        found = self._definitions.get(name)
        if found is None:
            self._budget = _MAX_LOOKUPS
            try:
                found = tuple(
                    d
                    for d in dict.fromkeys(self._follow(name.split("."), 0, set()))
                    if d.name != name
                )
            except (RecursionError, MemoryError):
                found = ()
            self._definitions[name] = found
        return found

    def exports(self, name: str) -> tuple[str, ...]:
        """The public names of the module ``name`` is, as ``module.member`` (empty for
        anything else, or a module whose source cannot be read).

        Its ``__all__`` when spelt out; otherwise the public functions and classes it
        defines and the public names it imports from inside itself (``from .x import y``),
        not what it merely imports from elsewhere.
        """
        module = self._module(name)
        if module is None:
            found = (d.name for d in self.definitions(name) if d.role == "same")
            module = next(filter(None, (self._modules.get(n) for n in found)), None)
        if module is None:
            return ()
        if module.public is not None:
            members = module.public
        else:
            members = [
                member
                for member, bindings in module.bindings.items()
                if not member.startswith("_") and any(_own(module, b) for b in bindings)
            ]
        return tuple(f"{name}.{member}" for member in dict.fromkeys(members))

    # -- following names -------------------------------------------------------------

    def _follow(self, parts: list[str], depth: int, seen: set[tuple[str, str]]) -> list[Definition]:
        if not parts or self._module(parts[0]) is None:
            return []
        return self._within(parts[0], parts[1:], depth, seen)

    def _within(
        self, module: str, attrs: list[str], depth: int, seen: set[tuple[str, str]]
    ) -> list[Definition]:
        if not attrs:
            return [Definition(module)]
        info = self._module(module)
        if info is None or depth > _MAX_DEPTH or self._budget <= 0:
            return []
        self._budget -= 1
        # Remembered (star imports would otherwise retrace the same paths many times);
        # an empty answer stands in while a lookup is under way, which cuts cycles.
        memo = (module, tuple(attrs))
        if memo in self._lookups:
            return self._lookups[memo]
        self._lookups[memo] = []
        out = self._lookup(info, attrs, depth, seen)
        self._lookups[memo] = out
        return out

    def _lookup(
        self, info: _Module, attrs: list[str], depth: int, seen: set[tuple[str, str]]
    ) -> list[Definition]:
        module = info.name
        first, rest = attrs[0], attrs[1:]
        key = (module, first)
        # `from pkg import sub` inside pkg itself names the submodule: do not loop on it.
        bindings = info.bindings.get(first, []) if key not in seen else []
        seen = seen | {key}
        out: list[Definition] = []
        for binding in bindings:
            if binding.kind == "def":
                out.append(Definition(".".join([module, first, *rest])))
                for expression in binding.value if not rest else ():
                    # A deprecated spelling that only forwards, as torch.cuda.amp.custom_fwd
                    # forwards to torch.amp.custom_fwd: the patch of the callee covers it.
                    callee = self._expression(info, expression)
                    if callee:
                        found = self._follow(callee.split("."), depth + 1, seen)
                        out += [Definition(callee, "delegate")]
                        out += [
                            d if d.role == "base" else d._replace(role="delegate") for d in found
                        ]
            elif binding.kind == "class":
                out += self._in_class(f"{module}.{first}", binding.value, module, rest, depth, seen)
            else:
                target = (
                    binding.value
                    if binding.kind == "ref"
                    else self._expression(info, binding.value)
                )
                if target:
                    out += self._follow([*target.split("."), *rest], depth + 1, seen)
        if not out and info.is_package and self._module(f"{module}.{first}") is not None:
            out += self._within(f"{module}.{first}", rest, depth + 1, seen)
        if not out:
            for star in info.stars:
                if self._module(star) is not None:
                    out += self._within(star, attrs, depth + 1, seen)
        return out

    def _in_class(
        self,
        qualname: str,
        node: ast.ClassDef,
        module: str,
        rest: list[str],
        depth: int,
        seen: set[tuple[str, str]],
    ) -> list[Definition]:
        info = self._module(module)
        bases = [self._expression(info, b) for b in node.bases] if info is not None else []
        if rest:
            out = [Definition(".".join([qualname, *rest]))]
            if rest[0] not in _class_names(node):  # inherited: defined by a base class
                for base in filter(None, bases):
                    out += self._follow([*base.split("."), *rest], depth + 1, seen)
            return out
        # The class itself. Constructing it runs its bases' constructors too.
        out = [Definition(qualname)]
        if info is not None:
            out += [Definition(name, "calls") for name in _module_calls(info, node)]
        library = module.partition(".")[0]
        for base in filter(None, bases):
            for found in self._follow(base.split("."), depth + 1, seen):
                if found.role == "same":
                    out += [
                        Definition(f"{found.name}.__init__", "constructor"),
                        Definition(f"{found.name}.__new__", "constructor"),
                        Definition(found.name, "base"),
                    ]
                elif found.role != "calls" or found.name.partition(".")[0] == library:
                    # The base's own bases, and what a base of the same library calls
                    # (torch.nn.Module's use of Tensor says nothing of an mmcv layer).
                    out.append(found)
        return out

    def _expression(self, info: _Module | None, node: ast.expr) -> str | None:
        """The dotted name a ``Name``/``Attribute`` expression of ``info`` refers to."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or info is None:
            return None
        base: str | None = None
        for binding in info.bindings.get(node.id, []):
            if binding.kind == "ref":
                base = binding.value
            elif binding.kind in ("def", "class"):
                base = f"{info.name}.{node.id}"
            if base:
                break
        if base is None:
            return None
        return ".".join([base, *reversed(attrs)])

    # -- finding and reading modules -------------------------------------------------

    def _module(self, name: str) -> _Module | None:
        if name in self._modules:
            return self._modules[name]
        self._modules[name] = None  # while reading: a module importing itself is no loop
        module = self._load(name)
        self._modules[name] = module
        return module

    def _load(self, name: str) -> _Module | None:
        parent, _, _ = name.rpartition(".")
        try:
            if parent:
                outer = self._module(parent)
                if outer is None or not outer.is_package:
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, outer.locations)
            elif name in sys.modules and getattr(sys.modules[name], "__spec__", None):
                spec = sys.modules[name].__spec__
            else:
                # For a top-level name this asks the finders only; nothing is imported.
                spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        module = _Module(name, locations is not None, list(locations or ()))
        origin = spec.origin
        if origin and origin.endswith(".py"):
            tree = _parse_file(origin)
            if tree is not None:
                module.read(tree)
        return module


def _parse_file(path: str) -> ast.Module | None:
    import tokenize

    try:
        with tokenize.open(path) as fh:
            return ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return None


def _declares_all(node: ast.Assign) -> bool:
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _strings(node: ast.expr) -> list[str] | None:
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    names = [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return [n for n in names if isinstance(n, str)] if len(names) == len(node.elts) else None


def _own(module: _Module, binding: _Binding) -> bool:
    """Whether ``binding`` defines the name in ``module`` or brings it from inside it."""
    if binding.kind in ("def", "class"):
        return True
    return binding.kind == "ref" and str(binding.value).startswith(module.name + ".")


def _delegated(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[ast.expr, ...]:
    """The names a function that is a single ``return`` (after its docstring) refers to."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return ()
    nodes = list(ast.walk(body[0].value))
    inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
    return tuple(
        n for n in nodes if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in inner
    )


def _module_calls(module: _Module, node: ast.ClassDef) -> list[str]:
    """Dotted names of its own library's functions and classes that the class's body uses.

    What the module itself defines (``def``, ``class``, ``name = expression``), and the
    attributes it reaches through a sibling module of its package imported by name
    (``from . import sparse_ops as ops`` ... ``ops.get_indice_pairs(...)``): the
    class's work happens there. Not what it imports from elsewhere.
    """
    package = module.name.rpartition(".")[0]
    found: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id != node.name:
            if any(b.kind in ("def", "class", "expr") for b in module.bindings.get(n.id, ())):
                found.add(f"{module.name}.{n.id}")
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            for binding in module.bindings.get(n.value.id, ()):
                target = str(binding.value) if binding.kind == "ref" else ""
                # A sibling module of the same package (``from . import sparse_ops as
                # ops``), not the library's root or another package of it.
                if package and target.rpartition(".")[0] == package and target != module.name:
                    found.add(f"{target}.{n.attr}")
    return sorted(found)


def _class_names(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    return names
