"""Giving the original back to modules imported while a patch was applied.

``from x import f`` executed after the patch binds the replacement; without this,
such a module keeps it after revert() and the undo is not exact. Only modules loaded
after an installation can hold it that way, so only they are searched. Identity alone
does not say where a module got an object, though: a module loaded later may hold the
same object for reasons of its own (``DTYPE = float`` when the replacement is
``float``, ``from helpers import fast`` when it is ``helpers.fast``). So a late holder
gets the original back when

* it holds the replacement under the target's own name (``from x import f``), or
* under another name (``g = x.f``, ``from x import f as g``) when nothing else could
  have given it that object: no module loaded before the install holds it (outside
  the patched slots, the core, the plugin that declared the patch and the script,
  ``__main__``), and it is not the object's own name in the module that defines it.

Otherwise it is left as it is; when another module holds the object, the patch's
record names it.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Collection
from collections.abc import Iterable
from typing import Any

from .entries import Entry
from .entries import Site
from .stale import UNTRACED
from .stale import declaring_packages
from .stale import find_holders
from .stale import loaded_modules
from .stale import own_modules


__all__ = ["restore_late_holders"]

Holder = tuple[types.ModuleType, str]


class _Install:
    """One installation of a replacement on a module global, as revert() finds it."""

    __slots__ = ("before", "entry", "name", "original")

    def __init__(self, entry: Entry, name: str, original: Any, before: frozenset[int]) -> None:
        self.entry = entry
        self.name = name
        self.original = original
        #: ids of the modules loaded when it went in
        self.before = before


def restore_late_holders(log: Collection[Site], entries: Iterable[Entry]) -> None:
    """Give the original back to modules that took a replacement while it was applied."""
    # First the snapshots alone: most reverts come while every module was loaded
    # before the installs, and then there is nothing to search for.
    sites = [
        site
        for site in log
        if site.slot is not None and site.slot.kind == "module" and site.slot.own
    ]
    snapshots = {
        id(before): before
        for site in sites
        for inner, before in site.history()
        if not isinstance(inner, UNTRACED)
    }
    if not snapshots:
        return
    # One snapshot object serves every install made while sys.modules did not change:
    # the modules to search are those missing from at least one snapshot.
    common = frozenset.intersection(*snapshots.values())
    loaded = loaded_modules()
    late = {name: m for name, m in loaded.items() if m is not None and id(m) not in common}
    if not late:
        return
    installs: dict[int, list[_Install]] = {}  # id of what was installed -> its installs
    objects: dict[int, Any] = {}
    for site in sites:
        slot = site.slot
        assert slot is not None
        for inner, before in site.history():
            if not isinstance(inner, UNTRACED):
                objects[id(inner)] = inner
                installs.setdefault(id(inner), []).append(
                    _Install(site.entry, slot.key, slot.raw, before)
                )
    slots = {(id(site.slot.owner), site.slot.key) for site in log if site.slot is not None}
    entries = list(entries)
    undecided: dict[int, list[tuple[Holder, _Install]]] = {}
    for key, found in find_holders(objects, set(), own_modules(entries), modules=late).items():
        obj = objects[key]
        for module, name in found:
            if (id(module), name) in slots:
                continue  # the patched slot itself
            install = _install_for(installs[key], name)
            if install is None or id(module) in install.before:
                continue  # loaded before the install: it had the object itself
            if name == install.name:
                _give_back(module, name, obj, install.original)
            elif not _named_at_home(obj, name):
                undecided.setdefault(key, []).append(((module, name), install))
    if undecided:
        elsewhere = _held_before(undecided, objects, slots, loaded, entries)
        for key, holders in undecided.items():
            for (module, name), install in holders:
                if key in elsewhere:
                    install.entry.record.warnings.append(
                        f"{module.__name__}.{name} still holds the replacement: it was "
                        f"imported while applied, but {elsewhere[key]} holds the same "
                        "object, so it may have come from there"
                    )
                else:
                    _give_back(module, name, objects[key], install.original)


def _install_for(found: list[_Install], name: str) -> _Install | None:
    """The install a holder under ``name`` took the object from: the one of that name,
    else the only original there is (None when installs with different originals share it)."""
    for install in reversed(found):
        if install.name == name:
            return install
    originals = {id(i.original) for i in found}
    return found[-1] if len(originals) == 1 else None


def _give_back(module: types.ModuleType, name: str, installed: Any, original: Any) -> None:
    if vars(module).get(name) is installed:
        setattr(module, name, original)


def _named_at_home(obj: Any, name: str) -> bool:
    """Whether ``name`` is ``obj``'s own name in the module defining it (``from home import name``)."""
    if getattr(obj, "__name__", None) != name:
        return False
    home = sys.modules.get(getattr(obj, "__module__", None) or "")
    return home is not None and vars(home).get(name) is obj


def _held_before(
    undecided: dict[int, list[tuple[Holder, _Install]]],
    objects: dict[int, Any],
    slots: set[tuple[int, str]],
    loaded: dict[str, types.ModuleType],
    entries: list[Entry],
) -> dict[int, str]:
    """For each object: a ``module.name`` holding it that was loaded before its installs,
    outside the patched slots, their rebound holders, the core and the declaring plugins."""
    found: dict[int, str] = {}
    for name, value in vars(builtins).items():  # find_holders leaves builtins out
        if id(value) in undecided and value is objects[id(value)]:
            found.setdefault(id(value), f"builtins.{name}")
    wanted = {key: objects[key] for key in undecided if key not in found}
    if not wanted:
        return found
    skip = slots | {(id(m), n) for e in entries for m, n, _ in (e.rebinds or ())}
    # The script (__main__) defines replacements, but modules seldom import from it.
    ours = declaring_packages(entries) | {"__main__"}
    for key, holders in find_holders(wanted, set(), ours, modules=loaded).items():
        before = frozenset.intersection(*(install.before for _, install in undecided[key]))
        for module, name in holders:
            if id(module) in before and (id(module), name) not in skip:
                found[key] = f"{module.__name__}.{name}"
                break
    return found
