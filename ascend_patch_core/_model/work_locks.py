"""Locks held around work that may import, which a fork() child makes new.

Such a lock may be held by another thread at the instant of a fork(); the child does not
have that thread, so it would wait for it forever. What these locks guard is set once, at
the end of the work, so a new lock is a consistent one (``_engine.fork`` renews them). The
modules that hold them register them here, below every layer, instead of ``_engine.fork`` looking
them up by name in the layers above it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any


__all__ = ["every_work_lock", "work_lock"]

#: Every such lock alive (lock objects take weak references).
every_work_lock: weakref.WeakSet[Any] = weakref.WeakSet()


def work_lock(*, reentrant: bool = True) -> Any:
    """A new lock (an RLock unless ``reentrant`` is false), renewed in fork() children."""
    lock = threading.RLock() if reentrant else threading.Lock()
    every_work_lock.add(lock)
    return lock
