"""Parent packages for a served module whose parents are installed nowhere.

``replace_import("nopkg.ops.x", F=1)`` and ``skip_import("nopkg.ops.x")`` must make
``import nopkg.ops.x`` work where ``nopkg`` does not exist (the DrivingSDK patcher
synthesised such parents). Each missing parent is served as an empty package, but
only when the import system's other finders know no real one (``when_missing``):
a real parent is still imported normally, its ``__init__`` runs and its errors reach
the importer.

Several rules can need the same parent (``nopkg.a.x`` and ``nopkg.a.y``): one server
holds every synthesised parent with the rules that need it, and a parent stops being
served -- and leaves ``sys.modules`` -- only when the last of them is withdrawn.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable

from ._hub import hub


__all__ = ["MissingParents"]


def _never() -> bool:
    return False


class _ParentServer:
    """The one ``ServedModule`` of every synthesised parent, with each name's owners."""

    when_missing = True
    strict: Callable[[], bool] = staticmethod(_never)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: parent name -> the rules (MissingParents) that need it.
        self.owners: dict[str, list[MissingParents]] = {}
        #: parent name -> the module built for it (removed with the last owner).
        self.built: dict[str, types.ModuleType] = {}

    def claim(self, name: str, owner: MissingParents) -> bool:
        """Add ``owner`` to ``name``'s owners, serving it first if nobody does."""
        with self.lock:
            owners = self.owners.get(name)
            if owners is not None:
                owners.append(owner)
                return True
            # Loaded for real, or served by another rule (a skipped package): theirs.
            if name in sys.modules or hub.serves(name):
                return False
            self.owners[name] = [owner]
        hub.serve(name, self)
        return True

    def release(self, name: str, owner: MissingParents) -> None:
        with self.lock:
            owners = self.owners.get(name, [])
            if owner in owners:
                owners.remove(owner)
            if owners:
                return
            self.owners.pop(name, None)
            module = self.built.pop(name, None)
        hub.unserve(name, self)
        if module is not None and sys.modules.get(name) is module:
            del sys.modules[name]

    # ServedModule protocol
    def build(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(
            fullname, f"An empty package ascend-patch serves: {fullname} is not installed."
        )

    def is_package(self, fullname: str) -> bool:
        return True

    def origin(self, fullname: str) -> str:
        return "ascend-patch:parent"

    def served(self, fullname: str, module: types.ModuleType) -> None:
        with self.lock:
            self.built[fullname] = module

    def real_found(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> None:
        """A real parent exists: it is imported as usual."""


_server = _ParentServer()


class MissingParents:
    """The missing parents of one rule's module, claimed on the shared server."""

    def __init__(self, module: str) -> None:
        # The server removes what it built, once the last rule needing it is withdrawn.
        parts = module.split(".")[:-1]
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
        self.names = [p for p in prefixes if _server.claim(p, self)]

    def withdraw(self) -> None:
        for name in reversed(self.names):
            _server.release(name, self)
        self.names = []
