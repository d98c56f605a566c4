"""Every Patcher alive, and the fork() handlers that keep a child's engine usable.

The handlers are registered with the first Patcher, once per process, and load
``_engine.fork`` (where they are explained) at the first fork(): a process that never forks
never loads it, and creating a Patcher costs one dictionary entry.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    # The protocol of what the handlers use (the class itself would make a circle).
    from .fork import Patcher


__all__ = ["live", "watch_forks"]

#: Every Patcher alive, by creation order: ``_engine.fork`` takes their locks around a fork()
#: (in this order) and makes their state whole in the child.
live: weakref.WeakValueDictionary[int, Patcher] = weakref.WeakValueDictionary()
_serial = itertools.count()
_registered = False


def watch_forks(patcher: Patcher) -> None:
    """Register ``patcher``; the first one registers the fork handlers."""
    global _registered
    live[next(_serial)] = patcher
    if not _registered and hasattr(os, "register_at_fork"):
        _registered = True
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )


def _before_fork() -> None:
    from . import fork as _fork

    _fork.before([live[key] for key in sorted(live.keys())])


def _after_fork_in_parent() -> None:
    fork = sys.modules.get(f"{__package__}.fork")
    if fork is not None:
        fork.after_in_parent()


def _after_fork_in_child() -> None:
    fork = sys.modules.get(f"{__package__}.fork")
    if fork is not None:
        fork.after_in_child()
