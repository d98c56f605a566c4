"""What the installed plugins declare, planned without applying anything.

``ascend-patch doctor`` and ``ascend-patch scan`` need every plugin's patches, import
rules and environment defaults, expanded to single targets, with the verdicts
``apply()`` would reach -- but must neither apply them nor import a target library.
So they run the same planner as ``apply()`` (``_engine.plan``) in a dry run: on a fresh
ledger, with groups expanded even where their requirement is unmet, disabled or
opt-in (each patch then carries that verdict). Loading a plugin runs its hooks,
which by contract (docs/plugin-authors.md) only return declarations. Distribution
facts come from a fresh metadata view, not from the on-disk cache, so a
just-installed or just-broken plugin shows as it is.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from .._discovery.metadata import MetadataCache
from .._discovery.metadata import normalize_name
from .._discovery.plugin_serves import IDLE
from .._discovery.registry import PluginSelection
from .._discovery.registry import load_plugins
from .._discovery.registry import unknown_names
from .._discovery.requires import check_requirement
from .._install.entries import Entry
from .._install.entries import HookState
from .._install.entries import Ledger
from .._install.entries import LegacyState
from .._model.env_flags import CLI_PLUGIN_TIMEOUT_S
from .._model.patch import EnvSetting
from .._model.report import FAILED
from .._model.report import PENDING
from .._model.report import SKIPPED
from .._model.report import Provenance
from .._model.value import Value
from ..imports._rules import ImportRule
from ..imports._rules import InjectImport
from ..imports._rules import ReplaceImport
from .plan import Declared
from .plan import Plan
from .plan import conflicting_groups
from .plan import known_names
from .plan import plan
from .plan import switched_on


__all__ = [
    "DeclaredPatch",
    "DeclaredRule",
    "Inventory",
    "PluginInfo",
    "Requirement",
    "collect",
]


class Requirement(Value):
    """One requirement of a patch and whether it holds here."""

    __slots__ = ("detail", "satisfied", "text")
    _fields = ("text", "satisfied", "detail")

    def __init__(self, text: str, satisfied: bool, detail: str) -> None:
        self.text = text
        self.satisfied = satisfied
        self.detail = detail


class DeclaredPatch(Value):
    """One patch as declared: an AtomicPatch, a ModuleHook or a 1.0 function patch."""

    __slots__ = (
        "after",
        "aliases",
        "group",
        "kind",
        "library",
        "library_installed",
        "name",
        "note",
        "plugin",
        "requirements",
        "target",
        "verdict",
    )
    _fields = ("plugin", "kind", "name", "group", "target", "aliases", "requirements", "after")

    def __init__(
        self,
        plugin: str,
        kind: str,
        name: str,
        group: str | None,
        target: str,
        aliases: tuple[str, ...],
        requirements: tuple[Requirement, ...],
        after: tuple[str, ...],
        library: str,
        library_installed: bool,
        verdict: str | None = None,
        note: str | None = None,
    ) -> None:
        self.plugin = plugin
        #: "patch", "hook" (ModuleHook) or "legacy".
        self.kind = kind
        self.name = name
        self.group = group
        #: Dotted target; a ModuleHook's module pattern; a legacy patch's module.
        self.target = target
        self.aliases = aliases
        self.requirements = requirements
        self.after = after
        #: Top-level import name of the patched library.
        self.library = library
        self.library_installed = library_installed
        #: Why the plan would not apply it besides requirements (disabled, opt-in, a
        #: broken ``after=``), or None.
        self.verdict = verdict
        #: The patch's ``note`` (how it works, e.g. ``kernel: mx_driving``), or None.
        self.note = note

    @property
    def applicable(self) -> bool:
        """Whether apply() would install it here: library installed, in range, not held back."""
        return self.not_applicable_reason is None

    @property
    def not_applicable_reason(self) -> str | None:
        if not self.library_installed:
            return f"{self.library} is not installed"
        unmet = [r for r in self.requirements if not r.satisfied]
        if unmet:
            return f"requires {unmet[0].text}: {unmet[0].detail}"
        return self.verdict


class DeclaredRule(Value):
    """One import rule a plugin declares."""

    __slots__ = ("attribute", "description", "in_use", "kind", "module", "plugin", "real_origin")
    _fields = ("plugin", "kind", "module", "description", "attribute", "in_use", "real_origin")

    def __init__(
        self,
        plugin: str,
        kind: str,
        module: str,
        description: str,
        attribute: str | None,
        in_use: str | None = None,
        real_origin: str | None = None,
    ) -> None:
        self.plugin = plugin
        #: "skip", "replace" or "inject".
        self.kind = kind
        #: The module served (skip, replace) or injected into (inject).
        self.module = module
        self.description = description
        #: For inject: the attribute set on ``module``.
        self.attribute = attribute
        #: For a rule that serves its module only when the real one is missing
        #: (``when_missing``): which one an import gets here -- "real", "replacement",
        #: or "none" (its top-level package is not installed). None for other rules.
        self.in_use = in_use
        #: Where the real module is, when ``in_use`` is "real".
        self.real_origin = real_origin


class PluginInfo:
    """A discovered plugin: where it comes from, its state, what it declares."""

    def __init__(self, name: str, provenance: Provenance, status: str, reason: str | None) -> None:
        self.name = name
        self.provenance = provenance
        #: "loaded", "broken", "disabled" (by a switch) or "not selected".
        self.status = status
        self.reason = reason
        self.warnings: list[str] = []
        self.patches: list[DeclaredPatch] = []
        self.rules: list[DeclaredRule] = []
        self.env: list[EnvSetting] = []
        #: Declaration errors: apply() would record these as failed.
        self.errors: list[str] = []
        #: Group names with their ``conflicts_with``.
        self.groups: dict[str, tuple[str, ...]] = {}
        #: Group names with their ``opt_in`` and ``requires``, in declaration order.
        self.group_facts: dict[str, tuple[bool, tuple[str, ...]]] = {}


class Inventory:
    """Every selected plugin and what its plan says: the doctor's and the scanner's view."""

    def __init__(
        self, plugins: list[PluginInfo], warnings: list[str], selection: PluginSelection
    ) -> None:
        self.plugins = plugins
        #: Unknown names in the selection lists, and similar.
        self.warnings = warnings
        self.selection = selection
        self._collisions: list[tuple[str, list[DeclaredPatch]]] = []
        self._conflicts: list[tuple[str, str, str]] = []
        self._missing: list[tuple[DeclaredPatch, str]] = []
        self._known: set[str] = set()

    def loaded(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.status == "loaded"]

    def patches(self) -> list[DeclaredPatch]:
        return [patch for plugin in self.loaded() for patch in plugin.patches]

    def rules(self) -> list[DeclaredRule]:
        return [rule for plugin in self.loaded() for rule in plugin.rules]

    def collisions(self) -> list[tuple[str, list[DeclaredPatch]]]:
        """Targets patched more than once (as target or alias), in declaration order."""
        return list(self._collisions)

    def group_conflicts(self) -> list[tuple[str, str, str]]:
        """(plugin, group, other) for enabled groups that declare each other in conflicts_with."""
        return list(self._conflicts)

    def missing_dependencies(self) -> list[tuple[DeclaredPatch, str]]:
        """Patches whose ``after=`` names no patch or group of any loaded plugin."""
        return list(self._missing)

    def unknown_given(self, names: Iterable[str], switch: str) -> list[str]:
        """Warnings for names given to ``switch`` that match no plugin, group or patch."""
        from .._discovery.registry import close_match

        out = []
        for name in unknown_names(names, self._known):
            hint = close_match(name, sorted(self._known))
            out.append(
                f"{switch} names {name!r}, which matches no plugin, group or patch"
                + (f" (did you mean {hint!r}?)" if hint else "")
            )
        return out


class _Installed:
    """find_spec of top-level names only: that never imports anything."""

    def __init__(self) -> None:
        self._known: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        if name not in self._known:
            try:
                self._known[name] = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                self._known[name] = False
        return self._known[name]


def _library(target: str) -> str:
    return target.replace(":", ".").partition(".")[0]


def _patch_of(entry: Entry, installed: _Installed) -> DeclaredPatch:
    record = entry.record
    verdict = None
    if record.status in (SKIPPED, FAILED) and not (record.reason or "").startswith("requires "):
        verdict = record.reason
    library = _library(entry.patch.target)
    return DeclaredPatch(
        record.provenance.plugin or "?",
        "patch",
        entry.patch.name,
        record.group,
        entry.patch.path.key,
        tuple(p.key for p in entry.patch.alias_paths),
        tuple(Requirement(*v) for v in entry.verdicts),
        entry.after,
        library,
        installed(library),
        verdict,
        entry.patch.note,
    )


def _hook_of(state: HookState, meta: MetadataCache, installed: _Installed) -> DeclaredPatch:
    library = _library(state.hook.pattern)
    requirements = tuple(Requirement(t, *check_requirement(t, meta)) for t in state.requires)
    verdict = state.record.reason if state.record.status is not PENDING else None
    return DeclaredPatch(
        state.provenance.plugin or "?",
        "hook",
        state.hook.name,
        state.group,
        state.hook.pattern,
        (),
        requirements,
        (),
        library,
        installed(library),
        verdict,
    )


def _legacy_of(state: LegacyState, installed: _Installed) -> DeclaredPatch:
    module = state.patch.target_module or "?"
    library = _library(module)
    verdict = state.record.reason if state.record.status is not PENDING else None
    return DeclaredPatch(
        state.provenance.plugin or "?", "legacy", state.patch.name, None, module, (), (), (),
        library, installed(library), verdict,
    )  # fmt: skip


def _rule(plugin: str, rule: ImportRule) -> DeclaredRule:
    attribute = rule.name if isinstance(rule, InjectImport) else None
    in_use = origin = None
    if isinstance(rule, ReplaceImport) and rule.when_missing:
        installed, origin = rule.locate_real()  # found, not imported
        in_use = "real" if origin is not None else "replacement" if installed else "none"
    return DeclaredRule(plugin, rule.kind, rule.module, rule.describe(), attribute, in_use, origin)


def _status(reason: str | None, failed: bool, skipped: bool) -> str:
    if failed:
        return "broken"
    if skipped:
        if (reason or "").startswith(IDLE):
            return "idle"
        return "disabled" if "disabled" in (reason or "") else "not selected"
    return "loaded"


def collect(
    *,
    disable: Iterable[str] = (),
    plugins: Iterable[str] | None = None,
    enable: Iterable[str] = (),
    meta: MetadataCache | None = None,
    load_idle: bool = False,
) -> Inventory:
    """Load the selected plugins (switches from the environment, plus these) and plan their declarations.

    ``disable`` names plugins to leave unloaded and patches or groups to plan as
    disabled; ``plugins`` is an allow-list. Plugins none of whose served libraries
    is installed stay unloaded, as in ``apply()`` (status ``idle``), unless
    ``load_idle`` (scan: code is read for what it would need, wherever it runs). Each plugin gets the commands' bound
    (:data:`~._env_flags.CLI_PLUGIN_TIMEOUT_S`) to load unless ``ASCEND_PATCH_PLUGIN_TIMEOUT``
    is set. Opt-in groups named by ``enable`` or
    ``ASCEND_PATCH_ENABLE`` are planned as enabled, the others as held back.
    """
    meta = MetadataCache(persistent=False) if meta is None else meta
    disable = list(disable)
    selection = PluginSelection.from_env(
        plugins=list(plugins) if plugins is not None else None,
        enable=list(enable),
        timeout=CLI_PLUGIN_TIMEOUT_S,
    )
    loaded, records, warnings = load_plugins(
        selection, meta, also_disabled=disable, skip_idle=not load_idle
    )
    by_name = {plugin.name: plugin for plugin in loaded}
    infos: dict[str, PluginInfo] = {}
    declared: list[Declared] = []
    for record in records:
        status = _status(record.reason, record.status is FAILED, record.status is SKIPPED)
        info = infos[record.name] = PluginInfo(
            record.name, record.provenance, status, record.reason
        )
        info.warnings.extend(record.warnings)
        plugin = by_name.get(record.name)
        if plugin is None or status != "loaded":
            continue
        info.provenance = plugin.provenance
        info.env = list(plugin.env)
        info.rules = [_rule(info.name, rule) for rule in plugin.rules]
        declared.extend(Declared(item, None, plugin.provenance) for item in plugin.patches)
    inventory = Inventory(list(infos.values()), warnings, selection)
    ledger = Ledger()
    planned = plan(
        declared, ledger, meta, disabled=frozenset(disable), enabled=selection.enable, dry_run=True
    )
    _fill(inventory, infos, planned, ledger, meta, disable)
    return inventory


def _fill(
    inventory: Inventory,
    infos: dict[str, PluginInfo],
    planned: Plan,
    ledger: Ledger,
    meta: MetadataCache,
    disable: list[str],
) -> None:
    """Put the plan's entries, hooks and verdicts into the inventory, by plugin."""
    installed = _Installed()
    patch_of: dict[int, DeclaredPatch] = {}
    for entry in ledger.entries:
        patch = patch_of[id(entry)] = _patch_of(entry, installed)
        infos[patch.plugin].patches.append(patch)
    for state in ledger.hooks:
        infos[state.provenance.plugin or "?"].patches.append(_hook_of(state, meta, installed))
    for legacy in ledger.legacy:
        infos[legacy.provenance.plugin or "?"].patches.append(_legacy_of(legacy, installed))
    for name, (group, provenance) in planned.groups.items():
        info = infos[provenance.plugin or "?"]
        info.groups[name] = tuple(group.conflicts_with)
        info.group_facts[name] = (bool(group.opt_in), tuple(group.requires or ()))
    for record in ledger.records:
        if record.kind == "group" and record.status is FAILED and record.provenance.plugin:
            infos[record.provenance.plugin].errors.append(f"group {record.name}: {record.reason}")
    by_target: dict[str, list[DeclaredPatch]] = {}
    for path, first, later in planned.collisions:
        holders = by_target.setdefault(path, [patch_of[id(first)]])
        holders.append(patch_of[id(later)])
    inventory._collisions = list(by_target.items())
    owner = {name: provenance.plugin or "?" for name, (_, provenance) in planned.groups.items()}
    switched = frozenset(inventory.selection.enable)
    inventory._conflicts = [
        (owner[name], name, other)
        for name, other in conflicting_groups(
            [g for g, prov in planned.groups.values() if switched_on(g, prov, switched)], disable
        )
    ]
    inventory._missing = [(patch_of[id(entry)], name) for entry, name in planned.missing_after]
    plugin_names: set[str] = set()
    for info in infos.values():
        plugin_names |= {info.name, normalize_name(info.provenance.distribution or info.name)}
    groups = (group for group, _ in planned.groups.values())
    inventory._known = known_names(ledger, groups, plugin_names)
