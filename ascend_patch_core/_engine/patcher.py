"""The Patcher: what users configure, apply and revert. Nothing else lives here.

``apply()`` gathers declarations (the plugins', then the user's), hands them to the
planner (``_engine.plan``), starts what the plan leaves pending through the lazy installer
(``_install.installer``, ``_engine.module_hooks``), then the settings' providers (``_install.settings``).
``revert()`` replays the installer's log backwards (``_install.undo``). The state they all
share -- records, entries, their lock -- is the :class:`~._entries.Ledger`.
"""

from __future__ import annotations

import os
import threading
import types
import warnings
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from .._discovery.metadata import metadata
from .._discovery.registry import PluginSelection
from .._install.entries import Ledger
from .._install.installer import Installer
from .._model.env_flags import check_switches
from .._model.patch import AtomicPatch
from .._model.patch import LegacyPatch
from .._model.patch import ModuleHook
from .._model.patch import Patch
from .._model.patch import PatchLike
from .._model.report import USER
from .._model.report import InstalledPatch
from .._model.report import Report
from .config import PatcherConfig
from .config import name_of
from .fork_watch import watch_forks
from .plan import Plan
from .plan import plan
from .plan import plan_bootstrapped
from .sources import Activations
from .sources import PluginDeclarations
from .sources import load_declarations


if TYPE_CHECKING:
    from .._install.settings import Session
    from ..imports._rules import ImportRule
    from .module_hooks import HookRunner

__all__ = ["Patcher"]

_Self = TypeVar("_Self", bound="Patcher")


class Patcher:
    """Collects patches and import rules, applies them lazily, reverts them exactly.

    Configuration methods return the patcher, so calls chain as in the DrivingSDK patcher::

        patcher = Patcher().add(MyPatch).disable("OtherPatch").skip_import("flash_attn")
        report = patcher.apply()

    :param autoload: also apply the default patches and rules of every installed
        plugin (what :data:`default_patcher` does).
    :param strict: raise on any failure instead of recording it; ``None`` reads
        ``ASCEND_PATCH_STRICT``.
    :param rebind_stale: rebind modules that already hold an original through
        ``from x import f``; by default they are only reported.
    :param disable, plugins: plugin selection, in addition to ``ASCEND_PATCH_DISABLE``
        and ``ASCEND_PATCH_PLUGINS``.
    :param count_calls: count the calls of every patch whose replacement is a Python
        function, not only of ``runtime_check`` ones (``record.counters``); ``None``
        reads ``ASCEND_PATCH_COUNT_CALLS``. Off, nothing sits on the call path.
    """

    __module__ = "ascend_patch_core"

    def __init__(
        self,
        *,
        autoload: bool = False,
        strict: bool | None = None,
        rebind_stale: bool = False,
        disable: str | Iterable[str] | None = None,
        plugins: str | Iterable[str] | None = None,
        extra_plugins: Iterable[tuple[str, object]] = (),
        count_calls: bool | None = None,
    ) -> None:
        self._config = PatcherConfig(autoload, strict, disable, plugins, extra_plugins)
        self._config.count_calls = count_calls
        self._strict = bool(strict)
        self.rebind_stale = rebind_stale
        # What apply() did (cleared by revert()).
        self._ledger = Ledger()
        self._installer = Installer(self._ledger, lambda: self._strict)
        self._hooks: HookRunner | None = None  # made when a hook or 1.0 patch is planned
        self._activations = Activations(self._ledger, self._rules_strict)
        self._sessions: list[Session] = []
        self._applied = False
        #: ASCEND_PATCH_ENABLE's names as apply() read them (kept apart from enable()'s).
        self._env_enabled: frozenset[str] = frozenset()
        #: Notified (under the ledger's lock) when an apply() ends or a fork() is over.
        self._apply_done = threading.Condition(self._ledger.lock)
        #: While a fork() is about to happen no apply() starts (_fork).
        self._forking = False
        watch_forks(self)

    def _rules_strict(self) -> bool:
        # Rules act before apply() settles strictness: the argument, else the switch.
        if self._applied or self._installer.applying_thread is not None:
            return self._strict
        return self._config.selection().strict

    # ------------------------------------------------------------------ configuration

    def add(self: _Self, *items: PatchLike | ImportRule, options: Any = None) -> _Self:
        """Add Patch subclasses, AtomicPatch, ModuleHook, LegacyPatch or import-rule objects.

        After :meth:`apply`, added patches are applied at once (incrementally).
        A ``conflicts_with`` conflict warns, and raises at apply() (see PatcherConfig.take).
        Import rules (SkipImport, ReplaceImport, InjectImport) act at once, like
        :meth:`skip_import` and its siblings.
        """
        config = self._config
        added, rules = config.sort(items, options, self._ledger.warn)
        with self._ledger.lock:
            applied = self._applied
            conflict = config.take(added, applied)  # raises on a conflict after apply()
        if conflict is not None:
            warnings.warn(f"{conflict}; apply() raises unless one is disabled", stacklevel=2)
        for rule in rules:
            self._add_rule(rule)
        if applied and added:
            planned = plan(
                added,
                self._ledger,
                metadata,
                **self._config.switches(self._env_enabled, self._strict),
            )
            self._start(planned)
            if self._strict:  # what this call planned: earlier failures raised when they came
                self._ledger.raise_if_failed(planned.records)
        return self

    def disable(
        self: _Self, *names: str | type[Patch] | AtomicPatch | ModuleHook | LegacyPatch
    ) -> _Self:
        """Disable patches by group name, patch name, target path, class or object.

        For a patcher with ``autoload``, plugin entry-point or distribution names work
        too. After :meth:`apply`, the named patches are reverted at once.
        """
        resolved = {name_of(name, "disable") for name in names}
        with self._ledger.lock:
            self._config.disabled |= resolved
            applied = self._applied
        if applied:
            from .._install.undo import undo_entries

            with self._ledger.lock:  # one step: a fork() child sees it done or not begun
                undo_entries(self._ledger, self._installer, resolved, "disabled after apply()")
        return self

    def enable(self: _Self, *names: str | type[Patch]) -> _Self:
        """Turn on opt-in groups of plugins by name (``"*"``: all), like ``ASCEND_PATCH_ENABLE``.

        Takes effect at the next :meth:`apply` (after a :meth:`revert`, if applied).
        """
        self._config.enabled |= {name_of(name, "enable") for name in names}
        return self

    def select_plugins(
        self: _Self,
        *,
        disable: str | Iterable[str] | None = None,
        plugins: str | Iterable[str] | None = None,
        autoload: bool | None = None,
        strict: bool | None = None,
    ) -> _Self:
        """Choose plugins like the ``ASCEND_PATCH_*`` variables do (they still apply too).

        ``disable``: entry-point or distribution names (``"*"`` = all); ``plugins``: an
        allow-list; ``autoload=False``: no entry-point discovery; ``strict``: raise on
        any failure. ``None`` leaves a setting as it is.
        """
        self._config.select(self._applied, disable, plugins, autoload, strict)
        return self

    def skip_import(self: _Self, *modules: str) -> _Self:
        """Serve stubs for these modules and their submodules (effective immediately)."""
        from ..imports._rules import SkipImport

        for module in modules:
            self._add_rule(SkipImport(module))
        return self

    def replace_import(
        self: _Self,
        module_path: str,
        /,
        replacement: Any = None,
        *,
        base_module: str | types.ModuleType | None = None,
        exports: Mapping[str, Any] | None = None,
        when_missing: bool = False,
        **attrs: Any,
    ) -> _Self:
        """Serve a module in place of ``module_path`` when it is imported (see ReplaceImport).

        ``when_missing=True``: only where no real ``module_path`` is installed.
        """
        from ..imports._rules import ReplaceImport

        kw: dict[str, Any] = {"base_module": base_module, "exports": exports}
        self._add_rule(
            ReplaceImport(module_path, replacement, when_missing=when_missing, **kw, **attrs)
        )
        return self

    def inject_import(self: _Self, source_module: str, name: str, target_module: str) -> _Self:
        """Set ``target_module.<name>`` from ``source_module`` when the target is imported (immediate)."""
        from ..imports._rules import InjectImport

        self._add_rule(InjectImport(source_module, name, target_module))
        return self

    def _add_rule(self, rule: ImportRule) -> None:
        # Import rules act at once, as in the DrivingSDK patcher: code between add and apply() may
        # already import the module. They are declarations, so nothing is imported here.
        self._config.rules.append(rule)
        self._activations.rule(rule, USER)

    # -- settings, served by installed providers (see _settings.py) --------------------

    def with_profiling(
        self: _Self,
        path: str,
        level: int = 0,
        skip_first: int = 20,
        wait: int = 1,
        warmup: int = 1,
        active: int = 1,
        repeat: int = 1,
    ) -> _Self:
        """Profile training steps (provided by the training utilities, ascend-patch-training)."""
        options = {"path": os.fspath(path), "level": level, "skip_first": skip_first, "wait": wait,
                   "warmup": warmup, "active": active, "repeat": repeat}  # fmt: skip
        return self._set("profiling", options, "with_profiling()")

    def brake_at(self: _Self, step: int) -> _Self:
        """Stop training cleanly after ``step`` optimizer steps (ascend-patch-training)."""
        return self._set("brake", step, "brake_at()")

    def with_precision_check(self: _Self, **options: Any) -> _Self:
        """Also run the originals of chosen patches on live inputs and record deviations.

        Provided by the training utilities; see docs/training.md.
        """
        return self._set("precision_check", dict(options), "with_precision_check()")

    def allow_internal_format(self: _Self, allow: bool = True) -> _Self:
        """Set ``torch.npu.config.allow_internal_format`` once torch_npu is imported (torch plugin)."""
        return self._set("allow_internal_format", bool(allow), "allow_internal_format()")

    def disallow_internal_format(self: _Self) -> _Self:
        return self.allow_internal_format(False)

    def _set(self: _Self, name: str, value: Any, asked_by: str) -> _Self:
        self._config.set(name, value, asked_by)
        return self

    def add_session(self, session: Session) -> None:
        """Show ``session.records`` in this patcher's report; call ``session.undo()`` on revert().

        What a setting provider's session gets; also for tools that attach their own.
        """
        with self._ledger.lock:
            self._ledger.records.extend(session.records)
            self._sessions.append(session)

    # ------------------------------------------------------------------ state

    @property
    def is_applied(self) -> bool:
        return self._applied

    @property
    def strict(self) -> bool:
        return self._strict

    @property
    def report(self) -> Report:
        """The live report: pending patches turn applied as their modules are imported.

        After :meth:`revert`, the reverted records (until the next :meth:`apply`).
        """
        return Report(
            self._ledger.records, self._ledger.warnings, self._ledger.lock, self._look_for_stale
        )

    def installed(self) -> list[InstalledPatch]:
        """The patches installed now: record, original and replacement of each."""
        from .info import installed_patches

        return installed_patches(self._ledger)

    def print_info(self, diff: bool = False) -> str:
        """Print and return each patch's ``[state] target: original -> replacement`` (_info)."""
        from .info import patcher_info

        text = patcher_info(self._applied, self._ledger, *self._config.listing(), diff)
        print(text)
        return text

    def __enter__(self: _Self) -> _Self:
        self.apply()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        entries = len(self._ledger.entries)
        return (
            f"<Patcher applied={self._applied} items={len(self._config.items)} entries={entries}>"
        )

    # ------------------------------------------------------------------ apply

    def apply(self) -> Report:
        """Apply everything: plugins' declarations (with ``autoload``), then the user's.

        Imports no target library. Patches whose module is already imported are
        installed now; the others when their module is first imported. Calling it
        again while applied changes nothing and returns the same live report.
        """
        me = threading.get_ident()
        with self._ledger.lock:
            while self._forking:
                self._apply_done.wait()
            if self._applied or self._installer.applying_thread == me:
                return self.report
            if self._installer.applying_thread is not None:
                # Another thread is applying: wait for it (the wait lets go of the lock,
                # which its import hooks need), then share its result.
                while self._installer.applying_thread is not None:
                    self._apply_done.wait()
                return self.report
            # Every switch at once, as the commands check them: one verdict, one message.
            check_switches()
            selection = self._config.selection()
            self._installer.begin_apply(self._config.counting())
            self._ledger.start_report()
            self._strict = selection.strict
        try:
            self._apply(selection)
        finally:
            with self._ledger.lock:
                self._installer.end_apply()
                self._apply_done.notify_all()
        return self.report

    def _apply(self, selection: PluginSelection) -> None:
        config = self._config
        self._env_enabled = selection.enable
        found = PluginDeclarations()
        # Plugins load with autoload, or when named: Patcher(plugins="mmcv") asks for them.
        if config.autoload or config.extra_plugins or config.plugin_allow:
            found = load_declarations(selection, config.autoload, config.disabled, config.enabled)
            with self._ledger.lock:
                self._ledger.records.extend(found.records)
                self._ledger.warnings.extend(found.warnings)
            if selection.strict:
                found.raise_if_broken()
        declared = [*found.declared, *config.items]
        with self._ledger.lock:
            # Plan first: a conflict raises before anything is changed.
            switches = config.switches(self._env_enabled, self._strict)
            config.raise_conflicts(declared, with_added=False, enabled=switches["enabled"])
            planned = plan_bootstrapped(declared, self._ledger, metadata, self._start, **switches)
            config.check_unknown_names(
                self._env_enabled, self._ledger, planned.groups, found.plugin_names, self._strict
            )
            self._applied = True
        # User rules act from the moment they are declared; after a revert(), apply()
        # brings them back.
        active = {id(rule) for rule, _ in self._activations.rules}
        for rule in config.rules:
            if id(rule) not in active:
                self._activations.rule(rule, USER)
        for setting, provenance in found.env:
            self._activations.env(setting, provenance)
        for rule, provenance in found.rules:
            self._activations.rule(rule, provenance)
        self._start(planned)
        if config.settings:
            from .._install.settings import start_settings

            for session in start_settings(self, config.settings, self._strict, self._ledger):
                self.add_session(session)
        metadata.save()
        if self._strict:
            self._ledger.raise_if_failed()

    def _start(self, planned: Plan) -> None:
        crowded = frozenset(id(e) for _, first, later in planned.collisions for e in (first, later))
        self._installer.install_ready(planned.entries, crowded)
        if planned.hooks or planned.legacy:
            if self._hooks is None:
                from .module_hooks import HookRunner

                self._hooks = HookRunner(
                    self._installer, lambda: frozenset(self._config.disabled), lambda: self._strict
                )
            for hook in planned.hooks:
                self._hooks.start_hook(hook)
            for state in planned.legacy:
                self._hooks.start_legacy(state)
        # Asked of this plan's entries only (the candidates of earlier plans were looked at
        # then): add() after apply() costs the same however many patches came before.
        if self.rebind_stale or any(e.patch.rebind for e in planned.entries):
            self._look_for_stale()  # rebinding cannot wait for someone to read the report

    def _look_for_stale(self) -> None:
        """Find modules that took an original before apply() (deferred until the report is read)."""
        with self._ledger.lock:
            entries = self._installer.take_stale_candidates()
        if entries:
            from .._install.stale import report_stale

            report_stale(entries, self.rebind_stale)

    # ------------------------------------------------------------------ revert

    def revert(self) -> Report:
        """Undo everything this patcher did, in reverse order, restoring originals by identity.

        A slot that someone else changed after we patched it is left alone and reported.
        Returns the report as it stands now (applied patches say ``reverted``);
        :attr:`report` shows the same records until the next :meth:`apply` starts a new one.
        """
        from .._install.undo import revert_all

        # One step under the lock, which fork() takes: no child sees a half-reverted patcher.
        with self._ledger.lock:
            self._applied = False
            sessions, self._sessions = self._sessions, []
            self._installer.take_stale_candidates()
            revert_all(self._ledger, self._installer, sessions)
            self._activations.undo(self._ledger.warn)
            records, warnings = self._ledger.end_report()
        return Report(records, warnings, self._ledger.lock)
