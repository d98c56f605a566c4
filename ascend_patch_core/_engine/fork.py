"""fork() from any thread leaves the child an engine it can use.

A forked child has one thread, the one that called fork(). Whatever another thread
held at that instant -- a lock, a step half done -- stays held or half done in the
child for ever, and a child that waits for it hangs: DataLoader workers forked while
a thread applied, reverted or imported patched modules did (27 of 50 in one test).
So, around every fork() of a process that has other threads (the Patcher registers
these handlers once, and loads this module at the first fork):

* **before**: wait, for a bounded time, for the apply() calls under way in other
  threads (so that a child gets their patches), then take the engine's state locks
  in a fixed order -- every patcher's ledger lock by creation order, the import-rule
  parent server's, the metadata cache's, the import hub's: the order in which the
  engine itself nests them, so taking them cannot deadlock. Every change a patcher
  makes to a slot is made with its record under its ledger's lock, revert() and
  disable() hold it throughout: the child sees each patch whole or not at all, and
  a revert done or not begun.
* **after, in the parent**: let go of them.
* **after, in the child**: let go of them; make new the locks that are held around
  work that may import (with_imports resolution, patches applied alone), unless the
  forking thread holds one; release importlib's module locks held by threads that
  are gone -- a module whose body such a thread was running is dropped from
  ``sys.modules``, as when an import fails, so the child imports it again instead of
  waiting for ever -- and finish what those threads had begun in the engine: the
  post-import callbacks of a module whose body had run (then its import), entries
  they had claimed, an apply() the wait gave up on (taken back: revert()).

Waits that cannot end in the child therefore do not exist there: nothing is left
held by a thread the child does not have.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

from .._model.report import PENDING


if TYPE_CHECKING:
    from .._install.entries import Ledger
    from .._install.installer import Installer
    from .module_hooks import HookRunner


class Patcher(Protocol):
    """What the fork handlers use of a Patcher (``_engine.patcher.Patcher``).

    A protocol, not the class: the Patcher loads ``fork_watch``, which loads this
    module, so naming the class here would make a circle. mypy checks the Patcher
    against it where ``watch_forks()`` is handed one.
    """

    _ledger: Ledger
    _installer: Installer
    _hooks: HookRunner | None
    _applied: bool
    _forking: bool
    _apply_done: threading.Condition

    def revert(self) -> object: ...


__all__ = ["APPLY_WAIT_S", "LOCK_WAIT_S", "after_in_child", "after_in_parent", "before"]

#: How long fork() waits for apply() calls under way in other threads, all together.
#: apply() imports no target library, so it is short; one that takes longer (blocked,
#: say, on an import the forking thread is in) is taken back in the child instead.
APPLY_WAIT_S = 10.0

#: How long it waits for each state lock. They are held for bookkeeping only; one held
#: longer is a defect, and the fork goes on (the child makes that lock new).
LOCK_WAIT_S = 10.0

#: What before() did, for the after_* handler: (patchers, locks taken, locks not taken).
_pending: tuple[list[Patcher], list[Any], list[Any]] | None = None


# ------------------------------------------------------------------ in the parent


def before(patchers: list[Patcher]) -> None:
    global _pending
    _pending = None
    if len(sys._current_frames()) <= 1:
        return  # no other thread: nothing can be held or half done by one
    me = threading.get_ident()
    _close_gates(patchers)
    _wait_for_applies(patchers, me, time.monotonic() + APPLY_WAIT_S)
    taken, missed = _take([p._ledger.lock for p in patchers] + _other_state_locks())
    _pending = (patchers, taken, missed)


def after_in_parent() -> None:
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        _release(pending[1])
        _open_gates(pending[0])


def _close_gates(patchers: list[Patcher]) -> None:
    """No apply() starts from now until after the fork (it waits in apply())."""
    for patcher in patchers:
        lock = patcher._ledger.lock
        if lock.acquire(timeout=LOCK_WAIT_S):
            patcher._forking = True
            lock.release()


def _open_gates(patchers: list[Patcher]) -> None:
    for patcher in patchers:
        with patcher._ledger.lock:
            patcher._forking = False
            patcher._apply_done.notify_all()


def _wait_for_applies(patchers: list[Patcher], me: int, deadline: float) -> None:
    """Let apply() calls under way in other threads end, so that the child gets their
    patches rather than an apply() taken back -- unless one lasts beyond the deadline
    (blocked, say, on an import the forking thread is in). One lock at a time: an
    apply() may need another patcher's lock (its imports run their callbacks)."""
    for patcher in patchers:
        if not _applying_elsewhere(patcher, me):
            continue
        lock = patcher._ledger.lock
        if not lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            return
        try:
            # The wait lets go of the lock (the apply() needs it) and has it again after.
            while _applying_elsewhere(patcher, me) and time.monotonic() < deadline:
                patcher._apply_done.wait(deadline - time.monotonic())
        finally:
            lock.release()


def _other_state_locks() -> list[Any]:
    """The engine's other state locks, in the order in which it nests them (after a
    ledger's)."""
    from .._discovery.metadata import metadata
    from ..imports._hub import hub

    locks: list[Any] = []
    parents = sys.modules.get("ascend_patch_core.imports._rule_parents")
    if parents is not None:
        locks.append(parents._server.lock)
    locks.append(metadata._lock)
    locks.append(hub._lock)
    return locks


def _take(locks: list[Any]) -> tuple[list[Any], list[Any]]:
    taken: list[Any] = []
    missed: list[Any] = []
    for lock in locks:
        (taken if lock.acquire(timeout=LOCK_WAIT_S) else missed).append(lock)
    return taken, missed


def _release(locks: list[Any]) -> None:
    for lock in reversed(locks):
        lock.release()


def _applying_elsewhere(patcher: Patcher, me: int) -> bool:
    applying = patcher._installer.applying_thread
    return applying is not None and applying != me


# ------------------------------------------------------------------ in the child


def after_in_child() -> None:
    global _pending
    pending, _pending = _pending, None
    if pending is None:
        return
    patchers, taken, missed = pending
    me = threading.get_ident()
    for lock in missed:
        _make_new(lock)
    _release(taken)
    _renew_work_locks()
    unfinished = _free_import_locks(me)
    rollback = [patcher for patcher in patchers if _hand_back(patcher, me)]
    for patcher in rollback:
        _quietly(patcher.revert, "taking back an apply() interrupted by fork()")
    for name, module, waiting in unfinished:  # innermost import first
        while waiting:
            callback = waiting.pop()
            _quietly(functools.partial(callback, module), f"after importing {name}")
    for patcher in patchers:
        if patcher not in rollback:
            _resume(patcher)


def _make_new(lock: Any) -> None:
    """A lock as new, unless this thread holds it (its own release comes later)."""
    owned = getattr(lock, "_is_owned", None)
    if owned is not None and owned():
        return
    lock._at_fork_reinit()


def _renew_work_locks() -> None:
    """The locks held around work that may import (see _work_locks)."""
    from .._model.work_locks import every_work_lock

    for lock in list(every_work_lock):
        _make_new(lock)


#: importlib's private module locks have the shape _reset() knows (tested on each).
_IMPORT_LOCKS_KNOWN = (3, 10) <= sys.version_info[:2] <= (3, 13)


def _free_import_locks(me: int) -> list[tuple[str, Any, list[Callable[[Any], None]]]]:
    """Release importlib's module locks that threads now gone held; return the imports
    whose post-import callbacks they were running (body done), innermost first."""
    from ..imports._under_way import delivering

    unfinished: list[tuple[str, Any, list[Callable[[Any], None]]]] = []
    for name in reversed([name for name, entry in delivering.items() if entry[0] != me]):
        _, module, waiting = delivering.pop(name)
        # Kept until importlib ended that import: one it has ended is not ours to end.
        if _initializing(module) and sys.modules.get(name) is module:
            unfinished.append((name, module, waiting))
            _finish_import(name, module)
    if not _IMPORT_LOCKS_KNOWN:  # pragma: no cover - a Python this was not tested on
        return unfinished
    from importlib import _bootstrap

    finishing = {name for name, _, _ in unfinished}
    table = getattr(_bootstrap, "_module_locks", None)
    for name, ref in list(table.items()) if isinstance(table, dict) else ():
        lock = ref() if callable(ref) else None
        owner = getattr(lock, "owner", None)
        if lock is None or owner == me:
            continue
        if owner is not None and name not in finishing and _initializing(sys.modules.get(name)):
            # Its body was running in a thread that is gone: that import failed, and
            # the child imports the module again, as after any failed import.
            del sys.modules[name]
        _reset(lock)
    blocking: Any = getattr(_bootstrap, "_blocking_on", None)
    entries = getattr(blocking, "data", blocking)  # a dict, or 3.12's weak-value table
    if isinstance(entries, dict):
        for thread in [t for t in entries if t != me]:
            entries.pop(thread, None)
    return unfinished


def _initializing(module: Any) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _reset(lock: Any) -> None:
    """An importlib ``_ModuleLock`` as unowned, with no waiter (3.10-3.11: counts are
    ints; 3.12+: lists)."""
    try:
        lock.lock._at_fork_reinit()
        lock.wakeup._at_fork_reinit()
        lock.owner = None
        lock.count = [] if isinstance(lock.count, list) else 0
        lock.waiters = [] if isinstance(lock.waiters, list) else 0
    except AttributeError:  # pragma: no cover - a lock of another shape: left alone
        pass


def _finish_import(name: str, module: Any) -> None:
    """What importlib does after a loader returns: the module is initialized, and bound
    in its parent package."""
    spec = getattr(module, "__spec__", None)
    if spec is not None:
        spec._initializing = False
    parent, _, child = name.rpartition(".")
    package = sys.modules.get(parent) if parent else None
    if package is not None and vars(package).get(child) is not module:
        _quietly(lambda: setattr(package, child, module), f"binding {name} in {parent}")


def _hand_back(patcher: Patcher, me: int) -> bool:
    """Entries claimed by threads that are gone are open again; an apply() such a
    thread was running is over. True if the patcher is to be taken back (revert())."""
    ledger, installer = patcher._ledger, patcher._installer
    with ledger.lock:
        # Its waiters were the parent's threads: a new condition, and the gate open.
        patcher._apply_done = threading.Condition(ledger.lock)
        patcher._forking = False
        for entry in ledger.entries:
            claimed = entry.claimed
            if type(claimed) is int and claimed != me and entry.record.status is PENDING:
                entry.claimed = False
        if not _applying_elsewhere(patcher, me):
            return False
        installer.end_apply()
        if not patcher._applied:
            ledger.end_report()  # its plugins' records go with the next apply()
            return False
        return True


def _resume(patcher: Patcher) -> None:
    """Start what a thread that is gone had planned and not started, and the entries
    handed back: their modules may be imported already, so no import would start them."""
    ledger = patcher._ledger
    with ledger.lock:
        entries = [e for e in ledger.entries if e.open and not e.watching]
        hooks = [h for h in ledger.hooks if h.handle is None and h.record.status is PENDING]
        legacy = [s for s in ledger.legacy if s.handle is None and not s.done]
    for entry in entries:
        advance = functools.partial(patcher._installer.advance, entry)
        _quietly(advance, f"installing {entry.patch.name}")
    runner = patcher._hooks
    if runner is not None:
        for hook in hooks:
            _quietly(functools.partial(runner.start_hook, hook), f"starting {hook.hook.name}")
        for state in legacy:
            start = functools.partial(runner.start_legacy, state)
            _quietly(start, f"starting {state.patch.name}")


def _quietly(work: Callable[[], object], what: str) -> None:
    """Run ``work`` in the child's fork handler, where nothing may raise: a failure is a
    warning (a patch's own failure is in its record already)."""
    try:
        work()
    except Exception as exc:
        from .._model.errors import PatchError

        if not isinstance(exc, PatchError):
            warnings.warn(
                f"ascend-patch: after fork(), {what}: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
