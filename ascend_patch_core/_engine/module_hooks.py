"""ModuleHook and 1.0 function patches: patches that are discovered, or run, on import.

A :class:`~ascend_patch_core.ModuleHook` watches a module-name pattern; for every
module that matches (already imported, or imported later) its callback returns
AtomicPatches, which go through the same planning verdicts and the same installer
as declared ones. A 1.0 :class:`~ascend_patch_core.LegacyPatch` runs its function
once its module is imported; it cannot be undone, and says so.
"""

from __future__ import annotations

import fnmatch
import functools
import types
from collections.abc import Callable

from .._discovery.metadata import metadata
from .._discovery.requires import check_requirement
from .._install.entries import HookState
from .._install.entries import LegacyState
from .._install.installer import Installer
from .._model.patch import AtomicPatch
from .._model.report import APPLIED
from .._model.report import FAILED
from .._model.report import PENDING
from .._model.report import SKIPPED
from ..imports._hub import hub
from .plan import Declared
from .plan import plan


__all__ = ["HookRunner"]


class HookRunner:
    """Starts the hooks and 1.0 patches of one patcher."""

    def __init__(
        self,
        installer: Installer,
        disabled: Callable[[], frozenset[str]],
        strict: Callable[[], bool],
    ) -> None:
        self._installer = installer
        self._ledger = installer.ledger
        self._disabled = disabled
        self._strict = strict

    # ------------------------------------------------------------------ module hooks

    def start_hook(self, state: HookState) -> None:
        """Watch the hook's pattern; visit matching modules already imported."""
        if state.record.status is not PENDING:
            return
        for requirement in state.requires:
            ok, why = check_requirement(requirement, metadata)
            if not ok:
                state.record.set(SKIPPED, f"requires {requirement}: {why}")
                return
        state.handle = hub.watch_pattern(
            state.hook.pattern, functools.partial(self._visit_hook, state)
        )
        state.record.set(APPLIED, "watching")
        from .._install.stale import loaded_modules

        for name, module in sorted(loaded_modules().items(), key=lambda kv: kv[0]):
            if module is not None and fnmatch.fnmatchcase(name, state.hook.pattern):
                self.visit(state, module)

    def _visit_hook(self, state: HookState, module: types.ModuleType) -> None:
        self.visit(state, module)

    def visit(self, state: HookState, module: types.ModuleType) -> None:
        if id(module) in state.visited or state.record.status is not APPLIED:
            return
        state.visited.add(id(module))
        name = getattr(module, "__name__", "?")
        try:
            produced = list(state.hook.callback(module) or ())
            bad = [p for p in produced if not isinstance(p, AtomicPatch)]
            if bad:
                raise TypeError(f"returned {bad[0]!r}; expected AtomicPatch objects")
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit() fails its hook only
            message = f"callback failed on {name}: {type(exc).__name__}: {exc}"
            state.record.warnings.append(message)
            if self._strict():
                from .._install.strict import strict_failure

                raise strict_failure(state.record, message, module=name, cause=exc) from None
            return
        state.modules += 1
        # Patches a hook produces belong to the hook: it is their group.
        found = plan(
            [Declared(p, None, state.provenance, state.hook.name) for p in produced],
            self._ledger,
            metadata,
            disabled=self._disabled(),
            strict=self._strict(),
        )
        for entry in found.entries:
            self._installer.advance(entry)
        state.record.set(APPLIED, f"watching; visited {state.modules} module(s)")

    # ------------------------------------------------------------------ 1.0 patches

    def start_legacy(self, state: LegacyState) -> None:
        if state.record.status in (SKIPPED, FAILED):
            return
        module_name = state.patch.target_module
        assert module_name is not None
        state.record.set(PENDING, f"waiting for import of {module_name}")
        state.handle = hub.when_imported(module_name, functools.partial(self._run_legacy, state))

    def _run_legacy(self, state: LegacyState, module: types.ModuleType) -> None:
        with self._ledger.lock:
            if state.done:
                return
            state.done = True
            state.handle = None
        try:
            state.patch.func(module, state.patch.options)
        except AttributeError as exc:
            # As in the DrivingSDK patcher: the function looked for something this
            # version of the module does not have -- not applicable here, not a defect.
            state.record.set(SKIPPED, f"{module.__name__} lacks what it patches: {exc}")
            return
        except (Exception, SystemExit) as exc:
            state.record.set(FAILED, f"{type(exc).__name__}: {exc}")
            if self._strict():
                from .._install.strict import strict_failure

                raise strict_failure(
                    state.record, f"{type(exc).__name__}: {exc}", module=module.__name__, cause=exc
                ) from None
            return
        state.record.set(APPLIED, None)
