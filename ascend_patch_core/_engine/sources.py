"""Where a patcher's declarations come from, besides the user: the installed plugins.

Loads the selected plugins (``_discovery.registry``, each in isolation) and turns what their
hooks returned into declarations for the planner, with the plugin's provenance.
Import rules and environment defaults -- the plugins' and the user's -- are put in
place by :class:`Activations` at once, and taken back by revert(): a rule stops
serving its module, a variable a plugin set is unset again (one the user set is
never touched).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._discovery.metadata import metadata
from .._discovery.metadata import normalize_name
from .._discovery.registry import PluginSelection
from .._discovery.registry import load_plugins
from .._install.entries import Ledger
from .._model.errors import PluginError
from .._model.patch import EnvSetting
from .._model.report import APPLIED
from .._model.report import FAILED
from .._model.report import PENDING
from .._model.report import REVERTED
from .._model.report import SKIPPED
from .._model.report import Provenance
from .._model.report import Record
from .plan import Declared


if TYPE_CHECKING:
    from ..imports._rules import ImportRule

__all__ = ["Activations", "PluginDeclarations", "load_declarations"]


class PluginDeclarations:
    """What the loaded plugins declared, and a record per plugin."""

    __slots__ = ("declared", "env", "plugin_names", "records", "rules", "warnings")

    def __init__(self) -> None:
        self.declared: list[Declared] = []
        self.rules: list[tuple[ImportRule, Provenance]] = []
        self.env: list[tuple[EnvSetting, Provenance]] = []
        #: Entry-point and distribution names of every plugin seen (for unknown-name checks).
        self.plugin_names: set[str] = set()
        self.records: list[Record] = []
        self.warnings: list[str] = []

    def raise_if_broken(self) -> None:
        """Strict mode: a broken plugin, or a warning about the selection, is an error."""
        failed = [r.reason or r.name for r in self.records if r.status is FAILED]
        if failed or self.warnings:
            raise PluginError("ascend-patch (strict): " + "; ".join([*failed, *self.warnings]))


def load_declarations(
    selection: PluginSelection,
    autoload: bool,
    disabled: Iterable[str],
    enabled: Collection[str] = (),
) -> PluginDeclarations:
    """Load the selected plugins (entry points only with ``autoload``) and gather their declarations.

    Plugins named in ``disabled`` (by entry-point or distribution name) are never imported.
    ``enabled``: the opt-in groups ``Patcher.enable()`` names.
    """
    if not autoload:
        selection = PluginSelection(
            selection.disable,
            selection.allow,
            False,
            selection.strict,
            selection.extra,
            selection.enable,
            selection.timeout,
        )
    disabled = set(disabled)
    plugins, records, warnings = load_plugins(selection, metadata, disabled, enabled=enabled)
    found = PluginDeclarations()
    found.records, found.warnings = records, warnings
    for plugin in plugins:  # load_plugins has left the disabled ones out
        distribution = normalize_name(plugin.provenance.distribution or plugin.name)
        found.plugin_names |= {plugin.name, distribution}
        found.env.extend((setting, plugin.provenance) for setting in plugin.env)
        found.rules.extend((rule, plugin.provenance) for rule in plugin.rules)
        found.declared.extend(Declared(item, None, plugin.provenance) for item in plugin.patches)
    return found


class Activations:
    """The import rules and environment variables one patcher put in place."""

    __slots__ = ("_env_set", "_ledger", "_strict", "rules")

    def __init__(self, ledger: Ledger, strict: Callable[[], bool]) -> None:
        self._ledger = ledger
        self._strict = strict
        #: Active rules with their records, oldest first.
        self.rules: list[tuple[ImportRule, Record]] = []
        #: (name, value) of each variable this patcher wrote into os.environ.
        self._env_set: list[tuple[str, str]] = []

    def rule(self, rule: ImportRule, provenance: Provenance) -> None:
        """Start serving ``rule`` (it imports nothing now; it acts when its module is imported)."""
        record = Record("rule", rule.describe(), rule.module, provenance=provenance)
        with self._ledger.lock:
            self._ledger.records.append(record)
            self.rules.append((rule, record))
        rule.strict = self._strict
        rule.activate(record)

    def env(self, setting: EnvSetting, provenance: Provenance) -> None:
        """Write a plugin's recommended variable, unless the user set it already."""
        record = Record(
            "env", setting.name, f"{setting.name}={setting.value}", provenance=provenance
        )
        current = os.environ.get(setting.name)
        if current is not None:
            record.set(SKIPPED, f"the user set {setting.name}={current}")
        else:
            os.environ[setting.name] = setting.value
            self._env_set.append((setting.name, setting.value))
            record.set(APPLIED, setting.why or None)
        with self._ledger.lock:
            self._ledger.records.append(record)

    def undo(self, warn: Callable[[str], None]) -> None:
        """Deactivate the rules and unset the variables, newest first."""
        with self._ledger.lock:
            rules, self.rules = self.rules, []
            env_set, self._env_set = self._env_set, []
        for rule, record in reversed(rules):
            for warning in rule.deactivate():
                warn(warning)
            if record.status in (APPLIED, PENDING):
                record.set(REVERTED, None)
        for name, value in reversed(env_set):
            if os.environ.get(name) == value:
                del os.environ[name]
