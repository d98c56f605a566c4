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
from typing import TYPE_CHECKING

from .._model.report import APPLIED
from ..imports._under_way import import_locks
from .target import inner_callable


if TYPE_CHECKING:
    from .entries import Entry


__all__ = [
    "UNTRACED",
    "declaring_packages",
    "find_holders",
    "loaded_modules",
    "module_ids",
    "own_modules",
    "report_stale",
]

#: Values too common to trace by identity (modules, small numbers, strings, None):
#: many modules hold them for themselves.
UNTRACED = (types.ModuleType, int, float, str, bytes, bool, type(None))


def declaring_packages(entries: Iterable[Entry]) -> set[str]:
    """The core and the top-level package of each plugin that declared one of ``entries``."""
    names = {"ascend_patch_core"}
    for entry in entries:
        if entry.provenance.entry_point:
            value = entry.provenance.entry_point.partition("=")[2].strip()
            names.add(value.partition(":")[0].partition(".")[0])
    return names


def own_modules(entries: Iterable[Entry]) -> list[str]:
    """Modules whose references to originals and replacements are deliberate.

    The core itself, each replacement's defining module, and the package of the
    plugin that declared the patch: a plugin keeping ``_orig = torch.zeros`` for its
    fallback must never be rebound to the replacement (that would recurse).
    """
    entries = list(entries)
    names = declaring_packages(entries)
    for entry in entries:
        target_module = entry.patch.path.root
        for obj in (entry.new_inner, entry.patch.replacement):
            module = getattr(inner_callable(obj), "__module__", None)
            if not isinstance(module, str) or module == "builtins":
                continue
            names.add(module)
            # Fallback references often live beside the replacement; protect its
            # package too, unless the target lives in that same package.
            package = module.rpartition(".")[0]
            if package and package.partition(".")[0] != target_module:
                names.add(package)
    return sorted(names)


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
    locks = import_locks()
    loaded = loaded_modules()
    if locks is not None:
        if locks:
            busy = set(locks)
            found = frozenset(id(m) for name, m in loaded.items() if name not in busy)
        else:  # no import in progress: every module counts (one C-level pass)
            found = frozenset(map(id, loaded.values()))
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
    *,
    modules: dict[str, types.ModuleType] | None = None,
) -> dict[int, list[tuple[types.ModuleType, str]]]:
    """Map ``id(original)`` to the (module, global name) pairs still holding it.

    ``modules`` limits the search (default: every loaded module).
    """
    plain = set(exclude_prefixes)
    dotted = tuple(p + "." for p in plain)
    found: dict[int, list[tuple[types.ModuleType, str]]] = {}
    if not originals:
        return found
    wanted = originals.keys()
    for module_name, module in (loaded_modules() if modules is None else modules).items():
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


def report_stale(entries: list[Entry], rebind_stale: bool) -> None:
    """Record (or, where asked, rebind) the modules still holding each entry's original.

    ``entries`` were installed on modules imported before apply(). One pass over
    ``sys.modules`` serves them all. Modules that hold an original deliberately
    (see :func:`own_modules`) and the patched slots themselves are never counted.
    """
    candidates = [
        e
        for e in entries
        if e.status is APPLIED
        and e.slot is not None
        and e.slot.kind == "module"
        and e.original is not None
        and not isinstance(e.original, UNTRACED)
    ]
    if not candidates:
        return
    originals = {id(e.original): e.original for e in candidates}
    exclude = {
        id(s.slot.owner) for e in candidates for s in (e, *e.alias_sites) if s.slot is not None
    }
    holders = find_holders(originals, exclude, own_modules(candidates))
    for entry in candidates:
        found = holders.get(id(entry.original), [])
        if not found:
            continue
        record = entry.record
        rebind = entry.patch.rebind if entry.patch.rebind is not None else rebind_stale
        for module, name in found:
            label = f"{module.__name__}.{name}"
            if rebind:
                # Recorded first: undoing a rebind that did not happen is a no-op (the
                # holder is checked), forgetting one that did is not (a fork() between).
                if entry.rebinds is None:
                    entry.rebinds = []
                entry.rebinds.append((module, name, entry.original))
                setattr(module, name, entry.new_inner)
                record.rebound_holders.append(label)
            else:
                record.stale_holders.append(label)
        if record.stale_holders:
            record.warnings.append(
                f"{len(record.stale_holders)} module(s) imported the original before apply(); "
                "call apply() earlier, or pass rebind_stale=True"
            )
