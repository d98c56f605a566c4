"""An entry's watches on the import hub: wait for a module, then move the entry on.

The installer waits this way for a patch's target module, and ``_install.aliases``
for an alias's. A watch fires once the hub's loader has run the module. Two kinds of
import escape that loader (docs/core.md, "Import races"), so a watch alone can wait
for ever: an import another thread began before the watch existed, and one whose
callbacks were already being delivered. :func:`watch` therefore also follows an
import under way when it is called from import callbacks (which may not wait), and
:func:`look_again` waits one out everywhere else.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

from ..imports._hub import hub
from ..imports._under_way import after_import_ends
from ..imports._under_way import in_import_callback
from ..imports._under_way import loaded_after_import
from .entries import Entry
from .entries import Ledger


__all__ = ["look_again", "unwatch", "unwatch_all", "watch"]

#: What a watch calls once its module is there: move the entry on.
Then = Callable[[], None]


def watch(entry: Entry, key: str, module: str, ledger: Ledger, then: Then) -> None:
    """Under the ledger's lock: call ``then()`` once ``module`` has been imported (one watch per ``key``).

    Inside import callbacks, another thread's import of ``module`` under way now may
    never call the watch, and this thread may not wait for it: a thread of the hub's
    own does, and calls ``then()`` after it (twice is harmless: an entry is claimed once).
    """
    fired = functools.partial(_fired, entry, key, ledger, then)
    if entry.watching is None or key not in entry.watching:
        entry.watch(key, hub.watch(module, fired))
    if in_import_callback():
        after_import_ends(module, fired)


def look_again(entry: Entry, key: str, module: str, ledger: Ledger, then: Then) -> None:
    """After :func:`watch`: another thread may have started importing ``module`` between
    the look that did not find it and the watch -- or even finished it: its loader was
    then not the hub's, so no callback will come. Wait for an import under way to end
    and, if the module is there, end the watch and call ``then()``."""
    if loaded_after_import(module) is not None:
        _fired(entry, key, ledger, then)


def _fired(
    entry: Entry, key: str, ledger: Ledger, then: Then, module: types.ModuleType | None = None
) -> None:
    with ledger.lock:
        handle = entry.watching.pop(key, None) if entry.watching else None
    if handle is not None:
        hub.unwatch(handle)
    then()


def unwatch(entry: Entry, ledger: Ledger, prefix: str) -> None:
    """End ``entry``'s watches whose key starts with ``prefix``."""
    with ledger.lock:
        watching = entry.watching or {}
        handles = [watching.pop(k) for k in [k for k in watching if k.startswith(prefix)]]
    for handle in handles:
        hub.unwatch(handle)


def unwatch_all(entry: Entry) -> None:
    """Under the entry's ledger lock: end every watch of ``entry``."""
    if entry.watching:
        for handle in entry.stop_watching():
            hub.unwatch(handle)
