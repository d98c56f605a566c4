"""The loader of a module an import rule serves (skip_import, replace_import).

The rule builds the module; the original is never executed. Outside strict mode a
rule that cannot build its module falls back to the real one, so a broken rule never
breaks the user's import. Loaded only when a rule first serves an import.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import TYPE_CHECKING

from .._model.errors import PatchError


if TYPE_CHECKING:
    from importlib.abc import Loader as _LoaderBase
    from typing import Protocol

    # Only for annotations: creating a Protocol class costs ~75 us at import. Both
    # are declared here, not in _hub: the hub imports this loader, so the loader
    # must not name the hub back (docs/core.md: no circles, TYPE_CHECKING included).

    class ServedModule(Protocol):
        """What an import rule gives the hub: a way to build the module it serves."""

        def build(
            self, fullname: str, spec: importlib.machinery.ModuleSpec
        ) -> types.ModuleType: ...

        def is_package(self, fullname: str) -> bool: ...

        def origin(self, fullname: str) -> str: ...

        def served(self, fullname: str, module: types.ModuleType) -> None: ...

        def strict(self) -> bool: ...

        #: Serve only when the import system finds no real module of that name.
        when_missing: bool

        def real_found(self, fullname: str, spec: importlib.machinery.ModuleSpec) -> None: ...

    class RuleHub(Protocol):
        """The two things the loader asks of the import hub (``imports._hub.ImportHub``)."""

        def real_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None: ...

        def notify(self, name: str, module: types.ModuleType) -> None: ...

else:
    _LoaderBase = object

__all__ = ["RuleLoader"]


class RuleLoader(_LoaderBase):
    """Builds a module from an import rule; the original module is never executed."""

    def __init__(self, rule: ServedModule, hub: RuleHub) -> None:
        self._rule = rule
        self._hub = hub
        #: The real module's spec, when the rule could not build its module (not strict).
        self._real: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        try:
            return self._rule.build(spec.name, spec)
        except PatchError:
            # A rule that cannot serve must not break the user's import: outside strict
            # mode the real module is imported instead (the rule's record says FAILED).
            if self._rule.strict():
                raise
            real = self._hub.real_spec(spec.name)
            if real is None or real.loader is None:
                raise
            self._real = real
            create = getattr(real.loader, "create_module", None)
            return create(real) if create is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        if self._real is not None:
            self._exec_real(module, self._real)
            return
        name = module.__spec__.name if module.__spec__ is not None else module.__name__
        final = sys.modules.get(name, module)
        replacement = getattr(module, "__ascend_patch_alias__", None)
        if replacement is not None:
            # The rule serves an existing module object: importlib returns whatever is
            # in sys.modules after exec, so the alias is swapped in here, untouched.
            sys.modules[name] = replacement
            final = replacement
        self._rule.served(name, final)
        self._hub.notify(name, final)

    def _exec_real(self, module: types.ModuleType, real: importlib.machinery.ModuleSpec) -> None:
        # importlib set the module up from the rule's spec: make it the real one's.
        module.__spec__, module.__loader__ = real, real.loader
        if real.has_location and real.origin:
            module.__file__ = real.origin
        if real.submodule_search_locations is not None:
            module.__path__ = list(real.submodule_search_locations)
        real.loader.exec_module(module)  # type: ignore[union-attr]
        name = real.name
        self._hub.notify(name, sys.modules.get(name, module))
