"""What a user configured on a Patcher: declarations, switches, plugin selection, settings.

Kept across apply()/revert() cycles; validated when given, so a mistake fails at the
line that made it. The Patcher reads it at apply() time.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING
from typing import Any

from .._discovery.registry import PluginSelection
from .._discovery.registry import close_match
from .._discovery.registry import unknown_names
from .._install.entries import Ledger
from .._install.entries import label
from .._model.env_flags import env_flag
from .._model.errors import PatchConflictError
from .._model.errors import PatchDefinitionError
from .._model.errors import PatchError
from .._model.patch import AtomicPatch
from .._model.patch import LegacyPatch
from .._model.patch import ModuleHook
from .._model.patch import Patch
from .._model.patch import is_import_rule
from .._model.report import USER
from .group_names import group_names
from .plan import Declared
from .plan import conflicting_groups
from .plan import known_names
from .plan import switched_on


if TYPE_CHECKING:
    from ..imports._rules import ImportRule

__all__ = ["PatcherConfig", "name_of"]


def name_of(name: object, method: str) -> str:
    """The name ``disable()``/``enable()`` mean by a string, a group class or a patch object."""
    if isinstance(name, str):
        return name
    if (isinstance(name, type) and issubclass(name, Patch)) or isinstance(
        name, (AtomicPatch, ModuleHook, LegacyPatch, Patch)
    ):
        return name.name
    raise TypeError(f"Patcher.{method}() takes names, Patch classes or patch objects, got {name!r}")


class PatcherConfig:
    """The user's side of a Patcher."""

    def __init__(
        self,
        autoload: bool,
        strict: bool | None,
        disable: str | Iterable[str] | None,
        plugins: str | Iterable[str] | None,
        extra_plugins: Iterable[tuple[str, object]],
    ) -> None:
        self.autoload = autoload
        self.extra_plugins = tuple(extra_plugins)
        # The API form of the ASCEND_PATCH_* switches (None: as the environment says).
        self.strict_arg = strict
        self.plugin_disable = disable
        self.plugin_allow = plugins
        self.discover: bool | None = None
        #: Declarations added with add(), in order, each once.
        self.items: list[Declared] = []
        self._item_ids: set[int] = set()
        #: The added groups, indexed for add()'s conflict check (which looks only at
        #: the pairs a new group makes, so adding one at a time stays linear): every
        #: name a group answers to -> the groups, and each name that a group's
        #: ``conflicts_with`` holds -> the groups naming it.
        self._answering: dict[str, list[type[Patch]]] = {}
        self._naming: dict[str, list[type[Patch]]] = {}
        #: Import rules declared through the patcher (they act at once).
        self.rules: list[ImportRule] = []
        self.disabled: set[str] = set()
        self.enabled: set[str] = set()
        #: Settings by name, for their providers (see _settings).
        self.settings: dict[str, Any] = {}
        #: Patcher(count_calls=...); None: as ASCEND_PATCH_COUNT_CALLS says.
        self.count_calls: bool | None = None
        #: Seconds each plugin may take to load when ASCEND_PATCH_PLUGIN_TIMEOUT is
        #: unset: None for apply() in a program; the ascend-patch commands set theirs.
        self.plugin_timeout: float | None = None

    def counting(self) -> bool:
        """Whether apply() counts the calls of patches without a runtime_check."""
        if self.count_calls is not None:
            return self.count_calls
        return env_flag("ASCEND_PATCH_COUNT_CALLS", False)

    def sort(
        self, items: Iterable[Any], options: Any, warn: Any
    ) -> tuple[list[Declared], list[ImportRule]]:
        """Check what ``add()`` got: new declarations (each object once) and import rules."""
        added: list[Declared] = []
        rules: list[ImportRule] = []
        for item in items:
            if is_import_rule(item):
                rules.append(item)
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
            if id(item) in self._item_ids:
                warn(f"{label(item)} was added twice; it is applied once")
                continue
            self._item_ids.add(id(item))
            added.append(Declared(item, options, USER))
        return added, rules

    def take(self, added: list[Declared], applied: bool) -> str | None:
        """Keep what ``add()`` got; return the conflict a new group makes with an enabled group.

        Before apply() a conflict only warns (as in the DrivingSDK patcher): a disable()
        may still follow, and apply() raises if both are still enabled. After apply(),
        adding is applying, so it raises now (and nothing is kept). Only pairs with a
        new group are looked at: a conflict between groups added before was said then.
        """
        groups = [d.item for d in added if isinstance(d.item, type)]
        conflict = None
        if groups:
            # Indexed first: two groups of one add() call may conflict with each other.
            for group in groups:
                self._index(group, 1)
            conflict = self._conflict_of(groups)
            if conflict is not None and applied:
                for group in groups:
                    self._index(group, -1)
                raise PatchConflictError(conflict)
        self.items.extend(added)
        return conflict

    def _index(self, group: type[Patch], change: int) -> None:
        """Put ``group`` into (1) or take it out of (-1) the conflict indexes."""
        for index, names in (
            (self._answering, group_names(group)),
            (self._naming, frozenset(group.conflicts_with)),
        ):
            for name in names:
                if change > 0:
                    index.setdefault(name, []).append(group)
                else:
                    index[name].remove(group)

    def _conflict_of(self, groups: list[type[Patch]]) -> str | None:
        """The first conflict between one of ``groups`` and an enabled added group.

        The pairs :func:`conflicting_groups` would find with one of ``groups`` in them,
        found through the indexes: the work is proportional to the new groups' names,
        not to the number of groups added.
        """
        off = self.disabled

        def on(group: type[Patch]) -> bool:
            return not off or group_names(group).isdisjoint(off)

        for group in groups:
            if not on(group):
                continue
            for other in group.conflicts_with:
                for owner in self._answering.get(other, ()):
                    if owner.name != group.name and on(owner):
                        return _conflict_message(group.name, owner.name)
            for name in group_names(group):
                for naming in self._naming.get(name, ()):
                    if naming.name != group.name and on(naming):
                        return _conflict_message(naming.name, group.name)
        return None

    def listing(self) -> tuple[list[Declared], set[str], frozenset[str]]:
        """What ``print_info()`` plans before apply(), as apply() would: the plugins' and
        the added declarations, the disabled and the enabled names."""
        selection = self.selection()
        declared: list[Declared] = []
        if self.autoload or self.extra_plugins or self.plugin_allow:  # as in Patcher._apply
            from .sources import load_declarations

            declared = load_declarations(
                selection, self.autoload, self.disabled, self.enabled
            ).declared
        return [*declared, *self.items], self.disabled, frozenset(self.enabled | selection.enable)

    def raise_conflicts(
        self,
        declared: list[Declared],
        *,
        with_added: bool = True,
        enabled: frozenset[str] = frozenset(),
    ) -> None:
        """PatchConflictError if two enabled groups name each other in ``conflicts_with``.

        A plugin's opt-in group counts only when ``enabled`` turns it on: one that is off
        conflicts with nothing.
        """
        message = self.conflict(declared, with_added=with_added, enabled=enabled)
        if message is not None:
            raise PatchConflictError(message)

    def conflict(
        self,
        declared: list[Declared],
        *,
        with_added: bool = True,
        enabled: frozenset[str] = frozenset(),
    ) -> str | None:
        """The first conflict between enabled groups, said with its fix; None if there is none."""
        items = [*declared, *self.items] if with_added else declared
        groups = [
            d.item
            for d in items
            if isinstance(d.item, type) and switched_on(d.item, d.provenance, enabled)
        ]
        for name, other in conflicting_groups(groups, self.disabled)[:1] if groups else ():
            return _conflict_message(name, other)
        return None

    def select(
        self,
        applied: bool,
        disable: str | Iterable[str] | None,
        plugins: str | Iterable[str] | None,
        autoload: bool | None,
        strict: bool | None,
    ) -> None:
        """``select_plugins()``: change the selection (not while applied)."""
        current = (self.plugin_disable, self.plugin_allow, self.discover, self.strict_arg)
        merged = (
            self.plugin_disable if disable is None else disable,
            self.plugin_allow if plugins is None else plugins,
            self.discover if autoload is None else autoload,
            self.strict_arg if strict is None else strict,
        )
        if applied and merged != current:
            raise PatchError(
                "the patcher is already applied; call revert() before changing its plugin selection"
            )
        self.plugin_disable, self.plugin_allow, self.discover, self.strict_arg = merged

    def switches(self, env_enabled: frozenset[str], strict: bool = False) -> dict[str, Any]:
        """What planning needs to know of disable()/enable() (and ASCEND_PATCH_ENABLE), strictness."""
        return {
            "disabled": frozenset(self.disabled),
            "enabled": frozenset(self.enabled | env_enabled),
            "strict": strict,
        }

    def selection(self) -> PluginSelection:
        """The plugin selection now: the environment's switches plus the API's."""
        return PluginSelection.from_env(
            disable=self.plugin_disable,
            plugins=self.plugin_allow,
            autoload=self.discover,
            strict=self.strict_arg,
            extra=self.extra_plugins,
            timeout=self.plugin_timeout,
        )

    def set(self, name: str, value: Any, asked_by: str) -> None:
        """Record a setting; its provider checks the value now (bad values fail here)."""
        from .._install.settings import provider_for

        provider_for(name, f"Patcher.{asked_by}").check(name, value)
        self.settings[name] = value

    def check_unknown_names(
        self,
        env_enabled: frozenset[str],
        ledger: Ledger,
        groups: dict[str, Any],
        plugin_names: AbstractSet[str],
        strict: bool,
    ) -> None:
        """Warn about (strict: raise on) names in disable()/enable()/ASCEND_PATCH_ENABLE
        that match no patch, group, hook or plugin."""
        # Named as users write them: through the API, or `ascend-patch run --disable`.
        switches = (
            ("disable() / --disable", self.disabled),
            ("enable() / --enable", self.enabled),
            ("ASCEND_PATCH_ENABLE", env_enabled),
        )
        if not any(names for _, names in switches):
            return
        known = known_names(ledger, (g for g, _ in groups.values()), plugin_names)
        for switch, names in switches:
            for name in unknown_names(names, known):
                message = f"{switch} names {name!r}, which matches no patch, group, hook or plugin"
                hint = close_match(name, sorted(known))
                if hint:
                    message += f" (did you mean {hint!r}?)"
                if strict:
                    raise PatchDefinitionError(f"ascend-patch (strict): {message}")
                ledger.warn(message)


def _conflict_message(name: str, other: str) -> str:
    """What a conflict says: ``name``'s ``conflicts_with`` names ``other``; and the fix."""
    return (
        f"patch groups {name!r} and {other!r} conflict ({name}.conflicts_with names {other!r}); "
        f"enable only one, e.g. default_patcher.disable({other!r}).add({name})"
    )
