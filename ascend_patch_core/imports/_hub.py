"""The one ``sys.meta_path`` finder: post-import callbacks and modules served by rules.

Keyed by exact module names, so an import that no patch or rule names costs one
dict lookup (and one set lookup when pattern or subtree rules exist). The finder is
inserted when the first watch or rule is registered and removed when the last is
gone, so a fully reverted process has no trace of it.

Lessons kept from wrapt and ddtrace: callbacks run after the module body, outside
the hub's lock (wrapt#217); the real spec is found by asking the other finders on
``sys.meta_path`` directly, never by re-entering ``importlib.util.find_spec``
(dd-trace-py#17742); the real loader is put back on the module after execution so
``__loader__`` users such as importlib.resources see the original (wrapt#221).
"""

from __future__ import annotations

import fnmatch
import importlib.machinery
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from .._model.errors import PatchError
from ._under_way import callbacks
from ._under_way import delivering
from ._under_way import forget_delivered
from ._under_way import loaded_after_import


__all__ = ["ImportHub", "hub", "remove_finder"]

Callback = Callable[[types.ModuleType], None]
Callback2 = Callable[[str, types.ModuleType], None]


if TYPE_CHECKING:
    # The rule side of the hub is declared beside its loader, which the hub imports
    # (never the other way round: docs/core.md, no circles).
    from ._rule_loader import ServedModule


class _Watch:
    __slots__ = ("callback", "module")

    def __init__(self, module: str, callback: Callback) -> None:
        self.module = module
        self.callback = callback


class _PatternWatch:
    __slots__ = ("callback", "pattern", "root")

    def __init__(self, pattern: str, callback: Callback) -> None:
        self.pattern = pattern
        self.root = pattern.partition(".")[0]
        self.callback = callback


# The finder and loaders below do not derive from the importlib.abc classes at run
# time: the import system needs only their methods, and `import importlib.abc` pulls in
# importlib.resources, tempfile and shutil (~5 ms in a fresh interpreter).
if TYPE_CHECKING:
    from importlib.abc import Loader as _LoaderBase
else:
    _LoaderBase = object


class _NotifyingLoader(_LoaderBase):
    """Runs the real loader, then the hub's callbacks for the module."""

    def __init__(self, loader: Any, hub: ImportHub) -> None:
        self._loader = loader
        self._hub = hub

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        loader = self._loader
        spec = getattr(module, "__spec__", None)
        if hasattr(loader, "exec_module"):
            loader.exec_module(module)
        else:  # pragma: no cover - legacy PEP 302 loaders
            loader.load_module(module.__name__)
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = loader
        if spec is not None and spec.loader is self:
            spec.loader = loader
        name = module.__name__
        # A module may put another object in sys.modules while it runs (transformers'
        # _LazyModule does); importlib returns that object, so the callbacks see it too.
        try:
            self._hub.notify(name, sys.modules.get(name, module))
        except PatchError as failure:
            # Strict mode: the message says everything; the user's traceback is their
            # import line and this one, not the core's frames.
            raise failure.with_traceback(None) from None  # an ascend-patch strict failure

    def __getattr__(self, name: str) -> Any:
        # get_code, get_source, get_resource_reader, is_package ... stay the real loader's.
        return getattr(self._loader, name)


def _namespace_loader(fullname: str, path: Any) -> Any:
    from importlib import _bootstrap_external

    finder: Any = _bootstrap_external.PathFinder
    return _bootstrap_external._NamespaceLoader(fullname, path, finder._get_spec)


class ImportHub:
    """Process-wide registry of post-import callbacks and served modules."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._watches: dict[str, list[_Watch]] = {}
        self._patterns: list[_PatternWatch] = []
        self._served: dict[str, ServedModule] = {}
        self._served_trees: dict[str, ServedModule] = {}
        #: Root package names for which a subtree rule or pattern exists.
        self._roots: frozenset[str] = frozenset()
        #: Called with (name, module) when an import fails in its callbacks (strict
        #: mode): importlib then drops the module. Weak, so no patcher is kept alive.
        self._failure_listeners: list[weakref.WeakMethod[Callback2]] = []

    # -- registration -------------------------------------------------------------

    def watch(self, module: str, callback: Callback) -> _Watch:
        """Call ``callback(module)`` once, right after ``module`` is next imported."""
        handle = _Watch(module, callback)
        with self._lock:
            self._watches.setdefault(module, []).append(handle)
            self._ensure_installed()
        return handle

    def when_imported(self, module: str, callback: Callback) -> _Watch:
        """Call ``callback(module)`` once: now if ``module`` is imported, else after its import.

        Closes the race with an import that another thread began before the watch
        existed (its loader is not wrapped): such an import is waited out here.
        """
        handle = self.watch(module, callback)
        loaded = loaded_after_import(module)
        if loaded is not None:
            with self._lock:
                handles = self._watches.get(module)
                mine = handles is not None and handle in handles
            if mine:
                self.unwatch(handle)
                callback(loaded)
        return handle

    def watch_pattern(self, pattern: str, callback: Callback) -> _PatternWatch:
        """Call ``callback(module)`` after every import of a module matching ``pattern``."""
        if pattern.partition(".")[0] in ("", "*") or any(
            c in pattern.partition(".")[0] for c in "*?["
        ):
            raise ValueError(f"module pattern {pattern!r} must start with a literal package name")
        handle = _PatternWatch(pattern, callback)
        with self._lock:
            self._patterns.append(handle)
            self._recompute_roots()
            self._ensure_installed()
        return handle

    def when_import_fails(self, listener: Callback2) -> None:
        """Call the bound method ``listener(name, module)`` when a callback fails an import."""
        with self._lock:
            self._failure_listeners = [r for r in self._failure_listeners if r() is not None]
            self._failure_listeners.append(weakref.WeakMethod(listener))

    def unwatch(self, handle: _Watch | _PatternWatch) -> None:
        with self._lock:
            if isinstance(handle, _PatternWatch):
                if handle in self._patterns:
                    self._patterns.remove(handle)
                    self._recompute_roots()
            else:
                handles = self._watches.get(handle.module)
                if handles and handle in handles:
                    handles.remove(handle)
                    if not handles:
                        del self._watches[handle.module]
            self._maybe_uninstall()

    def serve(
        self, module: str, rule: ServedModule, *, subtree: bool = False
    ) -> ServedModule | None:
        """Serve imports of ``module`` (and, with ``subtree``, of its submodules) from ``rule``;
        return the rule that served it until now, if another did."""
        with self._lock:
            displaced = self._served.get(module)
            self._served[module] = rule
            if subtree:
                self._served_trees[module] = rule
                self._recompute_roots()
            self._ensure_installed()
        return displaced if displaced is not rule else None

    def unserve(self, module: str, rule: ServedModule) -> None:
        with self._lock:
            if self._served.get(module) is rule:
                del self._served[module]
            if self._served_trees.get(module) is rule:
                del self._served_trees[module]
                self._recompute_roots()
            self._maybe_uninstall()

    def serves(self, fullname: str) -> bool:
        return self._rule_for(fullname) is not None

    def matching_patterns(self, fullname: str) -> list[_PatternWatch]:
        return [p for p in self._patterns if fnmatch.fnmatchcase(fullname, p.pattern)]

    # -- the finder ---------------------------------------------------------------

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        rule = self._served.get(fullname)
        if rule is None and self._roots and fullname.partition(".")[0] in self._roots:
            rule = self._rule_for(fullname)
            watched = rule is None and (
                fullname in self._watches or bool(self.matching_patterns(fullname))
            )
        else:
            watched = rule is None and fullname in self._watches
        spec: importlib.machinery.ModuleSpec | None = None
        if rule is not None and rule.when_missing:
            # Served only in the absence of the real module: when the other finders
            # know one, it is imported (and watched as usual), and the rule says so.
            spec = self._find_real_spec(fullname, path, target)
            if spec is not None:
                rule.real_found(fullname, spec)
                rule = None
                watched = fullname in self._watches or bool(self.matching_patterns(fullname))
                if not watched:
                    return spec
        if rule is not None:
            from ._rule_loader import RuleLoader  # loaded when a rule first serves a module

            return importlib.machinery.ModuleSpec(
                fullname,
                RuleLoader(rule, self),
                origin=rule.origin(fullname),
                is_package=rule.is_package(fullname),
            )
        if not watched:
            return None
        if spec is None:
            spec = self._find_real_spec(fullname, path, target)
            if spec is None:
                return None
        if spec.loader is None and spec.submodule_search_locations is not None:
            # A namespace package: importlib would give it a NamespaceLoader later;
            # give it one now so the wrapper has something to run.
            spec.loader = _namespace_loader(fullname, spec.submodule_search_locations)
        if spec.loader is None:
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self)
        return spec

    def real_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """The spec the other finders give ``fullname`` (its parent package is imported)."""
        parent = sys.modules.get(fullname.rpartition(".")[0]) if "." in fullname else None
        path = getattr(parent, "__path__", None)
        return self._find_real_spec(fullname, path, None)

    def _find_real_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None,
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec  # type: ignore[no-any-return]
        return None

    def invalidate_caches(self) -> None:
        """Nothing is cached here; present for the finder protocol."""

    # -- notification -------------------------------------------------------------

    def notify(self, name: str, module: types.ModuleType) -> None:
        """Run the callbacks waiting for ``name``. Called after its body has run."""
        me = threading.get_ident()
        with self._lock:
            handles = self._watches.pop(name, [])
            patterns = self.matching_patterns(name) if self._patterns else []
            self._maybe_uninstall()
            waiting = [p.callback for p in reversed(patterns)]
            waiting += [h.callback for h in reversed(handles)]
            # Set under the lock that fork() takes, with the watches taken: a fork()
            # child finds every callback it must still run (_under_way, _engine.fork).
            delivering[name] = (me, module, waiting)
        errors: list[PatchError] = []
        depth = getattr(callbacks, "depth", 0)
        callbacks.depth = depth + 1
        try:
            while waiting:
                # Taken off the list once it has returned: one a fork() interrupts is
                # run again in the child (the engine's callbacks are idempotent: an entry
                # is claimed once, a hook visits a module once).
                callback = waiting[-1]
                try:
                    callback(module)
                except PatchError as exc:  # strict mode: surfaced to the importer
                    errors.append(exc)
                except Exception as exc:  # a core bug must not break the user's import
                    warnings.warn(
                        f"ascend-patch: internal error after importing {name}: {exc!r}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                finally:
                    waiting.pop()
        except BaseException:
            delivering.pop(name, None)  # the import fails: importlib drops the module
            raise
        finally:
            callbacks.depth = depth
        forget_delivered(me)  # this import's entry stays until importlib has ended it
        if errors:
            delivering.pop(name, None)
            # The import fails and importlib drops the module: what was installed on it
            # is gone with it, and those who installed it must say so.
            for ref in list(self._failure_listeners):
                listener = ref()
                if listener is not None:
                    listener(name, module)
            raise errors[0]

    # -- internals ----------------------------------------------------------------

    def _rule_for(self, fullname: str) -> ServedModule | None:
        rule = self._served.get(fullname)
        if rule is not None:
            return rule
        if not self._served_trees:
            return None
        name = fullname
        while "." in name:
            name = name.rpartition(".")[0]
            rule = self._served_trees.get(name)
            if rule is not None:
                return rule
        return None

    def _recompute_roots(self) -> None:
        roots = {name.partition(".")[0] for name in self._served_trees}
        roots.update(p.root for p in self._patterns)
        self._roots = frozenset(roots)

    def _ensure_installed(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def _maybe_uninstall(self) -> None:
        if not (self._watches or self._patterns or self._served):
            remove_finder(self)

    @property
    def installed(self) -> bool:
        return self in sys.meta_path

    def __repr__(self) -> str:
        return (
            f"<ascend_patch ImportHub watches={sum(map(len, self._watches.values()))}"
            f" patterns={len(self._patterns)} served={len(self._served)}>"
        )


def remove_finder(finder: object) -> None:
    """Take ``finder`` off ``sys.meta_path`` without disturbing imports in other threads.

    importlib walks the live ``sys.meta_path`` list while it looks for a module;
    removing an entry in place shifts the rest left, so a thread in the middle of
    that walk skips the finder after the removed one -- usually the PathFinder --
    and its import fails with ModuleNotFoundError (CPython gh-130094, fixed only in
    recent releases by walking a copy). A new list is bound instead: a walk in
    progress keeps the old one, unchanged. (Inserting in place is harmless: a walk
    sees one finder twice.)
    """
    current = sys.meta_path
    snapshot = list(current)
    if all(f is not finder for f in snapshot):
        return
    sys.meta_path = [f for f in snapshot if f is not finder]
    if len(current) != len(snapshot) or any(
        a is not b for a, b in zip(current, snapshot, strict=False)
    ):
        # Another thread changed the old list between the copy and the rebinding (a
        # few bytecodes): keep its change rather than lose it. A change made to the
        # old list after this check is still lost; closing that would need a lock
        # every other user of sys.meta_path takes, and there is none.
        sys.meta_path = [f for f in list(current) if f is not finder]


#: The single hub of this process.
hub = ImportHub()
