"""The lazy installer: watch a patch's module, install it when it exists, then its aliases.

Life of an entry (its record's status, plus ``claimed`` while a thread installs it)::

    pending --(dependencies applied, target module imported)--> claimed --> applied
       |                                                           |
       +--> skipped (disabled, requires, precheck, target missing) +--> failed (an exception)

Thread safety: transitions happen under the ledger's lock, held only for
bookkeeping; no import starts and no user code (prechecks, wrappers, factories)
runs while it is held, so an import hook firing in another thread can never
deadlock against ``apply()``. An entry is claimed under the lock, so it is
installed exactly once however many threads race to import its module. What goes
into the slot is built outside the lock and put in under it, in the same step that
records it: ``fork()`` takes the lock (``_engine.fork``), so a child sees a patch whole or
not at all, and an entry still claimed by a thread the child does not have is
handed back.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from .._model.errors import PatchError
from .._model.report import APPLIED
from .._model.report import FAILED
from .._model.report import PENDING
from .._model.report import REVERTED
from .._model.report import SKIPPED
from .._model.report import Status
from ..imports._hub import hub
from ..imports._under_way import import_locks
from ..imports._under_way import in_import_callback
from .entries import NOT_APPLIED
from .entries import Entry
from .entries import Ledger
from .entries import Site
from .entries import Skip
from .entries import push_layer
from .entries import who
from .replacement import DESCRIPTORS
from .replacement import counter
from .replacement import may_be_lazy
from .replacement import replacement_for
from .replacement import wrapper_maker
from .stale import module_ids
from .target import ABSENT
from .target import Missing
from .target import Slot
from .target import Waiting
from .target import candidate_modules
from .target import deepest_loaded
from .target import engine_owned
from .target import initializing_prefixes
from .target import resolve
from .target import resolve_global
from .target import settle_initializing
from .watches import look_again
from .watches import unwatch_all
from .watches import watch


__all__ = ["Installer"]

#: What _build returns when nothing is to go into the slot.
_NOT_INSTALLED = object()
_FUNCTION = types.FunctionType


class Installer:
    """Installs one patcher's entries as their modules appear; records every site it fills."""

    def __init__(self, ledger: Ledger, strict: Callable[[], bool]) -> None:
        self.ledger = ledger
        self._strict = strict
        #: Sites filled, in order (revert() replays it backwards); a dict used as an
        #: ordered set, so that disable() takes one out without a search.
        self.log: dict[Site, None] = {}
        #: The thread running apply(): entries it installs were imported before apply().
        self.applying_thread: int | None = None
        #: Entries installed during apply() whose stale references are yet to be looked for.
        self.stale_candidates: list[Entry] = []
        #: (len(sys.modules), module_ids()): asked again only when sys.modules grew
        #: (a replacement's import) since the last installation.
        self._snapshot: tuple[int, frozenset[int]] | None = None
        #: Entries that failed, in strict mode, while their module was being imported.
        self._failed_in_import: list[tuple[Entry, str]] = []
        #: Count the calls of replacements that have no runtime_check (see _counting).
        self.count_calls = False
        hub.when_import_fails(self._import_failed)

    # ------------------------------------------------------------------ advancing

    def advance(self, entry: Entry) -> None:
        """Move an entry as far as it can go now. Safe to call from any thread, any time."""
        with self.ledger.lock:
            if not entry.open:
                return
            if entry.deps and not self._dependencies_applied(entry):
                return
            if entry.patch.after_import:
                missing = [m for m in entry.patch.after_import if m not in sys.modules]
                if missing:
                    self._wait_for(entry, missing[0])
                    return
        path = entry.patch.path
        settle_initializing(path)
        found = resolve(path, create=entry.patch.create)
        if isinstance(found, Slot):
            self._install(entry, found)
        elif isinstance(found, Waiting):
            self._wait_for_target(entry, found)
        else:
            self._target_missing(entry, found)

    def _dependencies_applied(self, entry: Entry) -> bool:
        """Under the lock: whether every ``after`` dependency is in (else skip or wait)."""
        for dep in entry.deps:
            if dep.status in NOT_APPLIED:
                reason = f"needs {dep.patch.name!r}, which is {dep.status.value}"
                self.finish(entry, SKIPPED, reason)
                return False
        for dep in entry.deps:
            if dep.status is not APPLIED:
                entry.record.set(PENDING, f"waiting for {dep.patch.name!r}")
                return False
        return True

    def _wait_for_target(self, entry: Entry, found: Waiting) -> None:
        with self.ledger.lock:
            if entry.open:
                # Which prefix is the module cannot be known without importing, so
                # every candidate is watched: the patch lands as soon as the
                # defining module has run, before a package __init__ re-exports it.
                for candidate in candidate_modules(entry.patch.path, found.module):
                    self._wait_for(entry, candidate)
                entry.record.set(PENDING, f"waiting for import of {found.module}")
        self._look_again(entry, found.module)

    def _look_again(self, entry: Entry, module: str) -> None:
        # Twice is harmless: an entry that is no longer open is not advanced.
        look_again(entry, module, module, self.ledger, functools.partial(self.advance, entry))

    def _target_missing(self, entry: Entry, found: Missing) -> None:
        patch = entry.patch
        unfinished = initializing_prefixes(patch.path)
        if not unfinished and not isinstance(resolve(patch.path, create=patch.create), Missing):
            # A module on the path ended its body between resolve() and the look at
            # which ones are still running: what was missing may be there now.
            self.advance(entry)
            return
        with self.ledger.lock:
            if not entry.open:
                return
            if unfinished:
                # A module on the path is still running its body (in another thread):
                # the name may yet be defined. Look again when it is done.
                for name in unfinished:
                    self._wait_for(entry, name)
        if unfinished:
            for name in unfinished:
                self._look_again(entry, name)
            return
        with self.ledger.lock:
            if not entry.open:
                return
            reason = f"target not found: {found.reason}"
            strict = self._strict()
            self.finish(entry, FAILED if strict else SKIPPED, reason)
        self.advance_dependents(entry)
        if strict:
            from .strict import strict_failure

            module = deepest_loaded(entry.patch.path.prefixes) if in_import_callback() else None
            raise strict_failure(entry.record, reason, module=module)

    def _wait_for(self, entry: Entry, module: str) -> None:
        """Under the lock: advance ``entry`` once ``module`` has been imported."""
        entry.record.set(PENDING, f"waiting for import of {module}")
        watch(entry, module, module, self.ledger, functools.partial(self.advance, entry))

    def advance_dependents(self, entry: Entry) -> None:
        for dependent in list(entry.dependents):
            self.advance(dependent)

    def _import_failed(self, name: str, module: types.ModuleType) -> None:
        """The import of ``name`` failed (strict mode) and importlib drops the module.

        Its patches were installed on a module nobody will see: take them out of the
        log and wait for the next import, like the patch that failed it. The report
        then says what is true: pending, not applied.
        """
        from .undo import restore_site

        with self.ledger.lock:  # one step: a fork() child sees it done or not begun
            reopen = [e for e, where in self._failed_in_import if where == name]
            self._failed_in_import = [(e, w) for e, w in self._failed_in_import if w != name]
            on_module = [
                e
                for e in self.ledger.entries
                if e.record.status is APPLIED and e.slot is not None and e.slot.module == name
            ]
            for entry in on_module:
                self.log.pop(entry, None)
                restore_site(entry, self.ledger.warn)
            for entry in (*on_module, *reopen):
                entry.claimed = False
                entry.original = entry.replacement = entry.new_inner = None
                # Wait for the next import: the module is still in sys.modules until
                # importlib drops it when this callback returns.
                self._wait_for(entry, name)
                entry.record.reason = f"waiting for import of {name} (its last import failed)"

    # The Patcher's apply() and revert() go through these, never through the fields:
    # what the installer holds stays the installer's to change (docs/core.md).

    def begin_apply(self, count_calls: bool) -> None:
        """apply() starts on this thread (under the ledger's lock): entries it installs are immediate."""
        self.count_calls = count_calls
        self.applying_thread = threading.get_ident()

    def end_apply(self) -> None:
        """apply() is done (under the ledger's lock): installs from now on come from imports."""
        self.applying_thread = None

    def take_stale_candidates(self) -> list[Entry]:
        """The entries installed during apply() not yet searched for stale references; forgets them."""
        entries, self.stale_candidates = self.stale_candidates, []
        return entries

    def take_log(self) -> dict[Site, None]:
        """The sites filled so far, leaving the log empty (revert(), under the ledger's lock)."""
        log, self.log = self.log, {}
        return log

    def finish(self, entry: Entry, status: Status, reason: str | None) -> None:
        """End an entry's life with ``status`` (under the lock) and stop its watches."""
        entry.record.set(status, reason)
        entry.claimed = True
        unwatch_all(entry)

    # ------------------------------------------------------------------ installing

    def install_ready(self, entries: list[Entry], crowded: frozenset[int] = frozenset()) -> None:
        """Advance many entries at once (apply()): those whose target is a loaded global in a batch.

        apply() installs hundreds of patches on modules already imported. Those whose
        target is a module global of a loaded module are found and claimed under one
        lock for the whole batch. If nothing is to be built for one -- an object
        installed as given, no precheck, a plain module -- it is installed and recorded
        right there: that runs no user code and imports nothing. The others are built
        and installed outside the lock, as always, and recorded under one lock again.
        Everything else -- dependencies, other slots, modules still importing, the
        entries in ``crowded`` (ids of entries that share a target: the second wraps
        what the first put in) -- goes the one-by-one way of :meth:`advance`, after.
        """
        locks = import_locks()
        if locks is None or locks:  # an import is in progress: modules may be initializing
            for entry in entries:
                self.advance(entry)
            return
        to_build: list[tuple[Entry, Slot]] = []
        follow_up: list[Entry] = []
        later: list[Entry] = []
        me = threading.get_ident()
        immediate = self.applying_thread == me
        # Loaded before the ledger lock, and only for a direct patch with a runtime_check:
        # the others build their wrapper outside the lock (_install_built).
        make_wrapper = (
            wrapper_maker()
            if any(e.patch.runtime_check is not None and e.patch.direct for e in entries)
            else None
        )
        count = counter() if self.count_calls else None
        owned: dict[int, bool] = {}  # engine_owned() by id of a module: most share one
        with self.ledger.lock:
            modules_before = module_ids()
            for entry in entries:
                patch = entry.patch
                slot = (
                    None
                    if entry.deps or patch.after_import or (crowded and id(entry) in crowded)
                    else resolve_global(patch.path, patch.create)
                )
                if slot is None or entry.claimed or entry.record.status is not PENDING:
                    later.append(entry)
                    continue
                entry.claimed = me  # fresh from planning: no watch to stop
                owner, original, replacement = slot.owner, slot.raw, patch.replacement
                check = patch.runtime_check
                if not (
                    patch.direct
                    and type(owner) is types.ModuleType
                    and type(original) not in DESCRIPTORS
                    and not _engine_owned(owner, owned)  # refused by _build
                ):
                    to_build.append((entry, slot))
                    continue
                if check is None:
                    new = replacement
                    if count is not None and type(replacement) is _FUNCTION:
                        new = count(replacement, entry.record)
                elif type(replacement) is type(original) is type(check) is _FUNCTION:
                    # Making a wrapper of plain functions runs no user code.
                    assert make_wrapper is not None
                    new = make_wrapper(check, replacement, original, entry.record.counters)
                else:
                    to_build.append((entry, slot))
                    continue
                entry.replacement, entry.new_inner = replacement, new
                entry.original = None if original is ABSENT else original  # create=True
                entry.modules_before = modules_before
                self._commit(entry, slot, new, immediate)  # a plain module's setattr: no failure
                if entry.dependents or entry.alias_sites or may_be_lazy(new):
                    follow_up.append(entry)
        for entry in follow_up:
            self._after_install(entry, entry.slot, entry.installed, True)  # type: ignore[arg-type]
        self._install_built(to_build, immediate)
        for entry in later:
            self.advance(entry)

    def _install_built(self, ready: list[tuple[Entry, Slot]], immediate: bool) -> None:
        """Build claimed entries outside the lock; put them in and record them under one."""
        if not ready:
            return
        self._snapshot = None
        built: list[Any] = []
        failure: PatchError | None = None
        for entry, slot in ready:
            try:
                built.append(self._build(entry, slot))
            except PatchError as exc:  # strict: raised once the others are recorded
                built.append(_NOT_INSTALLED)
                failure = failure or exc
        with self.ledger.lock:
            committed = [
                self._commit(entry, slot, raw, immediate)
                for (entry, slot), raw in zip(ready, built, strict=True)
            ]
        for (entry, slot), raw, done in zip(ready, built, committed, strict=True):
            if isinstance(done, Exception):  # the slot refused it
                failure = failure or self._failed(entry, slot, done)
            else:
                self._after_install(entry, slot, raw, done)
        if failure is not None:
            raise failure

    def _install(self, entry: Entry, slot: Slot) -> None:
        with self.ledger.lock:
            if not self._claim(entry):
                return
        self._snapshot = None
        raw = self._build(entry, slot)
        immediate = self.applying_thread == threading.get_ident()
        with self.ledger.lock:
            done = self._commit(entry, slot, raw, immediate)
        if isinstance(done, Exception):  # the slot refused it
            error = self._failed(entry, slot, done)
            if error is not None:
                raise error from None
            return
        self._after_install(entry, slot, raw, done)

    def _claim(self, entry: Entry) -> bool:
        """Under the lock: make ``entry`` this thread's to install (False: someone else's)."""
        if entry.claimed or entry.record.status is not PENDING:
            return False
        entry.claimed = threading.get_ident()
        unwatch_all(entry)
        return True

    def _build(self, entry: Entry, slot: Slot) -> Any:
        """Run the precheck and build the replacement; return what is to go in the slot.

        A skip or a failure ends the entry and returns _NOT_INSTALLED; in strict mode a
        failure raises PatchError (after the entry is ended). The commit puts it in.
        """
        patch = entry.patch
        try:
            if engine_owned(slot.owner):
                from .engine_targets import refuse_slot

                refuse_slot(slot, patch.target)
            original, replacement, new_inner, new_raw = replacement_for(
                patch, slot.raw, slot.kind == "class", entry.record, self.count_calls
            )
            entry.original, entry.replacement, entry.new_inner = original, replacement, new_inner
            snapshot = self._snapshot
            if snapshot is None or snapshot[0] != len(sys.modules):
                snapshot = self._snapshot = (len(sys.modules), module_ids())
            modules_before = snapshot[1]
        except Skip as skip:
            with self.ledger.lock:
                self.finish(entry, SKIPPED, str(skip))
            return _NOT_INSTALLED
        except Exception as exc:
            error = self._failed(entry, slot, exc)
            if error is not None:
                # Not chained: the message names the place the cause was raised, and
                # the user's traceback stays their import line and this message.
                raise error from None
            return _NOT_INSTALLED
        entry.modules_before = modules_before
        return new_raw

    def _failed(self, entry: Entry, slot: Slot, exc: Exception) -> PatchError | None:
        """End ``entry`` as failed because of ``exc``; in strict mode, the error to raise."""
        reason = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
        with self.ledger.lock:
            self.finish(entry, FAILED, f"{reason} [{who(entry)}]")
        if not self._strict():
            return None
        importing = in_import_callback()
        if importing:
            with self.ledger.lock:
                self._failed_in_import.append((entry, slot.module))
        self.advance_dependents(entry)
        from .strict import strict_failure

        return strict_failure(
            entry.record, reason, module=slot.module if importing else None, cause=exc
        )

    def _commit(self, entry: Entry, slot: Slot, new_raw: Any, immediate: bool) -> bool | Exception:
        """Under the lock: put ``new_raw`` in the slot and record it, as one step.

        False if revert() ran meanwhile (nothing is put in); the exception if the slot
        refused it (a read-only attribute). ``immediate``: installed by apply() itself,
        on a module imported before it.
        """
        record = entry.record
        if new_raw is _NOT_INSTALLED or record.status is not PENDING:
            return False
        try:
            slot.install(new_raw)
        except Exception as exc:
            return exc
        if entry.slot is None:  # the first installation (a later one is a with_imports swap)
            entry.slot, entry.installed, entry.installed_inner = slot, new_raw, entry.new_inner
            push_layer(entry)
        else:
            entry.installed_now(slot, new_raw, entry.new_inner, entry.modules_before)
        self.log[entry] = None
        if immediate:
            self.stale_candidates.append(entry)
        record.status, record.reason = APPLIED, None
        return True

    def _after_install(self, entry: Entry, slot: Slot, new_raw: Any, committed: bool) -> None:
        if committed:
            if may_be_lazy(entry.new_inner):
                from .with_imports import install_when_resolved

                install_when_resolved(entry, self.ledger.lock)
            if entry.alias_sites:
                from .aliases import advance_alias

                for alias in entry.alias_sites:
                    advance_alias(self, entry, alias)
        elif new_raw is not _NOT_INSTALLED:  # revert() ran while it was being built
            entry.record.set(REVERTED, "reverted while it was being installed")
            return
        if entry.dependents:
            self.advance_dependents(entry)


def _engine_owned(module: types.ModuleType, answers: dict[int, bool]) -> bool:
    """engine_owned(module), asked once per module of a batch (the batch keeps it alive)."""
    answer = answers.get(id(module))
    if answer is None:
        answer = answers[id(module)] = engine_owned(module)
    return answer
