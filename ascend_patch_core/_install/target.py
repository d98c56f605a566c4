"""Targets: resolution without side effects, installation and exact restore.

A parsed target path (``_model.paths``) names one slot: a module attribute, a class
attribute (staticmethod, classmethod and property keep their kind), or a mapping
entry.

Resolution never imports anything and never triggers a lazy module ``__getattr__``:
it reads module ``__dict__`` s and ``sys.modules`` only, so that resolving a target of
a not-yet-imported library is free and ``apply()`` stays side-effect free.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from collections.abc import MutableMapping
from typing import Any

from .._model.paths import ENGINE
from .._model.paths import Segment
from .._model.paths import TargetPath
from .._model.value import Value
from ..imports._under_way import initializing
from ..imports._under_way import wait_for_import


__all__ = [
    "ABSENT",
    "IMPORT_STATE",
    "LOW_LEVEL",
    "MACHINERY",
    "Missing",
    "Slot",
    "Waiting",
    "adapt_to_descriptor",
    "candidate_modules",
    "deepest_loaded",
    "engine_owned",
    "initializing_prefixes",
    "inner_callable",
    "is_engine",
    "resolve",
    "resolve_global",
    "resolve_string",
    "settle_initializing",
]

# ----------------------------------------------------------------------------- resolution


class Waiting(Value):
    """The target lives in (or below) a module that is not imported yet."""

    __slots__ = ("module",)
    _fields = ("module",)

    def __init__(self, module: str) -> None:
        self.module = module


class Missing(Value):
    """The target cannot exist here: its module is loaded and the name is absent."""

    __slots__ = ("reason",)
    _fields = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Slot:
    """A resolved place that holds an object, and what it holds now."""

    __slots__ = ("key", "kind", "module", "own", "owner", "raw")

    def __init__(self, kind: str, owner: Any, key: str, raw: Any, own: bool, module: str) -> None:
        #: "module" (module global), "class" (class attribute), "item" (mapping entry),
        #: "object" (attribute of some other object).
        self.kind = kind
        self.owner = owner
        self.key = key
        #: The raw object in the slot (for a class, as found in the defining class's
        #: ``__dict__``, so staticmethod/classmethod/property objects, not their results).
        self.raw = raw
        #: False when a class attribute is inherited: installing shadows it, restoring deletes.
        self.own = own
        #: The module whose import made this slot reachable.
        self.module = module

    def __repr__(self) -> str:
        return f"Slot({self.kind!r}, {self.describe()!r})"

    def current(self) -> Any:
        """What the slot holds right now (raw)."""
        if self.kind == "item":
            return self.owner.get(self.key, ABSENT) if isinstance(self.owner, Mapping) else ABSENT
        try:
            return vars(self.owner).get(self.key, ABSENT)
        except TypeError:  # objects without __dict__ (slots)
            return getattr(self.owner, self.key, ABSENT)

    def install(self, new_raw: Any) -> None:
        if self.kind == "item":
            self.owner[self.key] = new_raw
        else:
            setattr(self.owner, self.key, new_raw)

    def restore(self) -> None:
        """Put back exactly what was there: the same object, or nothing if it was inherited."""
        if self.own:
            self.install(self.raw)
        elif self.kind == "item":
            del self.owner[self.key]
        else:
            delattr(self.owner, self.key)

    def describe(self) -> str:
        return f"{self.module}:{self.key}" if self.kind == "module" else self.key


ABSENT = object()


def resolve_global(path: TargetPath, create: bool = False) -> Slot | None:
    """The slot of a module global in a loaded module, or None when the path is not one.

    The common case of :func:`resolve`, answered from ``sys.modules`` alone (no file
    system probe): the full walk would reach this very module, since a loaded
    submodule wins at every step.
    """
    module = path.global_module
    if module is None:
        return None
    owner = sys.modules.get(module)
    if not isinstance(owner, types.ModuleType):
        return None
    name = path.segments[-1].name
    namespace = owner.__dict__
    if name not in namespace:
        # A name the patch makes is made here too (as resolve() would); one that must
        # exist takes resolve()'s way, which tells "not yet imported" from "missing".
        return Slot("module", owner, name, ABSENT, False, module) if create else None
    return Slot("module", owner, name, namespace[name], True, module)


def resolve(path: TargetPath, *, create: bool = False) -> Slot | Waiting | Missing:
    """Find the slot ``path`` names, reading only what is already imported."""
    found = resolve_global(path)
    if found is not None:
        return found
    modules = sys.modules
    segments = path.segments
    prefixes = path.prefixes
    name = segments[0].name
    obj = modules.get(name)
    if obj is None:
        return Waiting(name)
    module_name = name
    # With an explicit module part, walk modules strictly first.
    explicit_depth = len(path.module.split(".")) if path.module else 0
    for index in range(1, len(segments)):
        seg = segments[index]
        last = index == len(segments) - 1
        if isinstance(obj, types.ModuleType) and not seg.is_key:
            child_name = (
                prefixes[index]
                if index < len(prefixes) and module_name == prefixes[index - 1]
                else f"{module_name}.{seg.name}"
            )
            if index < explicit_depth:
                child = modules.get(child_name)
                if child is None:
                    return Waiting(child_name)
                obj, module_name = child, child_name
                continue
            namespace = vars(obj)
            loaded_child = modules.get(child_name)
            if loaded_child is not None and not last:
                # Walking on: a loaded submodule wins over a same-named attribute that
                # shadows it (``from .sub import sub`` in a package __init__).
                value = loaded_child
            elif seg.name in namespace:
                value = namespace[seg.name]
            elif loaded_child is not None:
                value = loaded_child
            elif last and create:
                # An attribute the patch makes (create=True): no file-system probe for
                # a submodule of that name; a plugin may make dozens on one module.
                return Slot("module", obj, seg.name, ABSENT, False, module_name)
            else:
                if _submodule_may_exist(obj, child_name):
                    return Waiting(child_name)
                return Missing(f"{module_name} has no attribute {seg.name!r}")
            if last:
                return Slot("module", obj, seg.name, value, True, module_name)
            if isinstance(value, types.ModuleType):
                module_name = value.__name__
            obj = value
            continue
        if (
            isinstance(obj, Mapping)
            and not isinstance(obj, type)
            and (seg.is_key or seg.name not in _attrs(obj))
        ):
            if seg.name not in obj:
                if last and create and isinstance(obj, MutableMapping):
                    return Slot("item", obj, seg.name, ABSENT, False, module_name)
                return Missing(f"key {seg.name!r} is not in {_describe_prefix(segments[:index])}")
            if last:
                if not isinstance(obj, MutableMapping):
                    return Missing(f"{_describe_prefix(segments[:index])} is read-only")
                return Slot("item", obj, seg.name, obj[seg.name], True, module_name)
            obj = obj[seg.name]
            continue
        if seg.is_key:
            return Missing(f"{_describe_prefix(segments[:index])} is not a mapping")
        if isinstance(obj, type) and last:
            for klass in obj.__mro__:
                if seg.name in vars(klass):
                    raw = vars(klass)[seg.name]
                    return Slot("class", obj, seg.name, raw, klass is obj, module_name)
            if create:
                return Slot("class", obj, seg.name, ABSENT, False, module_name)
            return Missing(f"{obj.__qualname__} has no attribute {seg.name!r}")
        if last:
            try:
                own_dict = vars(obj)
            except TypeError:
                own_dict = {}
            if seg.name in own_dict:
                return Slot("object", obj, seg.name, own_dict[seg.name], True, module_name)
            if hasattr(obj, seg.name):
                return Slot("object", obj, seg.name, getattr(obj, seg.name), False, module_name)
            if create:
                return Slot("object", obj, seg.name, ABSENT, False, module_name)
            return Missing(f"{_describe_prefix(segments[:index])} has no attribute {seg.name!r}")
        try:
            obj = getattr(obj, seg.name)
        except AttributeError:
            return Missing(f"{_describe_prefix(segments[:index])} has no attribute {seg.name!r}")
    raise AssertionError("unreachable: paths have at least two segments")


def _attrs(obj: object) -> set[str]:
    try:
        return set(vars(obj))
    except TypeError:
        return set()


def _describe_prefix(segments: tuple[Segment, ...]) -> str:
    out = ""
    for seg in segments:
        out += f"[{seg.name!r}]" if seg.is_key else (f".{seg.name}" if out else seg.name)
    return out


def _submodule_may_exist(package: types.ModuleType, fullname: str) -> bool:
    """Whether ``fullname`` could still be imported as a submodule of a loaded package.

    Asks the path-based finder (a filesystem probe: nothing is executed) and the
    core's own import hub (modules served by import rules).
    """
    # vars(), not getattr(): a PEP 562 module __getattr__ must not run (it may import).
    search = vars(package).get("__path__")
    if search is None:
        return False
    from ..imports._hub import hub

    if hub.serves(fullname):
        return True
    import importlib.machinery

    try:
        return importlib.machinery.PathFinder.find_spec(fullname, list(search)) is not None
    except (ImportError, ValueError, TypeError):
        return False


# ----------------------------------------------------------------------------- descriptors


def inner_callable(raw: Any) -> Any:
    """The function inside a staticmethod/classmethod/property (its getter); else ``raw``."""
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    if isinstance(raw, property):
        return raw.fget
    return raw


def adapt_to_descriptor(original_raw: Any, new: Any) -> Any:
    """Give ``new`` the descriptor kind of ``original_raw`` so class attributes keep behaving.

    A plain function replacing a ``staticmethod`` must not start receiving ``self``; one
    replacing a property must stay a property (keeping the setter and deleter). A
    replacement that already is a descriptor object is installed as given.
    """
    if isinstance(new, (staticmethod, classmethod, property)):
        return new
    if isinstance(original_raw, staticmethod):
        return staticmethod(new)
    if isinstance(original_raw, classmethod):
        return classmethod(new)
    if isinstance(original_raw, property) and callable(new):
        return property(new, original_raw.fset, original_raw.fdel, original_raw.__doc__)
    return new


# ----------------------------------------------------------------------------- helpers over paths


def resolve_string(path: str) -> Any:
    """Import ``"pkg.mod:attr.sub"`` or ``"pkg.mod.attr"`` (longest importable module prefix)."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name) and cut > 1:
                continue
            raise
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ModuleNotFoundError(f"No module named {parts[0]!r}", name=parts[0])


def initializing_prefixes(path: TargetPath) -> list[str]:
    """Modules on ``path`` that are imported but still running their body."""
    names: list[str] = []
    for name in path.prefixes:
        module = sys.modules.get(name)
        if module is None:
            break
        if initializing(module):
            names.append(name)
    return names


def candidate_modules(path: TargetPath, first_missing: str) -> list[str]:
    """Module names, from ``first_missing`` down, that may hold the target's slot."""
    names: list[str] = []
    name = ""
    limit = len(path.module.split(".")) if path.module else len(path.segments) - 1
    for segment in path.segments[:limit]:
        if segment.is_key:
            break
        name = f"{name}.{segment.name}" if name else segment.name
        if len(name) >= len(first_missing):
            names.append(name)
    return names or [first_missing]


def deepest_loaded(prefixes: tuple[str, ...]) -> str | None:
    """The innermost of a target's leading modules that is loaded (the one imported now)."""
    return next((name for name in reversed(prefixes) if name in sys.modules), None)


def settle_initializing(path: TargetPath) -> None:
    """Wait for modules on the path that another thread is still importing."""
    modules = sys.modules
    for name in path.prefixes:
        module = modules.get(name)
        if module is None:
            return
        if initializing(module):
            # Blocks until the other thread's import finishes; returns at once if
            # this thread is the one importing (a circular import).
            wait_for_import(name)


# ----------------------------------------------------------------------------- the engine's own

#: What the engine depends on (``_install.engine_targets`` says why, and refuses patches there).
IMPORT_STATE = ("modules", "meta_path", "path_hooks", "path_importer_cache")
MACHINERY = (
    "importlib._bootstrap",
    "importlib._bootstrap_external",
    "importlib.machinery",
    "_frozen_importlib",
    "_frozen_importlib_external",
)
#: Built-in modules importlib binds at start-up and calls while importing.
LOW_LEVEL = ("_imp", "_thread", "_weakref", "_warnings", "marshal", "_io", "posix", "nt", "winreg")
_OWNERS = frozenset(("sys", "builtins", "importlib", "threading", "os", *MACHINERY, *LOW_LEVEL))


_ENGINE_PREFIX = ENGINE + "."


def is_engine(name: object) -> bool:
    return isinstance(name, str) and (name == ENGINE or name.startswith(_ENGINE_PREFIX))


def engine_owned(owner: object) -> bool:
    """Cheap screen (every installation passes it): whether a slot of ``owner`` may be one
    the engine depends on; ``_install.engine_targets.refuse_slot`` then says."""
    if isinstance(owner, types.ModuleType):
        name = vars(owner).get("__name__")
        return name in _OWNERS or is_engine(name)
    if isinstance(owner, type):
        defined = vars(owner).get("__module__")
        return defined in MACHINERY or is_engine(defined)
    if type(owner) in (dict, list):
        return any(owner is getattr(sys, key, None) for key in IMPORT_STATE) or (
            owner is vars(sys.modules["builtins"])
        )
    return is_engine(getattr(type(owner), "__module__", None))
