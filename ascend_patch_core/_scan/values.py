"""Where a CUDA device *value* goes, for ``ascend-patch scan``.

``torch.device("cuda")`` and a parameter default ``device="cuda"`` are not consumed
where they are written: the run redirects such a value only where torch consumes it
(a factory's ``device=``, ``.to()``, ...). So the verdict on them comes from their
*uses*: the calls in the same function (or module) that pass the name they are bound
to, or the value itself, as a device to torch. Each use is a group of candidate
targets (any one covering patch redirects that use), and the value is covered when
every use is. A value passed to the project's own functions is not followed; one
with no use in sight (returned, stored on ``self``) is judged by the consumers such
values reach most: ``Tensor.to`` and ``Module.to`` (docs/cli-reference.md, "What covers a finding").

A name is followed within its scope only, and kept simple: a nested function that
binds the same name (a parameter, an assignment) has a name of its own and is left
out; ``torch.device(name)`` passes the value on to wherever that device goes. A
string bound to a name (``dev = "cuda"``) is a device value when the name is bound
once in its scope and passed there as a device (:meth:`DeviceValues.bound_string`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from .rules import DEVICE_FIRST_ARGUMENT
from .rules import DEVICE_KEYWORDS
from .rules import matches_module


__all__ = [
    "CONTEXT_USE",
    "DEVICE_METHODS",
    "GENERIC_USES",
    "DeviceValues",
    "Uses",
    "parameter_defaults",
]

#: One tuple of candidate targets per use; the value is covered when every use is.
Uses = tuple[tuple[str, ...], ...]

#: Methods of tensors and modules that take a device (first argument or ``device=``).
DEVICE_METHODS = frozenset(
    {
        "to",
        "cuda",
        "to_empty",
        "new_empty",
        "new_empty_strided",
        "new_full",
        "new_ones",
        "new_tensor",
        "new_zeros",
        "pin_memory",
    }
)
_FIRST_ARGUMENT_METHODS = frozenset({"to", "cuda"})

#: The uses of a value whose consumers are not in sight.
GENERIC_USES: Uses = (
    ("torch.Tensor.to",),
    ("torch.nn.Module.to", "torch.nn.modules.module.Module.to"),
)

#: ``with torch.device("cuda"):`` -- torch's device context, entered through
#: ``torch.device.__enter__``, which makes a ``torch.utils._device.DeviceContext``.
CONTEXT_USE = ("torch.device.__enter__", "torch.utils._device.DeviceContext.__init__")

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
#: How many ``torch.device(name)`` hops a value is followed through.
_MAX_HOPS = 4


class DeviceValues:
    """The uses of device values in one parsed module.

    ``resolve`` gives the dotted name an expression refers to (through the module's
    imports), ``candidates`` the targets whose patching covers a call, ``parents``
    maps ``id(node)`` to its parent node.
    """

    def __init__(
        self,
        resolve: Callable[[ast.AST], str | None],
        candidates: Callable[[ast.Call], tuple[str, ...]],
        parents: dict[int, ast.AST],
    ) -> None:
        self._resolve = resolve
        self._candidates = candidates
        self._parents = parents
        self._by_name: dict[tuple[int, str], list[tuple[str, ...]]] = {}

    def uses(self, value: ast.AST, *, parameter: str | None = None, hops: int = 0) -> Uses:
        """The uses of ``value``: a ``torch.device(...)`` call or a parameter default.

        ``parameter`` names the parameter a default belongs to.
        """
        found: list[tuple[str, ...]] | None = None
        parent = self._parents.get(id(value))
        if parameter is not None or isinstance(parent, ast.arguments):
            name = parameter or _parameter_of(value, parent)
            function = self._parents.get(id(parent)) if parent is not None else None
            if name is not None and function is not None:
                found = self._name_uses(function, name, hops)
        elif isinstance(parent, ast.withitem) and parent.context_expr is value:
            found = [CONTEXT_USE]
        elif isinstance(parent, ast.keyword) or (
            isinstance(parent, ast.Call) and any(a is value for a in parent.args)
        ):
            call = parent if isinstance(parent, ast.Call) else self._parents.get(id(parent))
            group = self._consumer(call) if isinstance(call, ast.Call) else None
            found = [group] if group else []
        else:
            name = _bound_name(value, parent)
            if name is not None:
                found = self._name_uses(self._scope_of(value), name, hops)
        return tuple(dict.fromkeys(found)) if found else GENERIC_USES

    def bound_string(self, literal: ast.Constant, name: str) -> Uses | None:
        """The uses of a device string bound to ``name`` (``dev = "cuda"``), or None when
        it is no device value: the name is bound more than once in its scope, or never
        passed there as a device (to torch or to any other call)."""
        scope = self._scope_of(literal)
        nodes = list(_visible(scope, name))
        bindings = sum(
            isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
            for n in nodes
        ) + (isinstance(scope, _FUNCTIONS) and name in _parameters(scope))
        calls = [n for n in nodes if isinstance(n, ast.Call)]
        if bindings != 1 or not any(self._passes(call, name) for call in calls):
            return None
        found = self._name_uses(scope, name, 0)
        return tuple(dict.fromkeys(found)) if found else GENERIC_USES

    # -- helpers ----------------------------------------------------------------------

    def _scope_of(self, node: ast.AST) -> ast.AST:
        current = self._parents.get(id(node))
        while current is not None and not isinstance(current, _SCOPES):
            current = self._parents.get(id(current))
        return current if current is not None else node

    def _name_uses(self, scope: ast.AST, name: str, hops: int) -> list[tuple[str, ...]]:
        """The consumer groups of the calls in ``scope`` that pass ``name`` as a device;
        through ``torch.device(name)``, the uses of that device."""
        key = (id(scope), name)
        cached = self._by_name.get(key)
        if cached is not None:
            return cached
        self._by_name[key] = []  # while under way: `d = torch.device(d)` is no loop
        uses: list[tuple[str, ...]] = []
        for call in (n for n in _visible(scope, name) if isinstance(n, ast.Call)):
            if name in _device_names(call):
                group = self._consumer(call)
                if group:
                    uses.append(group)
            elif self._first_argument(call, name):
                if self._resolve(call.func) != "torch.device":
                    uses.append(self._candidates(call))
                elif hops < _MAX_HOPS:
                    uses += self.uses(call, hops=hops + 1)
        self._by_name[key] = uses
        return uses

    def _passes(self, call: ast.Call, name: str) -> bool:
        """Whether ``call`` passes ``name`` in a device position."""
        return name in _device_names(call) or self._first_argument(call, name)

    def _first_argument(self, call: ast.Call, name: str) -> bool:
        """``torch.device(name)``, ``torch.autocast(name)``...: a device as first argument."""
        first = call.args[0] if call.args else None
        return (
            isinstance(first, ast.Name)
            and first.id == name
            and self._resolve(call.func) in DEVICE_FIRST_ARGUMENT
        )

    def _consumer(self, call: ast.Call) -> tuple[str, ...] | None:
        """The candidates of a call that consumes a device in torch; None for other code."""
        callee = self._resolve(call.func)
        if callee is not None:
            if callee == "torch.device" or not matches_module(callee, "torch"):
                return None  # torch.device() passes the value on; other code is not followed
            return self._candidates(call)
        if isinstance(call.func, ast.Attribute) and call.func.attr in DEVICE_METHODS:
            return self._candidates(call)
        return None


def _visible(scope: ast.AST, name: str) -> Iterator[ast.AST]:
    """The nodes of ``scope`` where ``name`` is the scope's own: nested functions that
    bind ``name`` themselves (a parameter, an assignment) are left out."""
    pending: list[ast.AST] = [scope]
    while pending:
        node = pending.pop()
        if node is not scope and isinstance(node, _FUNCTIONS) and _binds(node, name):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _parameters(function: ast.AST) -> set[str]:
    arguments: Any = getattr(function, "args", None)
    parameters = [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        *filter(None, (arguments.vararg, arguments.kwarg)),
    ]
    return {p.arg for p in parameters}


def _binds(function: ast.AST, name: str) -> bool:
    if name in _parameters(function):
        return True
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
        for n in ast.walk(function)
    )


def _device_names(call: ast.Call) -> Iterator[str]:
    """Names the call passes in a device position."""
    for keyword in call.keywords:
        if keyword.arg in DEVICE_KEYWORDS and isinstance(keyword.value, ast.Name):
            yield keyword.value.id
    # torch's functions take a device by keyword; .to() and .cuda() as their first argument.
    func = call.func
    if (
        call.args
        and isinstance(call.args[0], ast.Name)
        and isinstance(func, ast.Attribute)
        and func.attr in _FIRST_ARGUMENT_METHODS
    ):
        yield call.args[0].id


def parameter_defaults(arguments: ast.arguments) -> list[tuple[str, ast.expr]]:
    """(parameter name, default expression) of each parameter that has a default."""
    positional = [*arguments.posonlyargs, *arguments.args]
    with_default = positional[len(positional) - len(arguments.defaults) :]
    pairs = [(a.arg, d) for a, d in zip(with_default, arguments.defaults, strict=True)]
    keyword_only = zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    return pairs + [(a.arg, d) for a, d in keyword_only if d is not None]


def _parameter_of(default: ast.AST, arguments: ast.AST | None) -> str | None:
    if not isinstance(arguments, ast.arguments):
        return None
    return next((name for name, d in parameter_defaults(arguments) if d is default), None)


def _bound_name(value: ast.AST, parent: ast.AST | None) -> str | None:
    """The plain name ``value`` is assigned to (``device = torch.device("cuda")``), if any."""
    if isinstance(parent, ast.Assign) and parent.value is value and len(parent.targets) == 1:
        target = parent.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(parent, (ast.AnnAssign, ast.NamedExpr)) and parent.value is value:
        return parent.target.id if isinstance(parent.target, ast.Name) else None
    return None
