"""Post-import hooks and meta-path cooperation, for code that extends the engine.

The engine keeps one finder on ``sys.meta_path`` (the import hub). Extensions --
the training utilities, the NPU emulator, a third-party tool -- use these functions
instead of installing finders of their own or reading the hub's internals, so that
every callback runs after the module's body, outside any lock, in one place:

* :func:`when_imported` -- once, now if the module is imported, else right after;
* :func:`on_import` -- once, after the module's *next* import;
* :func:`on_every_import` -- after every import of a module matching a pattern;
* :func:`cancel` -- undo one of the three (idempotent);
* :func:`is_initializing` -- whether a module is still running its body;
* :func:`add_finder` / :func:`remove_finder` -- put a finder of one's own behind the
  hub (so the engine's watches and import rules still see what it serves), and take
  it off without disturbing imports in other threads.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

from ._hub import hub
from ._hub import remove_finder as _remove_finder
from ._under_way import initializing


__all__ = [
    "add_finder",
    "cancel",
    "is_initializing",
    "on_every_import",
    "on_import",
    "remove_finder",
    "when_imported",
]

#: What the functions below call: ``callback(module)``.
ImportCallback = Callable[[types.ModuleType], None]


def when_imported(module: str, callback: ImportCallback) -> object:
    """Call ``callback(module)`` once: at once if ``module`` is imported, else after its import.

    Returns a handle for :func:`cancel`. An import another thread has begun is waited out.
    """
    return hub.when_imported(module, callback)


def on_import(module: str, callback: ImportCallback) -> object:
    """Call ``callback(module)`` once, right after ``module`` is next imported."""
    return hub.watch(module, callback)


def on_every_import(pattern: str, callback: ImportCallback) -> object:
    """Call ``callback(module)`` after every import of a module matching ``pattern``.

    ``pattern`` is an ``fnmatch`` pattern starting with a literal package name, e.g.
    ``"transformers.models.*"``.
    """
    return hub.watch_pattern(pattern, callback)


def cancel(handle: object) -> None:
    """Forget a callback registered by one of the functions above (idempotent)."""
    hub.unwatch(handle)  # type: ignore[arg-type]


def is_initializing(module: types.ModuleType | str | None) -> bool:
    """Whether ``module`` (an object or a name in ``sys.modules``) is still running its body."""
    if isinstance(module, str):
        module = sys.modules.get(module)
    return initializing(module)


def add_finder(finder: object) -> None:
    """Insert ``finder`` into ``sys.meta_path`` right behind the engine's hub (first without one).

    Behind, so that modules it serves still pass through the hub: patches and
    import rules on them apply as on any other module.
    """
    position = sys.meta_path.index(hub) + 1 if hub in sys.meta_path else 0
    sys.meta_path.insert(position, finder)  # type: ignore[arg-type]


def remove_finder(finder: object) -> None:
    """Take ``finder`` off ``sys.meta_path`` by binding a new list (CPython gh-130094)."""
    _remove_finder(finder)
