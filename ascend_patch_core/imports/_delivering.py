"""Which post-import callbacks are running, in which thread: ``delivering``.

importlib marks a module initialized only after its loader returns, that is after
the hub's post-import callbacks; for the thread running them, though, its body has
run (:func:`initializing`). A ``fork()`` child reads the table too (``_engine.fork``): it
finishes the imports whose callbacks threads it does not have were running, rather
than leave them waiting for ever.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any


__all__ = ["delivering", "forget_delivered", "initializing"]

#: Module name -> (ident of the thread running its post-import callbacks, the module,
#: the callbacks not yet ended, last first). An entry stays after the callbacks, until
#: importlib has ended that import (forget_delivered), so that a fork() child in
#: between finishes it rather than running the module's body again.
delivering: dict[str, tuple[int, types.ModuleType, list[Callable[[types.ModuleType], Any]]]] = {}


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
