"""Imports under way: whose module bodies still run, who runs their callbacks, waiting them out.

importlib marks a module initialized only after its loader returns, that is after
the hub's post-import callbacks; for the thread running them, though, its body has
run (:func:`initializing`). Which thread delivers which module's callbacks is kept
in ``delivering``; a ``fork()`` child reads the table too (``_engine.fork``): it
finishes the imports whose callbacks threads it does not have were running, rather
than leave them waiting for ever.

The installer and the hub meet other threads' imports here (docs/core.md, "Import
races"): an import another thread began before a module was watched does not go
through the hub's loader, so whoever watches it waits that import out and looks
again (:func:`loaded_after_import`); a thread running import callbacks must not wait,
so a thread of its own does (:func:`after_import_ends`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from .._model.errors import PatchError


__all__ = [
    "after_import_ends",
    "callbacks",
    "delivering",
    "forget_delivered",
    "import_in_progress",
    "import_locks",
    "in_import_callback",
    "initializing",
    "loaded_after_import",
    "wait_for_import",
]

#: Module name -> (ident of the thread running its post-import callbacks, the module,
#: the callbacks not yet ended, last first). An entry stays after the callbacks, until
#: importlib has ended that import (forget_delivered), so that a fork() child in
#: between finishes it rather than running the module's body again.
delivering: dict[str, tuple[int, types.ModuleType, list[Callable[[types.ModuleType], Any]]]] = {}

#: Per thread, ``depth``: how many post-import callback runs (the hub's notify) it is inside.
callbacks = threading.local()


def in_import_callback() -> bool:
    """True while this thread runs post-import callbacks, i.e. inside an import.

    Such a thread holds importlib's lock on the module just imported, so it must never
    wait for another module's lock: that could make importlib's deadlock detection
    fail an unrelated import in another thread.
    """
    return getattr(callbacks, "depth", 0) > 0


def forget_delivered(me: int) -> None:
    """Drop this thread's entries of imports that importlib has ended."""
    for name, (thread, module, waiting) in list(delivering.items()):
        if thread == me and not waiting and not _initializing(module):
            delivering.pop(name, None)


def _initializing(module: Any) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def initializing(module: types.ModuleType | None) -> bool:
    """Whether ``module`` is still running its body (as this thread sees it)."""
    if not _initializing(module):
        return False
    # Inside the post-import callbacks of this module the body is done, though
    # importlib will mark it so only when they return (else a patch would wait for
    # the end of an import that has already ended, for ever).
    running = delivering.get(getattr(module.__spec__, "name", ""))  # type: ignore[union-attr]
    return running is None or running[0] != threading.get_ident() or running[1] is not module


def import_locks() -> dict[str, Any] | None:
    """importlib's table of the module locks held now, by module name (None: this Python has none).

    A module is in it from the start of its import until its body has run: far fewer
    names than sys.modules, and cheaper than asking each module's spec.
    """
    from importlib import _bootstrap

    locks = getattr(_bootstrap, "_module_locks", None)
    return locks if isinstance(locks, dict) else None


def import_in_progress(name: str) -> bool:
    locks = import_locks()
    return name in sys.modules or (locks is not None and name in locks)


def wait_for_import(name: str) -> None:
    """Block until another thread's import of ``name`` is finished (no-op in this thread's).

    importlib holds a per-module lock from before it looks for the module's spec
    until the body has run; taking that lock therefore waits out an import that
    began before the hub was watching the name. Re-entrant for the importing thread.
    """
    if in_import_callback():
        return
    from importlib import _bootstrap

    manager = getattr(_bootstrap, "_ModuleLockManager", None)
    if manager is None:  # pragma: no cover - a Python without the private lock API
        return
    try:
        with manager(name):
            pass
    except Exception:  # importlib's _DeadlockError: the other thread waits for us
        return


def loaded_after_import(name: str) -> types.ModuleType | None:
    """Wait out an import of ``name`` under way in another thread, if any; then the
    module if it is loaded and has run its body, else None (never imported, or the
    import failed). Not from a thread running import callbacks: it does not wait there."""
    if import_in_progress(name):
        wait_for_import(name)
    module = sys.modules.get(name)
    return module if module is not None and not initializing(module) else None


def after_import_ends(name: str, callback: Callable[[types.ModuleType], None]) -> bool:
    """From a thread that runs import callbacks: ``callback(module)`` once another
    thread's import of ``name``, under way now, has ended; False if none is under way.

    That thread must not wait for the import itself (:func:`in_import_callback`), and a
    watch it adds may never be called: an import whose spec was found before the hub
    watched ``name`` does not go through the hub's loader, and one whose callbacks are
    running took its watches already. So a thread of its own waits, then calls back --
    rarely: only when two threads meet in the imports of one patch's modules.
    """
    loaded = sys.modules.get(name)
    locks = import_locks()
    if not (name in (locks or ()) or (loaded is not None and initializing(loaded))):
        return False

    def when_ended() -> None:
        module = loaded_after_import(name)
        if module is not None:  # else it failed: watches stay
            with contextlib.suppress(PatchError):  # strict mode: no import is left to fail
                callback(module)

    threading.Thread(target=when_ended, name=f"ascend-patch: after {name}", daemon=True).start()
    return True
