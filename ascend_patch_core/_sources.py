"""Where a patcher's declarations come from, besides the user: the installed plugins.

Loads the selected plugins (``_registry``, each in isolation) and turns what their
hooks returned into declarations for the planner, with the plugin's provenance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ._env import EnvSetting
from ._errors import PluginError
from ._metadata import metadata
from ._metadata import normalize_name
from ._plan import Declared
from ._registry import PluginSelection
from ._registry import load_plugins
from ._report import Provenance
from ._report import Record
from ._report import Status


if TYPE_CHECKING:
    from ._rules import ImportRule

__all__ = ["PluginDeclarations", "load_declarations"]


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
        failed = [r.reason or r.name for r in self.records if r.status is Status.FAILED]
        if failed or self.warnings:
            raise PluginError("ascend-patch (strict): " + "; ".join([*failed, *self.warnings]))


def load_declarations(
    selection: PluginSelection, autoload: bool, disabled: Iterable[str]
) -> PluginDeclarations:
    """Load the selected plugins (entry points only with ``autoload``) and gather their declarations.

    Plugins named in ``disabled`` (by entry-point or distribution name) are never imported.
    """
    if not autoload:
        selection = PluginSelection(
            selection.disable,
            selection.allow,
            False,
            selection.strict,
            selection.extra,
            selection.enable,
        )
    disabled = set(disabled)
    plugins, records, warnings = load_plugins(selection, metadata, disabled)
    found = PluginDeclarations()
    found.records, found.warnings = records, warnings
    off = disabled | {normalize_name(d) for d in disabled}
    for plugin in plugins:
        distribution = normalize_name(plugin.provenance.distribution or plugin.name)
        found.plugin_names |= {plugin.name, distribution}
        if plugin.name in off or (plugin.provenance.distribution and distribution in off):
            plugin.record.set(Status.SKIPPED, "disabled by Patcher.disable()")
            continue
        found.env.extend((setting, plugin.provenance) for setting in plugin.env)
        found.rules.extend((rule, plugin.provenance) for rule in plugin.rules)
        found.declared.extend(Declared(item, None, plugin.provenance) for item in plugin.patches)
    return found
