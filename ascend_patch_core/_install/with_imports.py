"""``with_imports``: names a replacement needs, imported on its first call.

A plugin module must import without torch_npu (or mmcv, or transformers) present, yet
its replacements call them. ``@with_imports("torch_npu")`` defers that import to the
replacement's first call and then binds the name in the function's *own module
globals* -- not in a copy, so ``global`` statements keep working (a defect of the
DrivingSDK patcher's snapshot copy).

Spec forms::

    "torch_npu"                       # import torch_npu            -> name torch_npu
    "torch.nn.functional"             # bind the module             -> name functional
    "torch.nn.functional as F"        #                             -> name F
    ("torch_npu", "npu_rms_norm")     # from torch_npu import npu_rms_norm
    ("torch_npu", "npu_rms_norm as rms_norm", "npu_swiglu")
    "@torch.no_grad()"                # a decorator, applied at the first call

As in the DrivingSDK patcher, an import that fails warns and the function runs: the
name is bound to a placeholder that retries the import when used and raises
``ImportError`` (naming the function and the spec) if it still fails -- a name the
call never touches costs nothing. ``apply_decorators=[("pkg.deco", {"k": v}), ...]``
is the DrivingSDK patcher's older decorator form.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeAlias
from typing import TypeVar
from typing import Union

from .._model.errors import PatchDefinitionError
from .._model.work_locks import work_lock


__all__ = ["LazyImports", "with_imports"]

F = TypeVar("F")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_NAME}(?:\.{_NAME})*"
_AS = rf"^\s*({_DOTTED})(?:\s+as\s+({_NAME}))?\s*$"


def _parse(spec: str | Sequence[str]) -> list[tuple[str, str | None, str]]:
    """Return (module, attribute or None, bound name) triples for one spec."""
    if isinstance(spec, str):
        m = re.match(_AS, spec)
        if not m:
            raise PatchDefinitionError(
                f"with_imports: invalid spec {spec!r}; write 'pkg.mod' or 'pkg.mod as name'"
            )
        path, alias = m.group(1), m.group(2)
        return [(path, None, alias or path.rpartition(".")[2])]
    if isinstance(spec, (tuple, list)) and len(spec) >= 2 and all(isinstance(s, str) for s in spec):
        module = spec[0]
        if not re.fullmatch(_DOTTED, module):
            raise PatchDefinitionError(f"with_imports: invalid module {module!r} in {spec!r}")
        out: list[tuple[str, str | None, str]] = []
        for item in spec[1:]:
            m = re.match(_AS, item)
            if not m or "." in m.group(1):
                raise PatchDefinitionError(
                    f"with_imports: invalid name {item!r} in {spec!r}; write 'name' or 'name as alias'"
                )
            out.append((module, m.group(1), m.group(2) or m.group(1)))
        return out
    raise PatchDefinitionError(
        f"with_imports: invalid spec {spec!r}; expected 'pkg.mod', 'pkg.mod as name' or ('pkg.mod', 'name', ...)"
    )


#: A decorator to apply at the first call: ``"@expr"`` text or ``(dotted name, kwargs)``.
Decorator: TypeAlias = Union[str, tuple[str, dict[str, Any]]]  # noqa: UP007 (runtime alias on 3.10)


class _NotImported:
    """Bound in place of a name whose import failed: retries on use, else raises ImportError."""

    def __init__(self, load: Callable[[], Any], namespace: dict[str, Any], bound: str) -> None:
        self._load, self._namespace, self._bound = load, namespace, bound

    def _value(self) -> Any:
        value = self._load()  # raises ImportError naming the function and the spec
        if self._namespace.get(self._bound) is self:
            self._namespace[self._bound] = value
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self._value(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._value()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<not imported: {self._bound}>"


class LazyImports:
    """The deferred imports of one function; resolved once, on its first call."""

    def __init__(
        self,
        func: Callable[..., Any],
        specs: list[tuple[str, str | None, str]],
        decorators: Sequence[Decorator] = (),
    ) -> None:
        self.func = func
        self.specs = specs
        self.decorators = tuple(decorators)
        #: What a call runs: ``func`` with its decorators, once resolved.
        self.call: Callable[..., Any] = func
        self.resolved = False
        #: The function that stands in for ``func`` until the first call.
        self.trampoline: Callable[..., Any] | None = None
        # Re-entrant, and known to _fork: a fork() child makes it new (unless the
        # forking thread holds it), since the thread resolving may not be there.
        self._lock = work_lock()
        #: Called once after resolution, so a patcher can install ``func`` directly
        #: in place of the trampoline (no extra frame from then on).
        self.on_resolved: list[Callable[[], None]] = []

    def resolve(self) -> None:
        with self._lock:
            if self.resolved:
                return
            namespace = self.func.__globals__
            values: dict[str, Any] = {}
            for module, attribute, bound in self.specs:
                load = functools.partial(_load, module, attribute, self.func)
                try:
                    values[bound] = load()
                except ImportError as exc:
                    warnings.warn(f"{exc}; the function runs without it", stacklevel=4)
                    values[bound] = _NotImported(load, namespace, bound)
            namespace.update(values)
            call = self.func
            for decorator in reversed(self.decorators):  # the first written is outermost
                call = _decorate(call, decorator, namespace, self.func)
            self.call = call
            self.resolved = True
            listeners, self.on_resolved = self.on_resolved, []
        for listener in listeners:
            listener()


def _load(module: str, attribute: str | None, func: Callable[..., Any]) -> Any:
    where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
    try:
        if attribute is None:
            try:
                return importlib.import_module(module)
            except ModuleNotFoundError as exc:
                # "pkg.attr": not a module, maybe an attribute of pkg.
                parent, _, name = module.rpartition(".")
                if not parent or exc.name != module:
                    raise
                return getattr(importlib.import_module(parent), name)
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        what = module if attribute is None else f"{attribute} from {module}"
        raise ImportError(f"with_imports on {where}: cannot import {what}: {exc}") from exc


def _decorate(
    call: Callable[..., Any], decorator: Decorator, namespace: dict[str, Any], func: Any
) -> Callable[..., Any]:
    where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
    try:
        if isinstance(decorator, str):  # "@expr", evaluated where the function lives
            return eval(decorator, namespace)(call)  # type: ignore[no-any-return]
        dotted, kwargs = decorator
        module, _, name = dotted.rpartition(".")
        made = getattr(importlib.import_module(module), name)
        return made(**kwargs)(call) if kwargs else made(call)  # type: ignore[no-any-return]
    except ImportError:
        raise
    except Exception as exc:
        raise PatchDefinitionError(
            f"with_imports on {where}: decorator {decorator!r} failed: {exc!r}"
        ) from exc


def _legacy_decorators(apply_decorators: Any) -> list[Decorator]:
    out: list[Decorator] = []
    for item in apply_decorators or ():
        dotted, kwargs = (item, {}) if isinstance(item, str) else item
        if not isinstance(dotted, str) or not re.fullmatch(_DOTTED, dotted) or "." not in dotted:
            raise PatchDefinitionError(f"with_imports: invalid decorator {item!r}")
        out.append((dotted, dict(kwargs or {})))
    return out


def with_imports(
    *specs: str | Sequence[str], apply_decorators: Sequence[Any] | None = None
) -> Callable[[F], F]:
    """Decorate a replacement so ``specs`` are imported into its module on first call.

    Works on plain functions and on staticmethod/classmethod objects (in either
    decorator order). A failed import warns and binds a placeholder that raises
    ``ImportError`` (naming the function and the spec) when used. ``"@expr"`` specs and
    ``apply_decorators`` are decorators applied at the first call, after the imports.
    """
    decorators: list[Decorator] = [
        spec[1:] for spec in specs if isinstance(spec, str) and spec.startswith("@")
    ]
    decorators += _legacy_decorators(apply_decorators)
    parsed = [
        triple
        for spec in specs
        if not (isinstance(spec, str) and spec.startswith("@"))
        for triple in _parse(spec)
    ]
    if not parsed and not decorators:
        raise PatchDefinitionError("with_imports: give at least one module or name to import")

    def decorate(obj: F) -> F:
        descriptor: type | None = None
        func: Any = obj
        if isinstance(obj, (staticmethod, classmethod)):
            descriptor, func = type(obj), obj.__func__
        inner = lazy_imports_of(func)
        if inner is not None:  # stacked: one trampoline with both lists
            func = inner.func
        if not callable(func) or not hasattr(func, "__globals__"):
            raise PatchDefinitionError(f"with_imports: {obj!r} is not a Python function")
        state = (
            LazyImports(func, [*inner.specs, *parsed], [*decorators, *inner.decorators])
            if inner is not None
            else LazyImports(func, parsed, decorators)
        )

        @functools.wraps(func)
        def with_imports_trampoline(*args: Any, **kwargs: Any) -> Any:
            if not state.resolved:
                state.resolve()
            return state.call(*args, **kwargs)

        with_imports_trampoline.__ascend_patch_with_imports__ = state  # type: ignore[attr-defined]
        state.trampoline = with_imports_trampoline
        result: Any = with_imports_trampoline
        if descriptor is not None:
            result = descriptor(result)
        return result  # type: ignore[no-any-return]

    return decorate


def lazy_imports_of(obj: object) -> LazyImports | None:
    """The :class:`LazyImports` behind a ``with_imports`` trampoline, if ``obj`` is one."""
    state = getattr(obj, "__ascend_patch_with_imports__", None)
    # functools.wraps copies the marker onto wrappers around the trampoline; only the
    # trampoline itself may be swapped for the function.
    if isinstance(state, LazyImports) and state.trampoline is obj:
        return state
    return None


def install_when_resolved(site: Any, lock: Any) -> None:
    """After the first call of the with_imports trampoline installed at ``site``, install its function.

    From then on calls skip the trampoline's extra frame. Under ``lock`` (the
    patcher's), and only if the slot still holds the trampoline: a revert or another
    patch in between wins.
    """
    from .stale import module_ids
    from .target import adapt_to_descriptor
    from .target import inner_callable

    inner = inner_callable(site.installed)
    state = lazy_imports_of(inner)
    if state is None:
        return
    trampoline_raw = site.installed

    def swap() -> None:
        with lock:
            slot = site.slot
            if slot is None or site.installed is not trampoline_raw:
                return
            if slot.current() is not trampoline_raw:
                return
            new_raw = (
                adapt_to_descriptor(trampoline_raw, state.call)
                if isinstance(trampoline_raw, (staticmethod, classmethod))
                else state.call
            )
            modules_before = module_ids()
            slot.install(new_raw)
            site.installed_now(slot, new_raw, state.call, modules_before)

    state.on_resolved.append(swap)
