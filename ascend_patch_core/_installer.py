"""The lazy installer: watch a patch's module, install it when it exists, then its aliases.

Life of an entry (its record's status, plus ``claimed`` while a thread installs it)::

    pending --(dependencies applied, target module imported)--> claimed --> applied
       |                                                           |
       +--> skipped (disabled, requires, precheck, target missing) +--> failed (an exception)

Thread safety: transitions happen under the ledger's lock, held only for
bookkeeping; no import starts and no user code (prechecks, wrappers, factories)
runs while it is held, so an import hook firing in another thread can never
deadlock against ``apply()``. An entry is claimed under the lock, so it is
installed exactly once however many threads race to import its module.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from ._entries import Entry
from ._entries import Site
from ._entries import Skip
from ._entries import who
from ._errors import PatchError
from ._errors import SkipPatch
from ._hub import hub
from ._hub import import_in_progress
from ._hub import initializing
from ._hub import wait_for_import
from ._ledger import Ledger
from ._replacement import build_replacement
from ._report import Status
from ._stale import module_ids
from ._target import ABSENT
from ._target import Missing
from ._target import Slot
from ._target import TargetPath
from ._target import Waiting
from ._target import adapt_to_descriptor
from ._target import candidate_modules
from ._target import initializing_prefixes
from ._target import inner_callable
from ._target import resolve


__all__ = ["Installer"]


class Installer:
    """Installs one patcher's entries as their modules appear; records every site it fills."""

    def __init__(self, ledger: Ledger, strict: Callable[[], bool]) -> None:
        self.ledger = ledger
        self._strict = strict
        #: Sites filled, in order (revert() replays it backwards).
        self.log: list[Site] = []
        #: The thread running apply(): entries it installs were imported before apply().
        self.applying_thread: int | None = None
        #: Entries installed during apply() whose stale references are yet to be looked for.
        self.stale_candidates: list[Entry] = []

    # ------------------------------------------------------------------ advancing

    def advance(self, entry: Entry) -> None:
        """Move an entry as far as it can go now. Safe to call from any thread, any time."""
        lock = self.ledger.lock
        with lock:
            if not entry.open:
                return
            for dep in entry.deps:
                if dep.status in (Status.SKIPPED, Status.FAILED, Status.REVERTED):
                    self.finish(
                        entry,
                        Status.SKIPPED,
                        f"needs {dep.patch.name!r}, which is {dep.status.value}",
                    )
                    return
            waiting_dep = next((d for d in entry.deps if d.status is not Status.APPLIED), None)
            if waiting_dep is not None:
                entry.record.set(Status.PENDING, f"waiting for {waiting_dep.patch.name!r}")
                return
            missing_module = next(
                (m for m in entry.patch.after_import if m not in sys.modules), None
            )
            if missing_module is not None:
                self._wait_for(entry, missing_module)
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

    def _wait_for_target(self, entry: Entry, found: Waiting) -> None:
        with self.ledger.lock:
            if entry.open:
                # Which prefix is the module cannot be known without importing, so
                # every candidate is watched: the patch lands as soon as the
                # defining module has run, before a package __init__ re-exports it.
                for candidate in candidate_modules(entry.patch.path, found.module):
                    self._wait_for(entry, candidate)
                entry.record.set(Status.PENDING, f"waiting for import of {found.module}")
        # Another thread may have started importing the module between resolve() and
        # watch(): its loader is then not wrapped, so no callback will come. Wait for
        # that import to finish and look again.
        if import_in_progress(found.module):
            wait_for_import(found.module)
            module = sys.modules.get(found.module)
            if module is not None and not initializing(module):
                self._on_import(entry, found.module)

    def _target_missing(self, entry: Entry, found: Missing) -> None:
        unfinished = initializing_prefixes(entry.patch.path)
        with self.ledger.lock:
            if not entry.open:
                return
            if unfinished:
                # A module on the path is still running its body (in another thread):
                # the name may yet be defined. Look again when it is done.
                for name in unfinished:
                    self._wait_for(entry, name)
                return
            reason = f"target not found: {found.reason}"
            strict = self._strict()
            self.finish(entry, Status.FAILED if strict else Status.SKIPPED, reason)
        self.advance_dependents(entry)
        if strict:
            raise PatchError(f"ascend-patch (strict): could not apply {who(entry)}: {reason}")

    def _wait_for(self, entry: Entry, module: str) -> None:
        entry.record.set(Status.PENDING, f"waiting for import of {module}")
        if module not in entry.watching:
            entry.watching[module] = hub.watch(
                module, functools.partial(self._imported, entry, module)
            )

    def _imported(self, entry: Entry, name: str, module: types.ModuleType) -> None:
        self._on_import(entry, name)

    def _on_import(self, entry: Entry, module: str) -> None:
        with self.ledger.lock:
            handle = entry.watching.pop(module, None)
        if handle is not None:
            hub.unwatch(handle)
        self.advance(entry)

    def advance_dependents(self, entry: Entry) -> None:
        for dependent in list(entry.dependents):
            self.advance(dependent)

    def finish(self, entry: Entry, status: Status, reason: str | None) -> None:
        """End an entry's life with ``status`` (under the lock) and stop its watches."""
        entry.record.set(status, reason)
        entry.claimed = True
        for handle in entry.watching.values():
            hub.unwatch(handle)
        entry.watching.clear()

    # ------------------------------------------------------------------ installing

    def _install(self, entry: Entry, slot: Slot) -> None:
        with self.ledger.lock:
            if not entry.open:
                return
            entry.claimed = True
            for handle in entry.watching.values():
                hub.unwatch(handle)
            entry.watching.clear()
        patch = entry.patch
        try:
            original_raw = slot.raw
            original = inner_callable(original_raw)
            if original is ABSENT:  # a slot that create=True will make
                original = None
            if patch.precheck is not None:
                _run_precheck(patch, original)
            replacement, new_inner = build_replacement(patch, original, entry.record.counters)
            new_raw = (
                adapt_to_descriptor(original_raw, new_inner) if slot.kind == "class" else new_inner
            )
            entry.original, entry.replacement, entry.new_inner = original, replacement, new_inner
            modules_before = module_ids()
            slot.install(new_raw)
            with self.ledger.lock:
                cancelled = entry.status is not Status.PENDING  # revert() ran meanwhile
                if not cancelled:
                    entry.primary.installed_now(slot, new_raw, new_inner, modules_before)
                    self.log.append(entry.primary)
                    entry.immediate = self.applying_thread == threading.get_ident()
                    if entry.immediate:
                        self.stale_candidates.append(entry)
                    entry.record.set(Status.APPLIED, None)
            if cancelled:
                if slot.current() is new_raw:
                    slot.restore()
                entry.record.set(Status.REVERTED, "reverted while it was being installed")
                return
            self._watch_with_imports(entry.primary)
        except Skip as skip:
            with self.ledger.lock:
                self.finish(entry, Status.SKIPPED, str(skip))
        except Exception as exc:
            reason = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
            with self.ledger.lock:
                self.finish(entry, Status.FAILED, f"{reason} [{who(entry)}]")
            if self._strict():
                self.advance_dependents(entry)
                raise PatchError(
                    f"ascend-patch (strict): could not apply {who(entry)}: {reason}"
                ) from exc
        if entry.status is Status.APPLIED:
            for alias in entry.alias_sites:
                self._advance_alias(entry, alias)
        self.advance_dependents(entry)

    def _watch_with_imports(self, site: Site) -> None:
        """After a with_imports trampoline's first call, install the function itself."""
        inner = inner_callable(site.installed)
        if getattr(inner, "__ascend_patch_with_imports__", None) is None:
            return  # the common case: no with_imports trampoline, nothing to import
        from ._with_imports import lazy_imports_of

        state = lazy_imports_of(inner)
        if state is None:
            return
        trampoline_raw = site.installed

        def swap() -> None:
            with self.ledger.lock:
                slot = site.slot
                if slot is None or site.installed is not trampoline_raw:
                    return
                if slot.current() is not trampoline_raw:
                    return
                new_raw = (
                    adapt_to_descriptor(trampoline_raw, state.func)
                    if isinstance(trampoline_raw, (staticmethod, classmethod))
                    else state.func
                )
                modules_before = module_ids()
                slot.install(new_raw)
                site.installed_now(slot, new_raw, state.func, modules_before)

        state.on_resolved.append(swap)

    # ------------------------------------------------------------------ aliases

    def _advance_alias(self, entry: Entry, site: Site) -> None:
        path = site.path.text
        if site.slot is not None or entry.status is not Status.APPLIED:
            return
        settle_initializing(site.path)
        found = resolve(site.path, create=entry.patch.create)
        aliases = entry.record.aliases
        if isinstance(found, Waiting):
            aliases[path] = f"pending: waiting for import of {found.module}"
            with self.ledger.lock:
                if entry.status is not Status.APPLIED:
                    return
                for candidate in candidate_modules(site.path, found.module):
                    key = f"alias:{path}:{candidate}"
                    if key not in entry.watching:
                        callback = functools.partial(self._alias_imported, entry, site, key)
                        entry.watching[key] = hub.watch(candidate, callback)
            return
        self._stop_alias_watches(entry, path)
        if isinstance(found, Missing):
            aliases[path] = f"not found: {found.reason}"
            entry.record.warnings.append(f"alias {path} not found: {found.reason}")
            return
        primary = entry.primary.slot
        if primary is not None and found.owner is primary.owner and found.key == primary.key:
            aliases[path] = "same slot as the target"
            return
        if found.raw is entry.primary.installed or inner_callable(found.raw) is entry.new_inner:
            # Imported from the patched target after installation (a re-export): it
            # already holds the replacement, and revert() gives it the original back.
            aliases[path] = "applied"
            return
        try:
            original = inner_callable(found.raw)
            if original is ABSENT:  # create=True: the alias slot is made too
                original = None
            if original is entry.original:
                new_inner = entry.new_inner
            else:
                new_inner = build_replacement(entry.patch, original, entry.record.counters)[1]
            new_raw = (
                adapt_to_descriptor(found.raw, new_inner) if found.kind == "class" else new_inner
            )
            modules_before = module_ids()
            found.install(new_raw)
        except Exception as exc:
            aliases[path] = f"failed: {exc}"
            entry.record.warnings.append(f"alias {path} failed: {exc}")
            return
        with self.ledger.lock:
            cancelled = entry.status is not Status.APPLIED  # revert() ran meanwhile
            if not cancelled:
                site.installed_now(found, new_raw, new_inner, modules_before)
                self.log.append(site)
        if cancelled:
            if found.current() is new_raw:
                found.restore()
            return
        aliases[path] = "applied"

    def _alias_imported(self, entry: Entry, site: Site, key: str, module: types.ModuleType) -> None:
        with self.ledger.lock:
            handle = entry.watching.pop(key, None)
        if handle is not None:
            hub.unwatch(handle)
        self._advance_alias(entry, site)

    def _stop_alias_watches(self, entry: Entry, path: str) -> None:
        prefix = f"alias:{path}:"
        with self.ledger.lock:
            keys = [k for k in entry.watching if k.startswith(prefix)]
            handles = [entry.watching.pop(k) for k in keys]
        for handle in handles:
            hub.unwatch(handle)


def _run_precheck(patch: Any, original: Any) -> None:
    try:
        ok = patch.call_precheck(original)
    except SkipPatch as skip:
        raise Skip(str(skip) or "precheck skipped the patch") from skip
    except Exception as exc:
        raise PatchError(f"precheck raised {type(exc).__name__}: {exc}") from exc
    if not ok:
        raise Skip("precheck returned False")


def settle_initializing(path: TargetPath) -> None:
    """Wait for modules on the path that another thread is still importing."""
    name = ""
    for segment in path.segments[:-1]:
        name = f"{name}.{segment.name}" if name else segment.name
        module = sys.modules.get(name)
        if module is None:
            return
        if initializing(module):
            # Blocks until the other thread's import finishes; returns at once if
            # this thread is the one importing (a circular import).
            wait_for_import(name)
