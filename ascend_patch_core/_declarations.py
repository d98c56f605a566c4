"""What the installed plugins declare, read without applying anything.

``ascend-patch doctor`` and ``ascend-patch scan`` need every plugin's patches, import
rules and environment defaults, expanded to single targets, but must neither apply
them nor import a target library. Loading a plugin runs its hooks, which by contract
(docs/plugin-authors.md) only return declarations; ``Patch.patches()`` is free of side
effects for the same reason. Distribution facts come from a fresh metadata view, not
from the on-disk cache, so a just-installed or just-broken plugin shows as it is.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Iterable
from typing import NamedTuple

from ._env import EnvSetting
from ._metadata import MetadataCache
from ._metadata import normalize_name
from ._patch import AtomicPatch
from ._patch import LegacyPatch
from ._patch import ModuleHook
from ._patch import Patch
from ._patch import normalize_requires
from ._registry import PluginSelection
from ._registry import load_plugins
from ._report import Provenance
from ._report import Status
from ._requires import check_requirement
from ._rules import ImportRule
from ._rules import InjectImport


__all__ = [
    "DeclaredPatch",
    "DeclaredRule",
    "Inventory",
    "PluginInfo",
    "Requirement",
    "collect",
    "dotted",
]


def dotted(target: str) -> str:
    """A target path as one dotted name: ``pkg.mod:Cls.f`` -> ``pkg.mod.Cls.f``."""
    return target.replace(":", ".")


class Requirement(NamedTuple):
    text: str
    satisfied: bool
    detail: str


class DeclaredPatch(NamedTuple):
    """One patch as declared: an AtomicPatch, a ModuleHook or a 1.0 function patch."""

    plugin: str
    #: "patch", "hook" (ModuleHook) or "legacy".
    kind: str
    name: str
    group: str | None
    #: Dotted target; a ModuleHook's module pattern; a legacy patch's module.
    target: str
    aliases: tuple[str, ...]
    requirements: tuple[Requirement, ...]
    after: tuple[str, ...]
    #: Top-level import name of the patched library.
    library: str
    library_installed: bool

    @property
    def applicable(self) -> bool:
        """Whether apply() would consider it here: its library is installed and in range."""
        return self.library_installed and all(r.satisfied for r in self.requirements)

    @property
    def not_applicable_reason(self) -> str | None:
        if not self.library_installed:
            return f"{self.library} is not installed"
        unmet = [r for r in self.requirements if not r.satisfied]
        if unmet:
            return f"requires {unmet[0].text}: {unmet[0].detail}"
        return None


class DeclaredRule(NamedTuple):
    plugin: str
    #: "skip", "replace" or "inject".
    kind: str
    #: The module served (skip, replace) or injected into (inject).
    module: str
    description: str
    #: For inject: the attribute set on ``module``.
    attribute: str | None


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


class Inventory(NamedTuple):
    plugins: list[PluginInfo]
    #: Unknown names in the selection lists, and similar.
    warnings: list[str]
    selection: PluginSelection

    def loaded(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.status == "loaded"]

    def patches(self) -> list[DeclaredPatch]:
        return [patch for plugin in self.loaded() for patch in plugin.patches]

    def rules(self) -> list[DeclaredRule]:
        return [rule for plugin in self.loaded() for rule in plugin.rules]

    def collisions(self) -> list[tuple[str, list[DeclaredPatch]]]:
        """Targets patched more than once (as target or alias), in declaration order."""
        by_target: dict[str, list[DeclaredPatch]] = {}
        for patch in self.patches():
            if patch.kind != "patch":
                continue
            for path in (patch.target, *patch.aliases):
                holders = by_target.setdefault(path, [])
                if patch not in holders:
                    holders.append(patch)
        return [(target, found) for target, found in by_target.items() if len(found) > 1]

    def group_conflicts(self) -> list[tuple[str, str, str]]:
        """(plugin, group, other) for enabled groups that declare each other in conflicts_with."""
        groups: dict[str, str] = {}
        for plugin in self.loaded():
            for group in plugin.groups:
                groups.setdefault(group, plugin.name)
        found: list[tuple[str, str, str]] = []
        for plugin in self.loaded():
            for group, others in plugin.groups.items():
                found.extend((plugin.name, group, o) for o in others if o in groups and o != group)
        return found

    def missing_dependencies(self) -> list[tuple[DeclaredPatch, str]]:
        """Patches whose ``after=`` names no patch or group of any loaded plugin."""
        names = {p.name for p in self.patches()} | {dotted(p.target) for p in self.patches()}
        names |= {g for plugin in self.loaded() for g in plugin.groups}
        return [(p, a) for p in self.patches() for a in p.after if a not in names]

    def unknown_disabled(self, disabled: Iterable[str]) -> list[str]:
        """Warnings for names given to ``--disable`` that match no plugin, group or patch."""
        known: set[str] = set()
        for plugin in self.plugins:
            known |= {plugin.name, normalize_name(plugin.provenance.distribution or plugin.name)}
            known |= set(plugin.groups)
            for patch in plugin.patches:
                known |= {patch.name, patch.target, dotted(patch.target)}
        out = []
        for name in disabled:
            if name == "*" or name in known or normalize_name(name) in known:
                continue
            hint = difflib.get_close_matches(name, sorted(known), n=1)
            out.append(
                f"--disable names {name!r}, which matches no plugin, group or patch"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
            )
        return out


def _library(target: str) -> str:
    return target.replace(":", ".").partition(".")[0]


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


def _requirements(texts: Iterable[str], meta: MetadataCache) -> tuple[Requirement, ...]:
    out = []
    for text in texts:
        ok, why = check_requirement(text, meta)
        out.append(Requirement(text, ok, why))
    return tuple(out)


def _declare(
    plugin: PluginInfo,
    item: object,
    group: type[Patch] | None,
    meta: MetadataCache,
    installed: _Installed,
) -> None:
    group_name = group.name if group is not None else None
    extra_requires: tuple[str, ...] = ()
    extra_after: tuple[str, ...] = ()
    if group is not None:
        extra_requires = normalize_requires(group.requires, f"{group.__qualname__}.requires")
        extra_after = tuple(group.after)
    if isinstance(item, AtomicPatch):
        library = _library(item.target)
        plugin.patches.append(
            DeclaredPatch(
                plugin.name,
                "patch",
                item.name,
                group_name,
                dotted(item.target),
                tuple(dotted(a) for a in item.aliases),
                _requirements((*item.requires, *extra_requires), meta),
                (*item.after, *extra_after),
                library,
                installed(library),
            )
        )
    elif isinstance(item, ModuleHook):
        library = _library(item.pattern)
        plugin.patches.append(
            DeclaredPatch(
                plugin.name,
                "hook",
                item.name,
                group_name,
                item.pattern,
                (),
                _requirements((*item.requires, *extra_requires), meta),
                (),
                library,
                installed(library),
            )
        )
    elif isinstance(item, LegacyPatch):
        module = item.target_module or "?"
        library = _library(module)
        plugin.patches.append(
            DeclaredPatch(
                plugin.name,
                "legacy",
                item.name,
                group_name,
                module,
                (),
                (),
                (),
                library,
                installed(library),
            )
        )
    else:
        plugin.errors.append(
            f"{group.__qualname__ if group else 'register_patches'} returned {item!r}"
        )


def _expand(plugin: PluginInfo, items: Iterable[object], meta: MetadataCache) -> None:
    installed = _Installed()
    for item in items:
        if isinstance(item, type) and issubclass(item, Patch):
            plugin.groups[item.name] = tuple(item.conflicts_with)
            try:
                children = list(item.patches(None))
            except Exception as exc:
                plugin.errors.append(
                    f"group {item.name}: {item.__qualname__}.patches() raised {type(exc).__name__}: {exc}"
                )
                continue
            for child in children:
                try:
                    _declare(plugin, child, item, meta, installed)
                except Exception as exc:
                    plugin.errors.append(f"group {item.name}: {exc}")
        else:
            try:
                _declare(plugin, item, None, meta, installed)
            except Exception as exc:
                plugin.errors.append(str(exc))


def _rule(plugin: str, rule: ImportRule) -> DeclaredRule:
    attribute = rule.name if isinstance(rule, InjectImport) else None
    return DeclaredRule(plugin, rule.kind, rule.module, rule.describe(), attribute)


def collect(
    *,
    disable: Iterable[str] = (),
    plugins: Iterable[str] | None = None,
    meta: MetadataCache | None = None,
) -> Inventory:
    """Load the selected plugins (switches from the environment, plus these) and list their declarations.

    ``disable`` names plugins to leave unloaded (patch and group names are checked by
    :meth:`Inventory.unknown_disabled`); ``plugins`` is an allow-list.
    """
    meta = MetadataCache(persistent=False) if meta is None else meta
    disable = list(disable)
    selection = PluginSelection.from_env(plugins=list(plugins) if plugins is not None else None)
    loaded, records, warnings = load_plugins(selection, meta, also_disabled=disable)
    by_name = {plugin.name: plugin for plugin in loaded}
    infos: list[PluginInfo] = []
    for record in records:
        if record.status is Status.FAILED:
            status = "broken"
        elif record.status is Status.SKIPPED:
            status = "disabled" if "disabled" in (record.reason or "") else "not selected"
        else:
            status = "loaded"
        info = PluginInfo(record.name, record.provenance, status, record.reason)
        info.warnings.extend(record.warnings)
        plugin = by_name.get(record.name)
        if plugin is not None and status == "loaded":
            info.provenance = plugin.provenance
            info.env = list(plugin.env)
            info.rules = [_rule(info.name, rule) for rule in plugin.rules]
            _expand(info, plugin.patches, meta)
        infos.append(info)
    return Inventory(infos, warnings, selection)
