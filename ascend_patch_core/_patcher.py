"""The Patcher: plans declarations, applies them lazily, reverts them exactly.

Life of an atomic patch::

    planned --(deps applied, target module imported)--> installing --> applied --> reverted
       |                                                     |
       +--> skipped (disabled, requires, precheck, missing)  +--> failed (an exception)
       +--> pending (waiting for an import or a dependency)

Thread safety: state transitions happen under one re-entrant lock, held only for
bookkeeping. No import is started and no user code (prechecks, wrappers, factories)
runs while it is held, so an import hook firing in another thread can never
deadlock against ``apply()``. Each patch is claimed (``planned``/``pending`` ->
``installing``) under the lock, so it is installed exactly once however many threads
race to import its module.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import sys
import threading
import types
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from ._entries import APPLIED
from ._entries import FAILED
from ._entries import FINAL_NOT_APPLIED
from ._entries import INSTALLING
from ._entries import PENDING
from ._entries import PLANNED
from ._entries import REVERTED
from ._entries import SKIPPED
from ._entries import Entry
from ._entries import HookState
from ._entries import LegacyState
from ._entries import Site
from ._entries import Skip
from ._entries import dependency_order
from ._entries import in_cycle
from ._entries import label
from ._entries import norm_target
from ._entries import own_modules
from ._entries import who
from ._errors import PatchConflictError
from ._errors import PatchDefinitionError
from ._errors import PatchError
from ._errors import PluginError
from ._errors import SkipPatch
from ._hub import hub
from ._hub import import_in_progress
from ._hub import initializing
from ._hub import wait_for_import
from ._metadata import metadata
from ._metadata import normalize_name
from ._patch import AtomicPatch
from ._patch import LegacyPatch
from ._patch import ModuleHook
from ._patch import Patch
from ._patch import PatchLike
from ._patch import is_import_rule
from ._registry import PluginSelection
from ._registry import load_plugins
from ._report import USER
from ._report import CallCounters
from ._report import Provenance
from ._report import Record
from ._report import Report
from ._report import Status
from ._requires import check_requirement
from ._stale import module_ids
from ._target import ABSENT
from ._target import Missing
from ._target import Slot
from ._target import TargetPath
from ._target import Waiting
from ._target import adapt_to_descriptor
from ._target import candidate_modules
from ._target import initializing_prefixes
from ._target import inner_callable
from ._target import resolve
from ._target import resolve_string


if TYPE_CHECKING:
    from ._rules import ImportRule

__all__ = ["Patcher"]

_Self = TypeVar("_Self", bound="Patcher")


class Patcher:
    """Collects patches and import rules, applies them lazily, reverts them exactly.

    Configuration methods return the patcher, so calls chain as in the seed::

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
    ) -> None:
        self._lock = threading.RLock()
        self._autoload = autoload
        self._strict_arg = strict
        self._strict = bool(strict)
        self.rebind_stale = rebind_stale
        self._plugin_disable = disable
        self._plugin_allow = plugins
        self._discover: bool | None = None
        self._extra_plugins = tuple(extra_plugins)
        # What the user added (kept across apply/revert cycles).
        self._items: list[tuple[PatchLike, Any, Provenance]] = []
        self._user_rules: list[ImportRule] = []
        self._disabled: set[str] = set()
        # Built by apply(), cleared by revert().
        self._entries: list[Entry] = []
        self._hooks: list[HookState] = []
        self._legacy: list[LegacyState] = []
        self._rules: list[tuple[ImportRule, Record]] = []
        self._env_set: list[tuple[str, str]] = []
        self._records: list[Record] = []
        self._warnings: list[str] = []
        self._log: list[Site] = []
        self._groups: dict[str, type[Patch]] = {}
        self._applied = False
        self._applying_thread: int | None = None
        self._apply_finished = threading.Event()
        # Delegated settings (training utilities and NPU runtime settings).
        self._profiling: dict[str, Any] | None = None
        self._brake_step: int | None = None
        self._internal_format: bool | None = None
        self._precision_check: dict[str, Any] | None = None
        self._setting_restores: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ configuration

    def add(self: _Self, *items: PatchLike | ImportRule, options: Any = None) -> _Self:
        """Add Patch subclasses, AtomicPatch, ModuleHook, LegacyPatch or import-rule objects.

        After :meth:`apply`, added patches are applied at once (incrementally).
        Import rules (SkipImport, ReplaceImport, InjectImport) act at once, like
        :meth:`skip_import` and its siblings.
        """
        checked: list[tuple[PatchLike, Any, Provenance]] = []
        rules: list[ImportRule] = []
        for item in items:
            if is_import_rule(item):
                rules.append(item)  # type: ignore[arg-type]
                continue
            if isinstance(item, Patch):  # an instance of a group: use its class
                item = type(item)
            if not (
                (isinstance(item, type) and issubclass(item, Patch) and item is not Patch)
                or isinstance(item, (AtomicPatch, ModuleHook, LegacyPatch))
            ):
                raise TypeError(
                    "Patcher.add() takes Patch subclasses, AtomicPatch, ModuleHook, LegacyPatch "
                    f"or import-rule objects, got {item!r}"
                )
            if any(existing is item for existing, _, _ in [*self._items, *checked]):
                self._warn(f"{label(item)} was added twice; it is applied once")
                continue
            checked.append((item, options, USER))
        with self._lock:
            self._check_conflicts_on_add([i for i, _, _ in checked])
            self._items.extend(checked)
            applied = self._applied
        if rules:
            self._add_rules(rules)
        if applied:
            self._start_items(checked)
        return self

    def disable(
        self: _Self, *names: str | type[Patch] | AtomicPatch | ModuleHook | LegacyPatch
    ) -> _Self:
        """Disable patches by group name, patch name, target path, class or object.

        For a patcher with ``autoload``, plugin entry-point or distribution names work
        too. After :meth:`apply`, the named patches are reverted at once.
        """
        resolved: set[str] = set()
        for name in names:
            if isinstance(name, str):
                resolved.add(name)
            elif (isinstance(name, type) and issubclass(name, Patch)) or isinstance(
                name, (AtomicPatch, ModuleHook, LegacyPatch, Patch)
            ):
                resolved.add(name.name)
            else:
                raise TypeError(
                    f"Patcher.disable() takes names, Patch classes or patch objects, got {name!r}"
                )
        with self._lock:
            self._disabled |= resolved
            applied = self._applied
            victims = [
                e
                for e in self._entries
                if e.names() & resolved and e.state not in FINAL_NOT_APPLIED
            ]
        if applied:
            for entry in reversed(victims):
                self._undo_entry(entry, Status.SKIPPED, "disabled after apply()")
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
        current = (self._plugin_disable, self._plugin_allow, self._discover, self._strict_arg)
        merged = (
            self._plugin_disable if disable is None else disable,
            self._plugin_allow if plugins is None else plugins,
            self._discover if autoload is None else autoload,
            self._strict_arg if strict is None else strict,
        )
        if self._applied and merged != current:
            raise PatchError(
                "the patcher is already applied; call revert() before changing its plugin selection"
            )
        self._plugin_disable, self._plugin_allow, self._discover, self._strict_arg = merged
        return self

    def skip_import(self: _Self, *modules: str) -> _Self:
        """Serve stubs for these modules and their submodules (effective immediately)."""
        from ._rules import SkipImport

        return self._add_rules([SkipImport(m) for m in modules])

    def replace_import(
        self: _Self, module: str, replacement: Any = None, /, **exports: Any
    ) -> _Self:
        """Serve ``replacement`` when ``module`` is imported; the original never runs (immediate)."""
        from ._rules import ReplaceImport

        return self._add_rules([ReplaceImport(module, replacement, **exports)])

    def inject_import(self: _Self, source_module: str, name: str, target_module: str) -> _Self:
        """Set ``target_module.<name>`` from ``source_module`` when the target is imported (immediate)."""
        from ._rules import InjectImport

        return self._add_rules([InjectImport(source_module, name, target_module)])

    def _add_rules(self: _Self, rules: list[ImportRule]) -> _Self:
        # Import rules act at once, as in the seed: code between add and apply() may
        # already import the module. They are declarations, so nothing is imported here.
        for rule in rules:
            self._user_rules.append(rule)
            self._activate_rule(rule, USER)
        return self

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
        """Profile training steps (delegated to the training utilities)."""
        if level not in (0, 1, 2):
            raise PatchDefinitionError(f"with_profiling: level must be 0, 1 or 2, got {level!r}")
        for option, value in (
            ("skip_first", skip_first),
            ("wait", wait),
            ("warmup", warmup),
            ("active", active),
            ("repeat", repeat),
        ):
            if not isinstance(value, int) or value < 0:
                raise PatchDefinitionError(
                    f"with_profiling: {option} must be a non-negative int, got {value!r}"
                )
        self._profiling = {
            "path": os.fspath(path),
            "level": level,
            "skip_first": skip_first,
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": repeat,
        }
        return self

    def brake_at(self: _Self, step: int) -> _Self:
        """Stop training cleanly after ``step`` optimizer steps (delegated to the training utilities)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise PatchDefinitionError(f"brake_at: step must be a positive int, got {step!r}")
        self._brake_step = step
        return self

    def with_precision_check(self: _Self, **options: Any) -> _Self:
        """Also run the originals of chosen patches on live inputs and record deviations.

        Delegated to the training utilities; see ``ascend_patch_core._training``.
        """
        from ._training._precision import PrecisionOptions

        PrecisionOptions.parse(options)  # bad options fail here, not later at apply()
        self._precision_check = dict(options)
        return self

    def allow_internal_format(self: _Self, allow: bool = True) -> _Self:
        """Set ``torch.npu.config.allow_internal_format`` once torch_npu is imported."""
        self._internal_format = bool(allow)
        return self

    def disallow_internal_format(self: _Self) -> _Self:
        return self.allow_internal_format(False)

    # ------------------------------------------------------------------ state

    @property
    def is_applied(self) -> bool:
        return self._applied

    @property
    def strict(self) -> bool:
        return self._strict

    @property
    def report(self) -> Report:
        """The live report: pending patches turn applied as their modules are imported."""
        return Report(self._records, self._warnings, self._lock)

    def __enter__(self: _Self) -> _Self:
        self.apply()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        return f"<Patcher applied={self._applied} items={len(self._items)} entries={len(self._entries)}>"

    # ------------------------------------------------------------------ apply

    def apply(self) -> Report:
        """Apply everything: plugins' declarations (with ``autoload``), then the user's.

        Imports no target library. Patches whose module is already imported are
        installed now; the others when their module is first imported. Calling it
        again while applied changes nothing and returns the same live report.
        """
        me = threading.get_ident()
        with self._lock:
            if self._applied or self._applying_thread == me:
                return self.report
            if self._applying_thread is not None:
                # Another thread is applying: wait for it (outside the lock, since
                # its import hooks need the lock), then share its result.
                finished = self._apply_finished
            else:
                finished = None
                selection = PluginSelection.from_env(
                    disable=self._plugin_disable,
                    plugins=self._plugin_allow,
                    autoload=self._discover,
                    strict=self._strict_arg,
                    extra=self._extra_plugins,
                )
                self._strict = selection.strict
                self._applying_thread = me
                self._apply_finished = threading.Event()
        if finished is not None:
            finished.wait()
            return self.report
        try:
            self._apply(selection)
        finally:
            with self._lock:
                self._applying_thread = None
                self._apply_finished.set()
        return self.report

    def _apply(self, selection: PluginSelection) -> None:
        plugin_items: list[tuple[PatchLike, Any, Provenance]] = []
        plugin_rules: list[tuple[ImportRule, Provenance]] = []
        plugin_env: list[tuple[Any, Provenance]] = []
        plugin_names: set[str] = set()
        if self._autoload or self._extra_plugins:
            if not self._autoload:
                selection = PluginSelection(
                    selection.disable, selection.allow, False, selection.strict, selection.extra
                )
            plugins, plugin_records, plugin_warnings = load_plugins(
                selection, metadata, self._disabled
            )
            with self._lock:
                self._records.extend(plugin_records)
                self._warnings.extend(plugin_warnings)
            for plugin in plugins:
                plugin_names |= {
                    plugin.name,
                    normalize_name(plugin.provenance.distribution or plugin.name),
                }
                if plugin.name in self._disabled or (
                    plugin.provenance.distribution
                    and normalize_name(plugin.provenance.distribution)
                    in {normalize_name(d) for d in self._disabled}
                ):
                    plugin.record.set(Status.SKIPPED, "disabled by Patcher.disable()")
                    continue
                plugin_env.extend((setting, plugin.provenance) for setting in plugin.env)
                plugin_rules.extend((rule, plugin.provenance) for rule in plugin.rules)
                plugin_items.extend((item, None, plugin.provenance) for item in plugin.patches)
            failed = [r for r in plugin_records if r.status is Status.FAILED]
            if selection.strict and (failed or plugin_warnings):
                problems = [r.reason or r.name for r in failed] + plugin_warnings
                raise PluginError("ascend-patch (strict): " + "; ".join(problems))

        items = plugin_items + list(self._items)
        with self._lock:
            # Plan first: a conflict raises before anything is changed.
            self._check_conflicts_on_add([i for i, _, _ in items], existing=False)
            entries, hooks, legacy = self._plan(items)
            self._check_unknown_disabled(entries, hooks, legacy, plugin_names)
            self._applied = True
        # User rules act from the moment they are declared; after a revert(), apply()
        # brings them back.
        active = {id(rule) for rule, _ in self._rules}
        for rule in self._user_rules:
            if id(rule) not in active:
                self._activate_rule(rule, USER)
        for setting, provenance in plugin_env:
            self._apply_env(setting, provenance)
        for rule, provenance in plugin_rules:
            self._activate_rule(rule, provenance)
        self._start(entries, hooks, legacy)
        self._start_settings()
        metadata.save()
        self._raise_if_strict_failed()

    def _start_items(self, items: list[tuple[PatchLike, Any, Provenance]]) -> None:
        with self._lock:
            entries, hooks, legacy = self._plan(items)
        self._start(entries, hooks, legacy)
        self._raise_if_strict_failed()

    def _raise_if_strict_failed(self) -> None:
        if not self._strict:
            return
        failed = [r for r in self.report.records if r.status is Status.FAILED]
        if failed:
            raise PatchError(
                "ascend-patch (strict): " + "; ".join(f"{r.name}: {r.reason}" for r in failed)
            )

    # ------------------------------------------------------------------ planning

    def _plan(
        self, items: list[tuple[PatchLike, Any, Provenance]]
    ) -> tuple[list[Entry], list[HookState], list[LegacyState]]:
        entries: list[Entry] = []
        hooks: list[HookState] = []
        legacy: list[LegacyState] = []
        for item, options, provenance in items:
            if isinstance(item, type):
                group = item
                self._groups[group.name] = group
                if group.name in self._disabled or group.legacy_name in self._disabled:
                    record = Record(
                        "group",
                        group.name,
                        group.name,
                        Status.SKIPPED,
                        "disabled",
                        group.name,
                        provenance,
                    )
                    self._records.append(record)
                    continue
                unmet = self._unmet_group_requirement(group)
                if unmet is not None:
                    # Checked before patches() runs: a group that cannot apply here costs
                    # one metadata lookup, not the building of all its patches.
                    record = Record(
                        "group",
                        group.name,
                        group.name,
                        Status.SKIPPED,
                        unmet,
                        group.name,
                        provenance,
                    )
                    self._records.append(record)
                    continue
                try:
                    children = list(group.patches(options))
                except Exception as exc:
                    record = Record(
                        "group", group.name, group.name, group=group.name, provenance=provenance
                    )
                    record.set(
                        Status.FAILED,
                        f"{group.__qualname__}.patches() raised {type(exc).__name__}: {exc}",
                    )
                    self._records.append(record)
                    continue
                for child in children:
                    if isinstance(child, AtomicPatch):
                        entries.append(self._new_entry(child, group, provenance))
                    elif isinstance(child, ModuleHook):
                        hooks.append(self._new_hook(child, provenance, group))
                    else:
                        record = Record(
                            "group", group.name, group.name, group=group.name, provenance=provenance
                        )
                        record.set(
                            Status.FAILED, f"{group.__qualname__}.patches() returned {child!r}"
                        )
                        self._records.append(record)
            elif isinstance(item, AtomicPatch):
                entries.append(self._new_entry(item, None, provenance))
            elif isinstance(item, ModuleHook):
                hooks.append(self._new_hook(item, provenance, None))
            else:
                legacy.append(self._new_legacy(item, provenance))

        for entry in entries:
            if entry.names() & self._disabled:
                self._finish(entry, SKIPPED, Status.SKIPPED, "disabled")
        self._check_requirements(entries)
        self._check_collisions(entries)
        self._link_dependencies(entries)
        self._entries.extend(entries)
        self._hooks.extend(hooks)
        self._legacy.extend(legacy)
        return dependency_order(entries), hooks, legacy

    @staticmethod
    def _unmet_group_requirement(group: type[Patch]) -> str | None:
        from ._patch import normalize_requires

        for requirement in normalize_requires(group.requires, f"{group.__qualname__}.requires"):
            ok, why = check_requirement(requirement, metadata)
            if not ok:
                return f"requires {requirement}: {why}"
        return None

    def _new_entry(
        self, patch: AtomicPatch, group: type[Patch] | None, provenance: Provenance
    ) -> Entry:
        record = Record(
            "patch",
            patch.name,
            patch.target,
            group=group.name if group else None,
            provenance=provenance,
        )
        entry = Entry(patch, record, group.name if group else None, provenance)
        if group is not None and (group.requires or group.after):
            from ._patch import normalize_requires

            extra = normalize_requires(group.requires, f"{group.__qualname__}.requires")
            entry.extra_requires = extra  # type: ignore[attr-defined]
            entry.extra_after = tuple(group.after)  # type: ignore[attr-defined]
        if patch.runtime_check is not None:
            entry.counters = record.counters = CallCounters()
        self._records.append(record)
        return entry

    def _new_hook(
        self, hook: ModuleHook, provenance: Provenance, group: type[Patch] | None
    ) -> HookState:
        record = Record(
            "hook",
            hook.name,
            hook.pattern,
            group=group.name if group else None,
            provenance=provenance,
        )
        self._records.append(record)
        state = HookState(hook, record, provenance)
        if hook.name in self._disabled or (group is not None and group.name in self._disabled):
            record.set(Status.SKIPPED, "disabled")
        return state

    def _new_legacy(self, patch: LegacyPatch, provenance: Provenance) -> LegacyState:
        record = Record("legacy", patch.name, patch.target_module or "?", provenance=provenance)
        self._records.append(record)
        state = LegacyState(patch, record, provenance)
        if patch.name in self._disabled:
            record.set(Status.SKIPPED, "disabled")
        elif not patch.target_module:
            record.set(
                Status.FAILED,
                "LegacyPatch needs target_module (use PatcherBuilder.add_module_patch)",
            )
        return state

    def _check_conflicts_on_add(self, items: list[PatchLike], existing: bool = True) -> None:
        groups = [i for i in items if isinstance(i, type) and issubclass(i, Patch)]
        if existing:
            groups += [g for g, _, _ in self._items if isinstance(g, type) and issubclass(g, Patch)]
        enabled = {g.name: g for g in groups if g.name not in self._disabled}
        for name, group in enabled.items():
            for other in group.conflicts_with:
                if other in enabled and other != name:
                    raise PatchConflictError(
                        f"patch groups {name!r} and {other!r} conflict ({name}.conflicts_with names {other!r}); "
                        f"enable only one, e.g. default_patcher.disable({other!r}).add({name})"
                    )

    def _check_requirements(self, entries: list[Entry]) -> None:
        # A group's requirement is repeated on each of its patches: one answer per
        # text and plan (under the emulator, torch-npu answers are not cached on disk).
        answers: dict[str, tuple[bool, str]] = {}
        for entry in entries:
            if entry.state != PLANNED:
                continue
            requirements = tuple(entry.patch.requires) + tuple(getattr(entry, "extra_requires", ()))
            for requirement in requirements:
                answer = answers.get(requirement)
                if answer is None:
                    answer = answers[requirement] = check_requirement(requirement, metadata)
                ok, why = answer
                if not ok:
                    self._finish(entry, SKIPPED, Status.SKIPPED, f"requires {requirement}: {why}")
                    break

    def _check_collisions(self, entries: list[Entry]) -> None:
        by_target: dict[str, Entry] = {}
        for entry in self._entries:
            if entry.state not in FINAL_NOT_APPLIED:
                for path in (entry.patch.target, *entry.patch.aliases):
                    by_target.setdefault(norm_target(path), entry)
        for entry in entries:
            if entry.state != PLANNED:
                continue
            for path in (entry.patch.target, *entry.patch.aliases):
                key = norm_target(path)
                first = by_target.get(key)
                if first is None:
                    by_target[key] = entry
                    continue
                if first is entry:
                    continue
                message = (
                    f"{who(first)} and {who(entry)} both patch {path}; they are applied in that order, "
                    f"so {entry.patch.name!r} is installed over {first.patch.name!r}"
                )
                if self._strict:
                    raise PatchConflictError(f"ascend-patch (strict): {message}")
                self._warn(message)
                entry.record.warnings.append(message)

    def _link_dependencies(self, entries: list[Entry]) -> None:
        all_entries = [e for e in self._entries if e.state != REVERTED] + entries
        by_name: dict[str, list[Entry]] = {}
        for entry in all_entries:
            for name in entry.names():
                by_name.setdefault(name, []).append(entry)
        for entry in entries:
            wanted = tuple(entry.patch.after) + tuple(getattr(entry, "extra_after", ()))
            for name in wanted:
                found = [
                    d
                    for d in by_name.get(name, [])
                    if d is not entry and not (name == entry.group and d.group == entry.group)
                ]
                if not found:
                    if entry.state == PLANNED:
                        self._finish(
                            entry,
                            FAILED,
                            Status.FAILED,
                            f"after={name!r} names no patch or group of this patcher",
                        )
                    break
                for dep in found:
                    if dep not in entry.deps:
                        entry.deps.append(dep)
                        dep.dependents.append(entry)
        # A dependency cycle can never be satisfied: fail its members instead of waiting forever.
        for entry in entries:
            if entry.state == PLANNED and in_cycle(entry):
                self._finish(entry, FAILED, Status.FAILED, "dependency cycle through 'after'")

    def _check_unknown_disabled(
        self,
        entries: list[Entry],
        hooks: list[HookState],
        legacy: list[LegacyState],
        plugin_names: set[str],
    ) -> None:
        known: set[str] = set(plugin_names)
        for entry in self._entries:
            known |= entry.names()
        known |= set(self._groups)
        known |= {g.legacy_name for g in self._groups.values() if g.legacy_name}
        known |= {h.hook.name for h in self._hooks}
        known |= {lg.patch.name for lg in self._legacy}
        for record in self._records:
            if record.kind == "plugin":
                known.add(record.name)
                if record.provenance.distribution:
                    known.add(normalize_name(record.provenance.distribution))
        unknown = sorted(
            n for n in self._disabled if n not in known and normalize_name(n) not in known
        )
        for name in unknown:
            message = f"disable() names {name!r}, which matches no patch, group, hook or plugin"
            if self._strict:
                raise PatchDefinitionError(f"ascend-patch (strict): {message}")
            self._warn(message)

    # ------------------------------------------------------------------ starting

    def _start(
        self, entries: list[Entry], hooks: list[HookState], legacy: list[LegacyState]
    ) -> None:
        immediate: list[Entry] = []
        for entry in entries:
            self._advance(entry)
            if entry.state == APPLIED and entry.immediate:
                immediate.append(entry)
        for hook in hooks:
            immediate.extend(self._start_hook(hook))
        for state in legacy:
            self._start_legacy(state)
        self._scan_stale(immediate)

    def _in_apply_call(self) -> bool:
        return self._applying_thread == threading.get_ident()

    def _advance(self, entry: Entry) -> None:
        """Move an entry as far as it can go now. Safe to call from any thread, any time."""
        with self._lock:
            if entry.state not in (PLANNED, PENDING):
                return
            for dep in entry.deps:
                if dep.state in FINAL_NOT_APPLIED:
                    reason = f"needs {dep.patch.name!r}, which is {dep.state}"
                    self._finish(entry, SKIPPED, Status.SKIPPED, reason)
                    return
            waiting_dep = next((d for d in entry.deps if d.state != APPLIED), None)
            if waiting_dep is not None:
                entry.state = PENDING
                entry.record.set(Status.PENDING, f"waiting for {waiting_dep.patch.name!r}")
                return
            missing_module = next(
                (m for m in entry.patch.after_import if m not in sys.modules), None
            )
            if missing_module is not None:
                self._wait_for(entry, missing_module)
                return
        self._settle_initializing(entry.patch.path)
        found = resolve(entry.patch.path, create=entry.patch.create)
        if isinstance(found, Waiting):
            with self._lock:
                if entry.state in (PLANNED, PENDING):
                    # Which prefix is the module cannot be known without importing, so
                    # every candidate is watched: the patch lands as soon as the
                    # defining module has run, before a package __init__ re-exports it.
                    for candidate in candidate_modules(entry.patch.path, found.module):
                        self._wait_for(entry, candidate)
                    entry.record.set(Status.PENDING, f"waiting for import of {found.module}")
            # Another thread may have started importing the module between resolve()
            # and watch(): its loader is then not wrapped, so no callback will come.
            # Wait for that import to finish and look again.
            if import_in_progress(found.module):
                wait_for_import(found.module)
                module = sys.modules.get(found.module)
                if module is not None and not initializing(module):
                    self._on_import(entry, found.module)
            return
        if isinstance(found, Missing):
            unfinished = initializing_prefixes(entry.patch.path)
            with self._lock:
                if entry.state not in (PLANNED, PENDING):
                    return
                if unfinished:
                    # A module on the path is still running its body (in another
                    # thread): the name may yet be defined. Look again when it is done.
                    for name in unfinished:
                        self._wait_for(entry, name)
                    return
                self._finish(entry, SKIPPED, Status.SKIPPED, f"target not found: {found.reason}")
            self._advance_dependents(entry)
            return
        self._install(entry, found)

    def _wait_for(self, entry: Entry, module: str) -> None:
        entry.state = PENDING
        entry.record.set(Status.PENDING, f"waiting for import of {module}")
        if module not in entry.watching:
            entry.watching[module] = hub.watch(
                module, functools.partial(self._entry_imported, entry, module)
            )

    def _entry_imported(self, entry: Entry, name: str, module: types.ModuleType) -> None:
        self._on_import(entry, name)

    def _on_import(self, entry: Entry, module: str) -> None:
        with self._lock:
            handle = entry.watching.pop(module, None)
        if handle is not None:
            hub.unwatch(handle)
        self._advance(entry)

    @staticmethod
    def _settle_initializing(path: TargetPath) -> None:
        """Wait for modules on the path that another thread is still importing."""
        name = ""
        for segment in path.segments[:-1]:
            name = f"{name}.{segment.name}" if name else segment.name
            module = sys.modules.get(name)
            if module is None:
                return
            if initializing(module):
                # Blocks until the other thread's import finishes; returns at once if
                # this thread is the one importing (a circular import).
                wait_for_import(name)

    def _install(self, entry: Entry, slot: Slot) -> None:
        with self._lock:
            if entry.state not in (PLANNED, PENDING):
                return
            entry.state = INSTALLING
            for handle in entry.watching.values():
                hub.unwatch(handle)
            entry.watching.clear()
        patch = entry.patch
        try:
            original_raw = slot.raw
            original = inner_callable(original_raw)
            if original is ABSENT:  # a slot that create=True will make
                original = None
            if patch.precheck is not None:
                try:
                    ok = patch.call_precheck(original)
                except SkipPatch as skip:
                    raise Skip(str(skip) or "precheck skipped the patch") from skip
                except Exception as exc:
                    raise PatchError(f"precheck raised {type(exc).__name__}: {exc}") from exc
                if not ok:
                    raise Skip("precheck returned False")
            new_inner = self._build(entry, original)
            new_raw = (
                adapt_to_descriptor(original_raw, new_inner) if slot.kind == "class" else new_inner
            )
            entry.original, entry.new_inner = original, new_inner
            site = entry.primary
            modules_before = module_ids()
            slot.install(new_raw)
            with self._lock:
                cancelled = entry.state != INSTALLING  # revert() ran meanwhile
                if not cancelled:
                    site.slot, site.installed, site.installed_inner = slot, new_raw, new_inner
                    site.modules_before = modules_before
                    self._log.append(site)
                    entry.immediate = self._in_apply_call()
                    entry.state = APPLIED
                    entry.record.set(Status.APPLIED, None)
            if cancelled:
                if slot.current() is new_raw:
                    slot.restore()
                entry.record.set(Status.REVERTED, "reverted while it was being installed")
                return
            self._watch_with_imports(entry, site)
        except Skip as skip:
            with self._lock:
                self._finish(entry, SKIPPED, Status.SKIPPED, str(skip))
        except Exception as exc:
            reason = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._finish(entry, FAILED, Status.FAILED, f"{reason} [{who(entry)}]")
            if self._strict:
                self._advance_dependents(entry)
                raise PatchError(
                    f"ascend-patch (strict): could not apply {who(entry)}: {reason}"
                ) from exc
        if entry.state == APPLIED:
            for alias in entry.alias_sites:
                self._advance_alias(entry, alias)
        self._advance_dependents(entry)

    def _advance_dependents(self, entry: Entry) -> None:
        for dependent in list(entry.dependents):
            self._advance(dependent)

    def _build(self, entry: Entry, original: Any) -> Any:
        patch = entry.patch
        replacement = patch.replacement
        if isinstance(replacement, str):
            try:
                replacement = resolve_string(replacement)
            except ModuleNotFoundError as exc:
                if patch.target_wrapper is None:
                    raise Skip(
                        f"replacement {patch.replacement!r} is not importable: {exc}"
                    ) from exc
                replacement = None
        if replacement is None:
            if patch.target_wrapper is None:
                raise PatchError("no replacement")
            if original is None:
                raise Skip("target_wrapper has no original to wrap (the target is None)")
            try:
                replacement = patch.target_wrapper(original)
            except Exception as exc:
                raise PatchError(f"target_wrapper raised {type(exc).__name__}: {exc}") from exc
        if patch.replacement_wrapper is not None:
            try:
                replacement = patch.replacement_wrapper(replacement)
            except Exception as exc:
                raise PatchError(f"replacement_wrapper raised {type(exc).__name__}: {exc}") from exc
        if patch.runtime_check is not None:
            descriptor = (
                type(replacement) if isinstance(replacement, (staticmethod, classmethod)) else None
            )
            function = inner_callable(replacement) if descriptor else replacement
            if not callable(function) or not callable(original):
                raise PatchError(
                    "runtime_check needs a callable replacement and a callable original"
                )
            assert entry.counters is not None
            from ._wrappers import make_runtime_check_wrapper

            replacement = make_runtime_check_wrapper(
                patch.runtime_check, function, original, entry.counters
            )
            if descriptor is not None:
                replacement = descriptor(replacement)
        return replacement

    def _watch_with_imports(self, entry: Entry, site: Site) -> None:
        """After a with_imports trampoline's first call, install the function itself."""
        inner = inner_callable(site.installed)
        if getattr(inner, "__ascend_patch_with_imports__", None) is None:
            return  # the common case: no with_imports trampoline, nothing to import
        from ._with_imports import lazy_imports_of

        state = lazy_imports_of(inner)
        if state is None:
            return
        trampoline_raw = site.installed

        def swap() -> None:
            with self._lock:
                if site.slot is None or site.installed is not trampoline_raw:
                    return
                if site.slot.current() is not trampoline_raw:
                    return
                new_raw = (
                    adapt_to_descriptor(trampoline_raw, state.func)
                    if isinstance(trampoline_raw, (staticmethod, classmethod))
                    else state.func
                )
                modules_before = module_ids()
                site.slot.install(new_raw)
                site.installed, site.installed_inner = new_raw, state.func
                site.modules_before = modules_before

        state.on_resolved.append(swap)

    def _advance_alias(self, entry: Entry, site: Site) -> None:
        path = site.path.text
        if site.slot is not None or entry.state != APPLIED:
            return
        self._settle_initializing(site.path)
        found = resolve(site.path, create=entry.patch.create)
        if isinstance(found, Waiting):
            entry.record.aliases[path] = f"pending: waiting for import of {found.module}"
            with self._lock:
                if entry.state != APPLIED:
                    return
                for candidate in candidate_modules(site.path, found.module):
                    key = f"alias:{path}:{candidate}"
                    if key not in entry.watching:
                        callback = functools.partial(self._alias_imported, entry, site, key)
                        entry.watching[key] = hub.watch(candidate, callback)
            return
        self._stop_alias_watches(entry, path)
        if isinstance(found, Missing):
            entry.record.aliases[path] = f"not found: {found.reason}"
            entry.record.warnings.append(f"alias {path} not found: {found.reason}")
            return
        primary = entry.primary.slot
        if primary is not None and found.owner is primary.owner and found.key == primary.key:
            entry.record.aliases[path] = "same slot as the target"
            return
        if found.raw is entry.primary.installed or inner_callable(found.raw) is entry.new_inner:
            # Imported from the patched target after installation (a re-export):
            # it already holds the replacement, and revert() gives it the original back.
            entry.record.aliases[path] = "applied"
            return
        try:
            original = inner_callable(found.raw)
            if original is ABSENT:  # create=True: the alias slot is made too
                original = None
            new_inner = (
                entry.new_inner if original is entry.original else self._build(entry, original)
            )
            new_raw = (
                adapt_to_descriptor(found.raw, new_inner) if found.kind == "class" else new_inner
            )
            modules_before = module_ids()
            found.install(new_raw)
        except Exception as exc:
            entry.record.aliases[path] = f"failed: {exc}"
            entry.record.warnings.append(f"alias {path} failed: {exc}")
            return
        with self._lock:
            cancelled = entry.state != APPLIED  # revert() ran meanwhile
            if not cancelled:
                site.slot, site.installed, site.installed_inner = found, new_raw, new_inner
                site.modules_before = modules_before
                self._log.append(site)
        if cancelled:
            if found.current() is new_raw:
                found.restore()
            return
        entry.record.aliases[path] = "applied"

    def _alias_imported(self, entry: Entry, site: Site, key: str, module: types.ModuleType) -> None:
        with self._lock:
            handle = entry.watching.pop(key, None)
        if handle is not None:
            hub.unwatch(handle)
        self._advance_alias(entry, site)

    def _stop_alias_watches(self, entry: Entry, path: str) -> None:
        prefix = f"alias:{path}:"
        with self._lock:
            keys = [k for k in entry.watching if k.startswith(prefix)]
            handles = [entry.watching.pop(k) for k in keys]
        for handle in handles:
            hub.unwatch(handle)

    def _finish(self, entry: Entry, state: str, status: Status, reason: str | None) -> None:
        entry.state = state
        entry.record.set(status, reason)
        for handle in entry.watching.values():
            hub.unwatch(handle)
        entry.watching.clear()

    # ------------------------------------------------------------------ module hooks, legacy

    def _start_hook(self, state: HookState) -> list[Entry]:
        hook = state.hook
        if state.record.status is Status.SKIPPED:
            return []
        for requirement in hook.requires:
            ok, why = check_requirement(requirement, metadata)
            if not ok:
                state.record.set(Status.SKIPPED, f"requires {requirement}: {why}")
                return []
        state.handle = hub.watch_pattern(hook.pattern, functools.partial(self._visit_hook, state))
        state.record.set(Status.APPLIED, "watching")
        produced: list[Entry] = []
        from ._stale import loaded_modules

        for name, module in sorted(loaded_modules().items(), key=lambda kv: kv[0]):
            if module is not None and fnmatch.fnmatchcase(name, hook.pattern):
                produced.extend(self._visit(state, module))
        return [e for e in produced if e.state == APPLIED]

    def _visit_hook(self, state: HookState, module: types.ModuleType) -> None:
        self._visit(state, module)

    def _visit(self, state: HookState, module: types.ModuleType) -> list[Entry]:
        if id(module) in state.visited or state.record.status not in (Status.APPLIED,):
            return []
        state.visited.add(id(module))
        name = getattr(module, "__name__", "?")
        try:
            produced = list(state.hook.callback(module) or ())
            bad = [p for p in produced if not isinstance(p, AtomicPatch)]
            if bad:
                raise TypeError(f"returned {bad[0]!r}; expected AtomicPatch objects")
        except Exception as exc:
            message = f"callback failed on {name}: {type(exc).__name__}: {exc}"
            state.record.warnings.append(message)
            if self._strict:
                raise PatchError(
                    f"ascend-patch (strict): hook {state.hook.name!r} {message}"
                ) from exc
            return []
        state.modules += 1
        entries = []
        with self._lock:
            for patch in produced:
                record = Record(
                    "patch",
                    patch.name,
                    patch.target,
                    group=state.hook.name,
                    provenance=state.provenance,
                )
                entry = Entry(patch, record, state.hook.name, state.provenance)
                if patch.runtime_check is not None:
                    entry.counters = record.counters = CallCounters()
                if entry.names() & self._disabled:
                    self._finish(entry, SKIPPED, Status.SKIPPED, "disabled")
                self._records.append(record)
                entries.append(entry)
            self._check_collisions(entries)
            self._entries.extend(entries)
        for entry in entries:
            self._advance(entry)
        state.record.set(Status.APPLIED, f"watching; visited {state.modules} module(s)")
        return entries

    def _start_legacy(self, state: LegacyState) -> None:
        if state.record.status in (Status.SKIPPED, Status.FAILED):
            return
        module_name = state.patch.target_module
        assert module_name is not None
        state.record.set(Status.PENDING, f"waiting for import of {module_name}")
        state.handle = hub.when_imported(module_name, functools.partial(self._run_legacy, state))

    def _run_legacy(self, state: LegacyState, module: types.ModuleType) -> None:
        with self._lock:
            if state.done:
                return
            state.done = True
            state.handle = None
        try:
            state.patch.func(module, state.patch.options)
        except Exception as exc:
            state.record.set(Status.FAILED, f"{type(exc).__name__}: {exc}")
            if self._strict:
                raise PatchError(
                    f"ascend-patch (strict): legacy patch {state.patch.name!r} failed: {exc}"
                ) from exc
            return
        state.record.set(Status.APPLIED, None)

    # ------------------------------------------------------------------ rules, env, settings

    def _activate_rule(self, rule: ImportRule, provenance: Provenance) -> None:
        record = Record("rule", rule.describe(), rule.module, provenance=provenance)
        with self._lock:
            self._records.append(record)
            self._rules.append((rule, record))
        rule.activate(record)

    def _apply_env(self, setting: Any, provenance: Provenance) -> None:
        record = Record(
            "env", setting.name, f"{setting.name}={setting.value}", provenance=provenance
        )
        current = os.environ.get(setting.name)
        if current is not None:
            record.set(Status.SKIPPED, f"the user set {setting.name}={current}")
        else:
            os.environ[setting.name] = setting.value
            self._env_set.append((setting.name, setting.value))
            record.set(Status.APPLIED, setting.why or None)
        with self._lock:
            self._records.append(record)

    def _start_settings(self) -> None:
        if (
            self._profiling is not None
            or self._brake_step is not None
            or self._precision_check is not None
        ):
            from ._training import start_training_utilities

            records, undo = start_training_utilities(
                profiling=self._profiling,
                brake_step=self._brake_step,
                precision_check=self._precision_check,
                patcher=self,
            )
            with self._lock:
                self._records.extend(records)
                self._setting_restores.append(undo)
        if self._internal_format is not None:
            value = self._internal_format
            record = Record(
                "setting",
                "allow_internal_format",
                f"torch.npu.config.allow_internal_format={value}",
            )
            self._records.append(record)

            def set_format(_module: types.ModuleType) -> None:
                try:
                    import torch

                    config = torch.npu.config
                    previous = config.allow_internal_format
                    config.allow_internal_format = value
                except Exception as exc:
                    record.set(Status.FAILED, f"cannot set it: {exc!r}")
                    return
                self._setting_restores.append(
                    lambda: setattr(config, "allow_internal_format", previous)
                )
                record.set(Status.APPLIED, None)

            record.set(Status.PENDING, "waiting for import of torch_npu")
            handle = hub.when_imported("torch_npu", set_format)
            self._setting_restores.append(lambda: hub.unwatch(handle))

    # ------------------------------------------------------------------ stale references

    def _scan_stale(self, entries: list[Entry]) -> None:
        candidates = [
            e
            for e in entries
            if e.primary.slot is not None
            and e.primary.slot.kind == "module"
            and e.original is not None
            and not isinstance(e.original, (types.ModuleType, int, float, str, bool, type(None)))
        ]
        if not candidates:
            return
        originals = {id(e.original): e.original for e in candidates}
        exclude = {
            id(s.slot.owner)
            for e in candidates
            for s in (e.primary, *e.alias_sites)
            if s.slot is not None
        }
        from ._stale import find_holders

        holders = find_holders(originals, exclude, own_modules(candidates))
        for entry in candidates:
            found = holders.get(id(entry.original), [])
            if not found:
                continue
            rebind = entry.patch.rebind if entry.patch.rebind is not None else self.rebind_stale
            for module, name in found:
                label = f"{module.__name__}.{name}"
                if rebind:
                    setattr(module, name, entry.new_inner)
                    entry.primary.rebinds.append((module, name, entry.original))
                    entry.record.rebound_holders.append(label)
                else:
                    entry.record.stale_holders.append(label)
            if entry.record.stale_holders:
                entry.record.warnings.append(
                    f"{len(entry.record.stale_holders)} module(s) imported the original before apply(); "
                    "call apply() earlier, or pass rebind_stale=True"
                )

    # ------------------------------------------------------------------ revert

    def revert(self) -> Report:
        """Undo everything this patcher did, in reverse order, restoring originals by identity.

        A slot that someone else changed after we patched it is left alone and reported.
        Returns the report (applied patches now say ``reverted``).
        """
        with self._lock:
            log = list(self._log)
            self._log.clear()
            entries, self._entries = self._entries, []
            hooks, self._hooks = self._hooks, []
            legacy, self._legacy = self._legacy, []
            rules, self._rules = self._rules, []
            env_set, self._env_set = self._env_set, []
            restores, self._setting_restores = self._setting_restores, []
            self._applied = False
            # Every entry leaves the game now, under the lock: a thread that is about to
            # install one (an import finishing right now) sees REVERTED and stops, and one
            # that is installing undoes its own installation (see _install).
            before = {id(entry): entry.state for entry in entries}
            for entry in entries:
                entry.state = REVERTED
                for handle in entry.watching.values():
                    hub.unwatch(handle)
                entry.watching.clear()
        for hook in hooks:
            if hook.handle is not None:
                hub.unwatch(hook.handle)
                hook.handle = None
        self._restore_late_holders(log, entries)
        for site in reversed(log):
            self._restore_site(site)
        for entry in entries:
            if before[id(entry)] == APPLIED:
                entry.record.set(Status.REVERTED, None)
            elif before[id(entry)] in (PLANNED, PENDING):
                entry.record.set(Status.REVERTED, "reverted before its target was imported")
        for hook in hooks:
            if hook.record.status is Status.APPLIED:
                hook.record.set(Status.REVERTED, None)
        for state in legacy:
            if state.handle is not None:
                hub.unwatch(state.handle)
            if state.record.status is Status.APPLIED:
                state.record.set(Status.APPLIED, "a legacy patch function cannot be reverted")
                self._warn(
                    f"legacy patch {state.patch.name!r} cannot be reverted; its changes remain"
                )
        for restore in reversed(restores):
            restore()
        for rule, record in reversed(rules):
            for warning in rule.deactivate():
                self._warn(warning)
            if record.status in (Status.APPLIED, Status.PENDING):
                record.set(Status.REVERTED, None)
        for name, value in reversed(env_set):
            if os.environ.get(name) == value:
                del os.environ[name]
        report = Report(list(self._records), list(self._warnings), self._lock)
        with self._lock:
            self._records = []
            self._warnings = []
            self._groups = {}
        return report

    @staticmethod
    def _restore_late_holders(log: list[Site], entries: list[Entry]) -> None:
        """Give back the original to modules that imported the replacement while applied.

        ``from x import f`` executed after the patch binds the replacement; without
        this, such modules would keep it after revert() and the undo would not be exact.
        """
        pairs: dict[int, tuple[Any, Any, frozenset[int]]] = {}
        owners: set[int] = set()
        for site in log:
            slot = site.slot
            if (
                slot is None
                or slot.kind != "module"
                or not slot.own
                or not callable(site.installed_inner)
            ):
                continue
            pairs[id(site.installed_inner)] = (site.installed_inner, slot.raw, site.modules_before)
            owners.add(id(slot.owner))
        if not pairs:
            return
        from ._stale import find_holders

        holders = find_holders({k: v[0] for k, v in pairs.items()}, owners, own_modules(entries))
        for key, found in holders.items():
            installed, original, modules_before = pairs[key]
            for module, name in found:
                if id(module) in modules_before:
                    continue  # loaded before the install: it holds the object for itself
                if vars(module).get(name) is installed:
                    setattr(module, name, original)

    def _restore_site(self, site: Site) -> None:
        slot = site.slot
        if slot is None:
            return
        for module, name, original in reversed(site.rebinds):
            if vars(module).get(name) is site.installed_inner:
                setattr(module, name, original)
        site.rebinds.clear()
        current = slot.current()
        if current is site.installed:
            slot.restore()
        else:
            self._warn(
                f"{site.path.text} was changed by someone else after it was patched; "
                "left as is (the original was not restored)"
            )
        site.slot = None
        site.installed = site.installed_inner = None

    def _undo_entry(self, entry: Entry, status: Status, reason: str) -> None:
        with self._lock:
            sites = [s for s in (entry.primary, *entry.alias_sites) if s.slot is not None]
            for site in sites:
                if site in self._log:
                    self._log.remove(site)
            state = entry.state
            self._finish(entry, SKIPPED, status, reason)
        if state == APPLIED:
            for site in reversed(sites):
                self._restore_site(site)

    def _warn(self, message: str) -> None:
        with self._lock:
            if message not in self._warnings:
                self._warnings.append(message)
