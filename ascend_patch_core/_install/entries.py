"""The engine's bookkeeping: one entry per patch, hook or 1.0 patch, and the ledger of them all.

An entry's state is its record's :class:`Status` (what the report shows), plus one
flag, ``claimed``: the thread installing it owns it from then on. So "pending and
not claimed" is open (planned, or waiting for an import or a dependency); "pending
and claimed" is being installed (``claimed`` is then that thread's ident, which a
``fork()`` child reads to hand back what a thread it does not have was installing);
applied, skipped, failed and reverted are what they say.

The ledger holds what one patcher planned and did -- records, warnings, entries --
and the lock that guards them. The Patcher, the planner, the installer and the undo
log all share it. Every mutation happens under ``lock`` (re-entrant), held only for
bookkeeping; no import starts and no user code runs while it is held.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

from .._model.errors import PatchError
from .._model.patch import AtomicPatch
from .._model.patch import LegacyPatch
from .._model.patch import ModuleHook
from .._model.paths import TargetPath
from .._model.report import FAILED
from .._model.report import PENDING
from .._model.report import REVERTED
from .._model.report import SKIPPED
from .._model.report import Provenance
from .._model.report import Record
from .._model.report import Status
from .target import Slot


__all__ = [
    "NOT_APPLIED",
    "Entry",
    "HookState",
    "Ledger",
    "LegacyState",
    "Site",
    "Skip",
    "label",
    "layers_lock",
    "push_layer",
    "top_layers",
    "who",
]

if TYPE_CHECKING:
    from typing import Protocol

    # Only for annotations: creating a Protocol class costs ~75 us at import.

    class InstallState(Protocol):
        """What the installer's other files (``_install.aliases``, ``_install.undo``) use of the Installer.

        Declared here, below all three, so that they take it without naming the
        Installer, which imports them (docs/core.md: no circles, TYPE_CHECKING included).
        """

        ledger: Ledger
        #: Sites filled, in order (an ordered set); revert() replays it backwards.
        log: dict[Site, None]
        #: Count the calls of replacements that have no runtime_check.
        count_calls: bool

        def finish(self, entry: Entry, status: Status, reason: str | None) -> None: ...

        def take_log(self) -> dict[Site, None]: ...


#: Final states of an entry that never (or no longer) holds an installation.
NOT_APPLIED = frozenset((SKIPPED, FAILED, REVERTED))


class Skip(Exception):
    """Raised inside installation to end a patch as SKIPPED with this reason."""


_NO_MODULES: frozenset[int] = frozenset()


class Site:
    """One slot an entry installs into: its target (the entry itself) or an alias."""

    __slots__ = (
        "_of",
        "above",
        "below",
        "earlier",
        "installed",
        "installed_inner",
        "modules_before",
        "path",
        "rebinds",
        "slot",
    )

    def __init__(self, path: TargetPath, entry: Entry | None) -> None:
        self.path = path
        self._of = entry
        #: The layers next to it on its slot while installed (see :func:`push_layer`).
        self.below: Site | None = None
        self.above: Site | None = None
        self.slot: Slot | None = None
        #: What the slot holds now (raw: a staticmethod object for a staticmethod target).
        self.installed: Any = None
        #: The callable inside ``installed``.
        self.installed_inner: Any = None
        #: ids of the modules loaded when ``installed_inner`` was installed: they may
        #: hold that object for their own reasons and are not given the original back.
        self.modules_before: frozenset[int] = _NO_MODULES
        #: Objects this site installed before the current one, with their
        #: ``modules_before``: a with_imports trampoline is swapped for its function
        #: after the first call, and a module that imported the trampoline in between
        #: must get the original back too. None until a swap happens.
        self.earlier: list[tuple[Any, frozenset[int]]] | None = None
        #: (module, global name, original) rebound to the replacement; None until one is.
        self.rebinds: list[tuple[types.ModuleType, str, Any]] | None = None

    def installed_now(
        self, slot: Slot, raw: Any, inner: Any, modules_before: frozenset[int]
    ) -> None:
        if self.slot is not None:
            if self.earlier is None:
                self.earlier = []
            self.earlier.append((self.installed_inner, self.modules_before))
        self.slot, self.installed, self.installed_inner = slot, raw, inner
        self.modules_before = modules_before

    @property
    def entry(self) -> Entry:
        """The entry whose patch this site installs (an entry's own site: the entry)."""
        of = self._of
        return of if of is not None else cast("Entry", self)

    def history(self) -> list[tuple[Any, frozenset[int]]]:
        """Every (inner object, modules loaded then) this site installed, oldest first."""
        return [*(self.earlier or ()), (self.installed_inner, self.modules_before)]

    def clear(self) -> None:
        self.slot = None
        self.installed = self.installed_inner = None
        self.earlier = None


class Entry(Site):
    """The engine's state for one AtomicPatch; it is also the site of its target.

    (Its aliases are sites of their own, in ``alias_sites``.)
    """

    __slots__ = (
        "after",
        "alias_sites",
        "claimed",
        "dependents",
        "deps",
        "new_inner",
        "original",
        "patch",
        "record",
        "replacement",
        "requires",
        "verdicts",
        "watching",
    )

    #: Owned by the thread installing it (from the claim until the end of its life):
    #: False while open, that thread's ident while pending, True once ended.
    claimed: bool | int
    #: Requirements checked, with their answers: (text, satisfied, explanation).
    verdicts: list[tuple[str, bool, str]] | tuple[()]
    #: The entries it waits for (``after=``), and those waiting for it.
    deps: list[Entry] | tuple[()]
    dependents: list[Entry] | tuple[()]
    #: Import-hub handles by what they wait for; None while nothing is watched.
    watching: dict[str, Any] | None
    original: Any
    #: The replacement as resolved and wrapped, before any runtime_check wrapper.
    replacement: Any
    #: What sits in the slot (inside a descriptor): the replacement or its runtime_check wrapper.
    new_inner: Any

    def __init__(
        self,
        patch: AtomicPatch,
        record: Record,
        *,
        requires: tuple[str, ...] = (),
        after: tuple[str, ...] = (),
    ) -> None:
        # The most patches a plugin declares go through here: keep it to assignments
        # (containers that most entries never need are made on first use).
        self.patch = patch
        #: Its record: status, reason, group and provenance live there.
        self.record = record
        #: The patch's own requirements, then its group's.
        self.requires = (*patch.requires, *requires) if requires else patch.requires
        #: The patch's own ``after`` names, then its group's.
        self.after = (*patch.after, *after) if after else patch.after
        self.alias_sites = [Site(p, self) for p in patch.alias_paths] if patch.alias_paths else ()
        self.path = patch.path
        self._of = self.below = self.above = None
        self.claimed = False
        self.verdicts = self.deps = self.dependents = ()
        self.watching = self.original = self.replacement = self.new_inner = None
        self.slot = self.installed = self.installed_inner = self.earlier = self.rebinds = None
        self.modules_before = _NO_MODULES

    @property
    def group(self) -> str | None:
        return self.record.group

    @property
    def provenance(self) -> Provenance:
        return self.record.provenance

    @property
    def names(self) -> frozenset[str]:
        """What ``disable()`` and ``after=`` may call it: patch name, target (also dotted), group."""
        patch = self.patch
        names = {patch.name, patch.target, patch.path.key}
        group = self.record.group
        if group:
            names.add(group)
        return frozenset(names)

    @property
    def status(self) -> Status:
        return self.record.status

    @property
    def open(self) -> bool:
        """Planned or waiting, and no thread has claimed it yet."""
        return self.record.status is PENDING and not self.claimed

    def depends_on(self, dep: Entry) -> None:
        """Link ``self`` after ``dep`` (the planner links each pair once).

        Appended, not copied: one group named in ``after=`` by thousands of patches
        gets that many dependents. (Readers iterate copies: ``list(dependents)``.)
        """
        deps = self.deps if self.deps else []
        deps.append(dep)
        self.deps = deps
        dependents = dep.dependents if dep.dependents else []
        dependents.append(self)
        dep.dependents = dependents

    def watch(self, key: str, handle: Any) -> None:
        if self.watching is None:
            self.watching = {}
        self.watching[key] = handle

    def stop_watching(self) -> list[Any]:
        """Forget every watch; return their handles (to unwatch outside the lock)."""
        watching, self.watching = self.watching, None
        return list(watching.values()) if watching else []

    def __repr__(self) -> str:
        return f"<Entry {self.patch.name!r} {self.record.status.value}{' claimed' if self.claimed else ''}>"


class HookState:
    """The engine's state for one ModuleHook."""

    __slots__ = ("handle", "hook", "modules", "record", "requires", "visited")

    def __init__(self, hook: ModuleHook, record: Record, requires: tuple[str, ...] = ()) -> None:
        self.hook = hook
        #: Its record: status, reason, group and provenance live there.
        self.record = record
        self.requires = (*hook.requires, *requires)
        self.handle: Any = None
        self.visited: set[int] = set()
        self.modules = 0

    @property
    def group(self) -> str | None:
        return self.record.group

    @property
    def provenance(self) -> Provenance:
        return self.record.provenance


class LegacyState:
    """The engine's state for one 1.0 function patch."""

    __slots__ = ("done", "handle", "patch", "record")

    def __init__(self, patch: LegacyPatch, record: Record) -> None:
        self.patch = patch
        self.record = record
        self.handle: Any = None
        self.done = False

    @property
    def provenance(self) -> Provenance:
        return self.record.provenance


#: The top layer of each slot that holds installations, by (id of the owner, key,
#: whether a mapping item); its slot keeps the owner alive. Undoing a layer (what
#: happens to the others) is _layers' business; this is the part installing needs.
top_layers: dict[tuple[int, str, bool], Site] = {}
#: Held by _layers while it undoes a layer.
layers_lock = threading.RLock()


def push_layer(site: Site) -> None:
    """Record ``site``'s installation, just made, as the top layer of its slot.

    It stands on the slot's top layer if that is what it found in the slot; over
    anything else (the first patch, or a value someone else put there since) it has
    none below, and a layer left under that value is undone on its own. Not under
    ``layers_lock``: apply() comes here for every patch, and dict operations are
    atomic (an install racing an undo of the same slot is not ordered anyway).
    """
    slot = site.slot
    assert slot is not None
    key = (id(slot.owner), slot.key, slot.kind == "item")
    top = top_layers.get(key)
    if top is not None and top is not site and top.installed is slot.raw:
        site.below = top
        top.above = site
    top_layers[key] = site


def _failed(record: Record) -> str:
    """How strict mode names a failed record: a plugin's group with its plugin (a patch's
    own reason says where it came from)."""
    plugin = record.provenance.plugin
    if record.kind == "group" and plugin:
        return f"group {record.name!r} of plugin {plugin!r}"
    return record.name


def who(entry: Entry) -> str:
    text = repr(entry.patch.name)
    if entry.group and entry.group != entry.patch.name:
        text = f"{entry.group}/{text}"
    if entry.provenance.plugin:
        text += f" from plugin {entry.provenance.plugin!r}"
    return text


def label(item: object) -> str:
    return item.__qualname__ if isinstance(item, type) else repr(item)


class Ledger:
    """Records, warnings and entries of one patcher, with their indexes."""

    __slots__ = (
        "_by_name",
        "_reverted_upto",
        "by_target",
        "entries",
        "group_aliases",
        "hooks",
        "legacy",
        "lock",
        "records",
        "warnings",
    )

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Every record of the report, in the order things were declared.
        self.records: list[Record] = []
        self.warnings: list[str] = []
        self.entries: list[Entry] = []
        self.hooks: list[HookState] = []
        self.legacy: list[LegacyState] = []
        #: Each other name of a planned group (``group_names``) -> its name, for disable().
        self.group_aliases: dict[str, str] = {}
        #: First live entry per normalized target or alias path.
        self.by_target: dict[str, Entry] = {}
        #: Entries by each of their names (Entry.names), with their place in ``entries``:
        #: made on first use (an ``after=`` link, a disable() after apply()), kept from then on.
        self._by_name: dict[str, list[tuple[int, Entry]]] | None = None
        #: (records, warnings) that belong to the last revert()'s report; None while applied.
        self._reverted_upto: tuple[int, int] | None = None

    def warn(self, message: str) -> None:
        with self.lock:
            if message not in self.warnings:
                self.warnings.append(message)

    def add(self, entries: list[Entry], hooks: list[HookState], legacy: list[LegacyState]) -> None:
        """Take planned entries in (the planner has already indexed them)."""
        with self.lock:
            if self._by_name is not None:
                self._index_names(entries, len(self.entries))
            self.entries.extend(entries)
            self.hooks.extend(hooks)
            self.legacy.extend(legacy)

    def _index_names(self, entries: Iterable[Entry], start: int) -> None:
        assert self._by_name is not None
        by_name = self._by_name
        for place, entry in enumerate(entries, start):
            for name in entry.names:
                by_name.setdefault(name, []).append((place, entry))

    def named(self, names: Iterable[str]) -> list[Entry]:
        """Under the lock: the entries any of ``names`` names, in ``entries`` order, each once.

        Through an index, so that ``after=`` links and disable() after apply() cost what
        they find, not what the patcher holds (one add() or disable() at a time stays linear).
        """
        if self._by_name is None:
            self._by_name = {}
            self._index_names(self.entries, 0)
        found: dict[int, Entry] = {}
        for name in names:
            for place, entry in self._by_name.get(name, ()):
                found[place] = entry
        return [found[place] for place in sorted(found)]

    def clear(self) -> tuple[list[Entry], list[HookState], list[LegacyState]]:
        """Forget every entry (revert): return what was there."""
        with self.lock:
            entries, self.entries = self.entries, []
            hooks, self.hooks = self.hooks, []
            legacy, self.legacy = self.legacy, []
            self.by_target = {}
            self._by_name = None
        return entries, hooks, legacy

    def raise_if_failed(self, records: Iterable[Record] | None = None) -> None:
        """Strict mode: PatchError naming every failed record (of ``records``, else of all).

        Reads the records, not a Report: reading a report runs the stale-reference
        scan, which waits until someone reads it.
        """
        with self.lock:
            failed = [
                r for r in (self.records if records is None else records) if r.status is FAILED
            ]
        if failed:
            raise PatchError(
                "ascend-patch (strict): " + "; ".join(f"{_failed(r)}: {r.reason}" for r in failed)
            )

    def end_report(self) -> tuple[list[Record], list[str]]:
        """revert(): the report keeps its records, reverted, until the next apply().

        Returns copies: what the report says right after the revert.
        """
        with self.lock:
            # New lists: report objects taken before keep exactly the reverted cycle.
            self.records, self.warnings = list(self.records), list(self.warnings)
            self._reverted_upto = (len(self.records), len(self.warnings))
            return list(self.records), list(self.warnings)

    def start_report(self) -> None:
        """apply(): a new report. Records made since the last revert() (import rules
        declared meanwhile: they act at once) belong to it; the reverted ones do not.

        """
        with self.lock:
            if self._reverted_upto is not None:
                records, warnings = self._reverted_upto
                self.records = self.records[records:]
                self.warnings = self.warnings[warnings:]
                self._reverted_upto = None
