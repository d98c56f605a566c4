"""Stale references: modules that took the original with ``from x import f`` before apply().

Patching ``x.f`` cannot reach a name another module already bound to the original.
Patches applied through the import hook never have this problem (the patch lands
before anyone can import the name); those applied to modules imported *before*
``apply()`` can. One pass over ``sys.modules`` finds every module global that is
still the original object, for all such patches at once.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable


__all__ = ["find_holders", "loaded_modules", "module_ids"]


def loaded_modules() -> dict[str, types.ModuleType]:
    """A snapshot of ``sys.modules`` that is safe while other threads import.

    Even ``list(sys.modules.items())`` can fail with "dictionary changed size during
    iteration": building it allocates, allocation may run the garbage collector, and
    a finalizer may let another thread import. ``dict.copy`` copies the table without
    allocating per item; a rare failure is simply retried.
    """
    for _ in range(100):
        try:
            return sys.modules.copy()
        except RuntimeError:
            continue
    return sys.modules.copy()


_ids: tuple[int, object, frozenset[int]] | None = None


def module_ids() -> frozenset[int]:
    """The ids of the modules loaded now: who may hold a replacement before it is installed.

    revert() gives the original back only to modules that imported the replacement
    while it was installed; a module already loaded at install time that holds the
    same object (a library re-exporting the function used as replacement, builtins
    holding print) had it before, and is left alone. One snapshot serves every
    install until sys.modules changes (its size or its last key: imports append);
    a module that finished initializing since is then still counted as "after",
    which errs towards the exact undo the module needs if it imported while applied.
    """
    global _ids
    modules = sys.modules
    try:
        marker = (len(modules), next(reversed(modules), None))
    except RuntimeError:  # changed while read: take a fresh snapshot
        marker = None
    if marker is not None and _ids is not None and _ids[:2] == marker:
        return _ids[2]
    # A module still running its body (a package __init__ doing `from .core import f`,
    # which is what triggered the install) binds the replacement afterwards: it is not
    # "before". importlib holds a lock per module being imported; their names are far
    # fewer than the modules (asking each module's spec costs ~1 ms with torch loaded).
    from importlib import _bootstrap

    locks = getattr(_bootstrap, "_module_locks", None)
    loaded = loaded_modules()
    if isinstance(locks, dict):
        busy = set(locks)
        found = frozenset(id(m) for name, m in loaded.items() if name not in busy)
    else:  # pragma: no cover - a Python without the private lock table
        found = frozenset(
            id(m)
            for m in loaded.values()
            if not getattr(getattr(m, "__spec__", None), "_initializing", False)
        )
    if marker is not None:
        _ids = (*marker, found)
    return found


def find_holders(
    originals: dict[int, object],
    exclude_modules: set[int],
    exclude_prefixes: Iterable[str],
) -> dict[int, list[tuple[types.ModuleType, str]]]:
    """Map ``id(original)`` to the (module, global name) pairs still holding it."""
    plain = set(exclude_prefixes)
    dotted = tuple(p + "." for p in plain)
    found: dict[int, list[tuple[types.ModuleType, str]]] = {}
    if not originals:
        return found
    wanted = originals.keys()
    for module_name, module in loaded_modules().items():
        if module is None or id(module) in exclude_modules:
            continue
        if module_name == "builtins":
            # Its names are where the originals of print, open & co. live, not references
            # some module took before apply(): never reported, never rebound.
            continue
        if module_name in plain or module_name.startswith(dotted):
            continue
        try:
            # dict.copy is one C call: it cannot see the module change mid-way (another
            # thread importing) and allocates nothing per name.
            namespace = vars(module).copy()
        except TypeError:
            continue
        # Most modules hold none of the originals: one C-level pass decides that.
        if wanted.isdisjoint(map(id, namespace.values())):
            continue
        for name, value in namespace.items():
            key = id(value)
            if key in originals and originals[key] is value:
                found.setdefault(key, []).append((module, name))
    return found
