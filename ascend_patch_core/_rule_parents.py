"""Parent packages for a served module whose parents are installed nowhere.

``replace_import("nopkg.ops.x", F=1)`` and ``skip_import("nopkg.ops.x")`` must make
``import nopkg.ops.x`` work where ``nopkg`` does not exist (the DrivingSDK patcher
synthesised such parents). Each missing parent is served as an empty package, but
only when the import system's other finders know no real one (``when_missing``):
a real parent is still imported normally, its ``__init__`` runs and its errors reach
the importer.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections.abc import Callable

from ._hub import hub


__all__ = ["MissingParents"]


class MissingParents:
    """The empty packages served for one rule's missing parents (a ``ServedModule``)."""

    when_missing = True

    def __init__(self, module: str, created: list[str], strict: Callable[[], bool]) -> None:
        self._created = created
        self.strict = strict
        parts = module.split(".")[:-1]
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
        # A parent already loaded or served by another rule (a skipped package) is theirs.
        self.names = [p for p in prefixes if p not in sys.modules and not hub.serves(p)]
        for name in self.names:
            hub.serve(name, self)

    def withdraw(self) -> None:
        for name in self.names:
            hub.unserve(name, self)
        self.names = []

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
        self._created.append(fullname)  # removed from sys.modules with the rule's own

    def real_found(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> None:
        """A real parent exists: it is imported as usual."""
