"""Plugin discovery and isolation: one loop over the ``ascend_patch`` entry points.

pluggy supplies the hook specs, markers, registration and validation. What it does
not supply, and the core adds (ecosystem notes §1.5, §5): one plugin's failure --
a broken import, a raising hook (``sys.exit()`` included), a result that raises as
it is read, an invalid return value, an unknown hook, a hang past the selection's
bound -- is reported with its distribution, version, entry point and file, and the
others still apply (:mod:`.plugin_load`); plugins are ordered by entry-point name,
not by ``sys.path`` order; unknown names in the disable and allow lists are reported
rather than silently accepted.

Hooks are called one implementation at a time (rather than through
``pm.hook.<name>()``) because pluggy stops at the first raising implementation.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Sequence

from .._model.env_flags import PLUGIN_TIMEOUT
from .._model.env_flags import env_flag
from .._model.env_flags import env_seconds
from .._model.report import Provenance
from .._model.report import Record
from .._model.report import Status
from .._model.value import Value
from . import hookspecs as _hookspecs
from .metadata import EntryPointInfo
from .metadata import MetadataCache
from .metadata import normalize_name
from .plugin_load import HOOK_NAMES
from .plugin_load import LoadedPlugin
from .plugin_load import close_match
from .plugin_load import load_one
from .plugin_serves import GROUP as SERVES_GROUP
from .plugin_serves import idle_reason
from .plugin_serves import served_by


__all__ = [
    "HOOK_NAMES",
    "LoadedPlugin",
    "PluginSelection",
    "close_match",
    "load_plugins",
    "split_names",
    "unknown_names",
]


def split_names(value: str | Iterable[str] | None) -> frozenset[str]:
    """The names a switch was given: comma-separated text or an iterable, blanks dropped."""
    if value is None:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else list(value)
    return frozenset(i.strip() for i in items if i and i.strip())


class PluginSelection(Value):
    """Which plugins load. Built from the environment, overridable in the API.

    * ``disable`` -- ``ASCEND_PATCH_DISABLE``: entry-point or distribution names; ``*`` = all.
    * ``allow`` -- ``ASCEND_PATCH_PLUGINS``: if set, only these load (``*``: every
      installed plugin, even with ``autoload`` off).
    * ``autoload`` -- ``ASCEND_PATCH_AUTOLOAD=0`` turns discovery off; plugins named in
      ``allow`` still load (the pytest ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` model).
    * ``strict`` -- ``ASCEND_PATCH_STRICT=1``: any failure raises.
    * ``extra`` -- plugin objects registered directly (tests, embedding applications):
      ``(name, object)`` pairs.
    * ``enable`` -- ``ASCEND_PATCH_ENABLE``: opt-in patch groups to turn on (``*`` = all).
    * ``timeout`` -- ``ASCEND_PATCH_PLUGIN_TIMEOUT``: seconds each plugin may take to
      load (import and hooks) before it fails; None: no bound (``apply()``'s default).

    """

    __slots__ = ("allow", "autoload", "disable", "enable", "extra", "strict", "timeout")
    _fields = ("disable", "allow", "autoload", "strict", "extra", "enable", "timeout")

    def __init__(
        self,
        disable: frozenset[str] = frozenset(),
        allow: frozenset[str] | None = None,
        autoload: bool = True,
        strict: bool = False,
        extra: tuple[tuple[str, object], ...] = (),
        enable: frozenset[str] = frozenset(),
        timeout: float | None = None,
    ) -> None:
        self.disable = disable
        self.allow = allow
        self.autoload = autoload
        self.strict = strict
        self.extra = extra
        self.enable = enable
        self.timeout = timeout

    def __repr__(self) -> str:
        return (
            f"PluginSelection(disable={sorted(self.disable)}, allow={self.allow and sorted(self.allow)},"
            f" autoload={self.autoload}, strict={self.strict}, extra={len(self.extra)},"
            f" enable={sorted(self.enable)}, timeout={self.timeout})"
        )

    @classmethod
    def from_env(
        cls,
        *,
        disable: str | Iterable[str] | None = None,
        plugins: str | Iterable[str] | None = None,
        autoload: bool | None = None,
        strict: bool | None = None,
        extra: Sequence[tuple[str, object]] = (),
        environ: os._Environ[str] | dict[str, str] | None = None,
        enable: str | Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> PluginSelection:
        """The selection the environment's switches make, with these arguments on top.

        ``timeout`` is the bound when ``ASCEND_PATCH_PLUGIN_TIMEOUT`` is unset (doctor's);
        the variable, when set, wins (``0``: no bound).
        """
        env = os.environ if environ is None else environ
        env_disable = split_names(env.get("ASCEND_PATCH_DISABLE"))
        env_allow = env.get("ASCEND_PATCH_PLUGINS")
        allow: frozenset[str] | None
        if plugins is not None:
            allow = split_names(plugins)
        elif env_allow is not None and env_allow.strip():
            allow = split_names(env_allow)
        else:
            allow = None
        if autoload is None:
            autoload = env_flag("ASCEND_PATCH_AUTOLOAD", True, env)
        if strict is None:
            strict = env_flag("ASCEND_PATCH_STRICT", False, env)
        return cls(
            disable=env_disable | split_names(disable),
            allow=allow,
            autoload=autoload,
            strict=strict,
            extra=tuple(extra),
            enable=split_names(env.get("ASCEND_PATCH_ENABLE")) | split_names(enable),
            timeout=env_seconds(PLUGIN_TIMEOUT, timeout, env),
        )


def unknown_names(names: Iterable[str], known: set[str]) -> list[str]:
    """The names given to a switch (``disable()``, ``ASCEND_PATCH_DISABLE`` ...) that match nothing.

    A name matches as written or as a normalized distribution name; ``*`` always does.
    """
    return sorted(
        n for n in set(names) if n != "*" and n not in known and normalize_name(n) not in known
    )


def _names_of(info: EntryPointInfo) -> set[str]:
    return {info.name, normalize_name(info.distribution)}


def load_plugins(
    selection: PluginSelection,
    cache: MetadataCache,
    also_disabled: Iterable[str] = (),
    *,
    skip_idle: bool = True,
    enabled: Collection[str] = (),
) -> tuple[list[LoadedPlugin], list[Record], list[str]]:
    """Discover, load and call every selected plugin, each in isolation.

    ``also_disabled`` are names given to ``Patcher.disable()``: those naming a plugin
    keep it from being imported at all; the others (patch names) are not plugins and
    are not reported as unknown here. ``skip_idle``: a plugin none of whose served
    libraries is installed (:mod:`.plugin_serves`) is not imported, unless
    ``ASCEND_PATCH_PLUGINS`` names it or an opt-in group is named: ``enabled``
    (``Patcher.enable()``'s names) or ``ASCEND_PATCH_ENABLE``.

    Returns the healthy plugins with their declarations, a record per plugin
    (including broken and disabled ones), and warnings.
    """
    records: list[Record] = []
    warnings: list[str] = []
    loaded: list[LoadedPlugin] = []
    pm = None
    if selection.timeout is None:  # with a bound, each plugin gets a manager of its own
        import pluggy

        pm = pluggy.PluginManager(_hookspecs.PROJECT_NAME)
        pm.add_hookspecs(_hookspecs)

    infos: list[EntryPointInfo] = []
    if selection.autoload or selection.allow:
        # The served libraries are read in the same pass over the distributions.
        infos = cache.entry_points(_hookspecs.PROJECT_NAME, also=(SERVES_GROUP,))
    hidden = cache.shadowed_entry_points(_hookspecs.PROJECT_NAME) if infos else []
    served: dict[str, tuple[str, ...]] = {}
    # An opt-in group named in enable() or ASCEND_PATCH_ENABLE may be an idle plugin's
    # (CollectionsCompat serves old code whether or not mmcv is installed); which plugin
    # holds it is known only once plugins are imported, so naming any group loads the
    # idle plugins too (docs/core.md, "Idle plugins").
    if infos and skip_idle and not (selection.enable or enabled):
        served, stray = served_by(cache, infos, hidden)
        warnings.extend(stray)
    for dropped in hidden:
        kept = next((i for i in infos if i.name == dropped.name), None)
        warnings.append(
            f"plugin name {dropped.name!r} is declared by {dropped.distribution} {dropped.version} too; "
            f"{kept.distribution if kept else '?'} comes first on sys.path and is the one used"
        )
    known: set[str] = set()
    for info in infos:
        known |= _names_of(info)
    known |= {name for name, _ in selection.extra}
    for label, listed in (
        ("ASCEND_PATCH_DISABLE", selection.disable),
        ("ASCEND_PATCH_PLUGINS", selection.allow),
    ):
        for name in unknown_names(listed or (), known):
            hint = close_match(name, sorted(known))
            warnings.append(
                f"{label} names {name!r}, which is not an installed plugin"
                + (
                    f" (did you mean {hint!r}?)"
                    if hint
                    else f" (installed: {', '.join(sorted(known)) or 'none'})"
                )
            )

    candidates: list[tuple[str, Provenance, EntryPointInfo | None, object | None]] = []
    for info in infos:
        prov = Provenance(
            info.name, info.distribution, info.version, f"{info.name} = {info.value}", None
        )
        candidates.append((info.name, prov, info, None))
    for name, obj in selection.extra:
        prov = Provenance(name, None, None, None, getattr(obj, "__file__", None))
        candidates.append((name, prov, None, obj))

    disabled_all = "*" in selection.disable
    disabled_names = set(selection.disable) | set(also_disabled)
    normalized_disable = {normalize_name(n) for n in disabled_names} | disabled_names
    allow_all = selection.allow is not None and "*" in selection.allow
    normalized_allow = (
        None
        if selection.allow is None or allow_all
        else ({normalize_name(n) for n in selection.allow} | set(selection.allow))
    )
    for name, prov, ep_info, obj in candidates:
        names = _names_of(ep_info) if ep_info is not None else {name}
        record = Record("plugin", name, prov.entry_point or name, provenance=prov)
        records.append(record)
        if disabled_all or names & normalized_disable:
            api_names = {normalize_name(n) for n in also_disabled} | set(also_disabled)
            if names & api_names:
                reason = "disabled by Patcher.disable()"
            else:
                reason = "disabled by ASCEND_PATCH_DISABLE" if ep_info else "disabled"
            record.set(Status.SKIPPED, reason)
            continue
        if normalized_allow is not None and ep_info is not None and not names & normalized_allow:
            record.set(Status.SKIPPED, "not in ASCEND_PATCH_PLUGINS")
            continue
        if (
            ep_info is not None
            and not selection.autoload
            and not allow_all
            and normalized_allow is None
        ):
            record.set(Status.SKIPPED, "ASCEND_PATCH_AUTOLOAD=0")
            continue
        if name in served and ep_info is not None and not (normalized_allow or set()) & names:
            idle = idle_reason(cache, served[name])
            if idle is not None:
                record.set(Status.SKIPPED, idle)
                continue
        plugin = load_one(
            pm, _hookspecs.PROJECT_NAME, name, prov, ep_info, obj, record, selection.timeout
        )
        if plugin is not None:
            loaded.append(plugin)
    return loaded, records, warnings
