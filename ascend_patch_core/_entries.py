"""The patcher's bookkeeping for one atomic patch, and helpers over those records.

Kept apart from the Patcher so its life cycle (planned -> pending -> installing ->
applied -> reverted) reads in one place.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

from ._patch import AtomicPatch
from ._patch import LegacyPatch
from ._patch import ModuleHook
from ._report import CallCounters
from ._report import Provenance
from ._report import Record
from ._target import Slot
from ._target import TargetPath
from ._target import inner_callable


__all__ = [
    "APPLIED",
    "FAILED",
    "FINAL_NOT_APPLIED",
    "INSTALLING",
    "PENDING",
    "PLANNED",
    "REVERTED",
    "SKIPPED",
    "Entry",
    "HookState",
    "LegacyState",
    "Site",
    "Skip",
    "dependency_order",
    "in_cycle",
    "label",
    "norm_target",
    "own_modules",
    "who",
]

# Entry states (strings keep reprs and debugging readable).
PLANNED, PENDING, INSTALLING, APPLIED, SKIPPED, FAILED, REVERTED = (
    "planned",
    "pending",
    "installing",
    "applied",
    "skipped",
    "failed",
    "reverted",
)
FINAL_NOT_APPLIED = (SKIPPED, FAILED, REVERTED)


class Skip(Exception):
    """Raised inside installation to end a patch as SKIPPED with this reason."""


class Site:
    """One installed slot: the primary target or an alias."""

    __slots__ = ("installed", "installed_inner", "modules_before", "path", "rebinds", "slot")

    def __init__(self, path: TargetPath) -> None:
        self.path = path
        self.slot: Slot | None = None
        self.installed: Any = None
        self.installed_inner: Any = None
        #: ids of the modules loaded when ``installed_inner`` was installed: they may
        #: hold that object for their own reasons and are not given the original back.
        self.modules_before: frozenset[int] = frozenset()
        #: (module, global name, original) rebound to the replacement.
        self.rebinds: list[tuple[types.ModuleType, str, Any]] = []


class Entry:
    """The patcher's state for one AtomicPatch."""

    def __init__(
        self, patch: AtomicPatch, record: Record, group: str | None, provenance: Provenance
    ) -> None:
        self.patch = patch
        self.record = record
        self.group = group
        self.provenance = provenance
        self.state = PLANNED
        self.deps: list[Entry] = []
        self.dependents: list[Entry] = []
        self.watching: dict[str, Any] = {}
        self.primary = Site(patch.path)
        self.alias_sites = [Site(p) for p in patch.alias_paths]
        self.original: Any = None
        self.new_inner: Any = None
        self.counters: CallCounters | None = None
        #: Installed while apply() ran (module imported earlier): stale references possible.
        self.immediate = False

    def names(self) -> set[str]:
        names = {self.patch.name, self.patch.target}
        if self.group:
            names.add(self.group)
        return names


class HookState:
    def __init__(self, hook: ModuleHook, record: Record, provenance: Provenance) -> None:
        self.hook = hook
        self.record = record
        self.provenance = provenance
        self.handle: Any = None
        self.visited: set[int] = set()
        self.modules = 0


class LegacyState:
    def __init__(self, patch: LegacyPatch, record: Record, provenance: Provenance) -> None:
        self.patch = patch
        self.record = record
        self.provenance = provenance
        self.handle: Any = None
        self.done = False


def own_modules(entries: Iterable[Entry]) -> list[str]:
    """Modules whose references to originals and replacements are deliberate.

    The core itself, each replacement's defining module, and the package of the
    plugin that declared the patch: a plugin keeping ``_orig = torch.zeros`` for its
    fallback must never be rebound to the replacement (that would recurse).
    """
    names = {"ascend_patch_core"}
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
        if entry.provenance.entry_point:
            value = entry.provenance.entry_point.partition("=")[2].strip()
            names.add(value.partition(":")[0].partition(".")[0])
    return sorted(names)


def norm_target(path: str) -> str:
    return path.replace(":", ".")


def who(entry: Entry) -> str:
    label = repr(entry.patch.name)
    if entry.group and entry.group != entry.patch.name:
        label = f"{entry.group}/{label}"
    if entry.provenance.plugin:
        label += f" from plugin {entry.provenance.plugin!r}"
    return label


def label(item: object) -> str:
    return item.__qualname__ if isinstance(item, type) else repr(item)


def in_cycle(start: Entry) -> bool:
    seen: set[int] = set()
    stack = list(start.deps)
    while stack:
        entry = stack.pop()
        if entry is start:
            return True
        if id(entry) in seen:
            continue
        seen.add(id(entry))
        stack.extend(entry.deps)
    return False


def dependency_order(entries: list[Entry]) -> list[Entry]:
    """Stable topological order: declaration order, except that dependencies come first."""
    ordered: list[Entry] = []
    placed: set[int] = set()
    members = {id(e) for e in entries}

    def place(entry: Entry, trail: set[int]) -> None:
        if id(entry) in placed or id(entry) in trail:
            return
        trail.add(id(entry))
        for dep in entry.deps:
            if id(dep) in members:
                place(dep, trail)
        placed.add(id(entry))
        ordered.append(entry)

    for entry in entries:
        place(entry, set())
    return ordered
