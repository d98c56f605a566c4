"""Plugin discovery and isolation: one loop over the ``ascend_patch`` entry points.

pluggy supplies the hook specs, markers, registration and validation. What it does
not supply, and this module adds (ecosystem notes §1.5, §5): one plugin's failure --
a broken import, a raising hook, an invalid return value, an unknown hook -- is
reported with its distribution, version, entry point and file, and the others still
apply; plugins are ordered by entry-point name, not by ``sys.path`` order; unknown
names in the disable and allow lists are reported rather than silently accepted.

Hooks are called one implementation at a time (rather than through
``pm.hook.<name>()``) because pluggy stops at the first raising implementation.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from . import _hookspecs
from ._env_flags import env_flag
from ._metadata import EntryPointInfo
from ._metadata import MetadataCache
from ._metadata import normalize_name
from ._patch import AtomicPatch
from ._patch import EnvSetting
from ._patch import LegacyPatch
from ._patch import ModuleHook
from ._patch import Patch
from ._patch import PatchLike
from ._patch import is_import_rule
from ._report import Provenance
from ._report import Record
from ._report import Status
from ._value import Value


if TYPE_CHECKING:
    from ._rules import ImportRule


__all__ = [
    "HOOK_NAMES",
    "LoadedPlugin",
    "PluginSelection",
    "close_match",
    "load_plugins",
    "split_names",
    "unknown_names",
]

HOOK_NAMES = ("configure_env", "register_import_rules", "register_patches")


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

    """

    __slots__ = ("allow", "autoload", "disable", "enable", "extra", "strict")
    _fields = ("disable", "allow", "autoload", "strict", "extra", "enable")

    def __init__(
        self,
        disable: frozenset[str] = frozenset(),
        allow: frozenset[str] | None = None,
        autoload: bool = True,
        strict: bool = False,
        extra: tuple[tuple[str, object], ...] = (),
        enable: frozenset[str] = frozenset(),
    ) -> None:
        self.disable = disable
        self.allow = allow
        self.autoload = autoload
        self.strict = strict
        self.extra = extra
        self.enable = enable

    def __repr__(self) -> str:
        return (
            f"PluginSelection(disable={sorted(self.disable)}, allow={self.allow and sorted(self.allow)},"
            f" autoload={self.autoload}, strict={self.strict}, extra={len(self.extra)},"
            f" enable={sorted(self.enable)})"
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
    ) -> PluginSelection:
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
        )


class LoadedPlugin:
    """A healthy plugin and what its hooks declared."""

    def __init__(self, name: str, provenance: Provenance, record: Record) -> None:
        self.name = name
        self.provenance = provenance
        self.record = record
        self.env: list[EnvSetting] = []
        self.rules: list[ImportRule] = []
        self.patches: list[PatchLike] = []


def unknown_names(names: Iterable[str], known: set[str]) -> list[str]:
    """The names given to a switch (``disable()``, ``ASCEND_PATCH_DISABLE`` ...) that match nothing.

    A name matches as written or as a normalized distribution name; ``*`` always does.
    """
    return sorted(
        n for n in set(names) if n != "*" and n not in known and normalize_name(n) not in known
    )


def close_match(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``word`` was probably meant to be, for a "did you mean" hint."""
    import difflib  # only for error messages: ~1 ms to import

    found = difflib.get_close_matches(word, candidates, n=1)
    return found[0] if found else None


def _names_of(info: EntryPointInfo) -> set[str]:
    return {info.name, normalize_name(info.distribution)}


def _is_patch_like(item: object) -> bool:
    return (isinstance(item, type) and issubclass(item, Patch) and item is not Patch) or isinstance(
        item, (AtomicPatch, ModuleHook, LegacyPatch)
    )


def _describe_import_failure(info: EntryPointInfo, exc: BaseException) -> str:
    if (
        isinstance(exc, ModuleNotFoundError)
        and exc.name
        and (info.module == exc.name or info.module.startswith(exc.name + "."))
    ):
        return (
            f"its module {info.module!r} does not exist; reinstall {info.distribution}"
            f" or fix the entry point '{info.name} = {info.value}'"
        )
    return f"importing {info.value!r} raised {type(exc).__name__}: {exc}"


def load_plugins(
    selection: PluginSelection,
    cache: MetadataCache,
    also_disabled: Iterable[str] = (),
) -> tuple[list[LoadedPlugin], list[Record], list[str]]:
    """Discover, load and call every selected plugin, each in isolation.

    ``also_disabled`` are names given to ``Patcher.disable()``: those naming a plugin
    keep it from being imported at all; the others (patch names) are not plugins and
    are not reported as unknown here.

    Returns the healthy plugins with their declarations, a record per plugin
    (including broken and disabled ones), and warnings.
    """
    import pluggy

    records: list[Record] = []
    warnings: list[str] = []
    loaded: list[LoadedPlugin] = []
    pm = pluggy.PluginManager(_hookspecs.PROJECT_NAME)
    pm.add_hookspecs(_hookspecs)

    infos: list[EntryPointInfo] = []
    if selection.autoload or selection.allow:
        infos = cache.entry_points(_hookspecs.PROJECT_NAME)
    for dropped in cache.shadowed_entry_points(_hookspecs.PROJECT_NAME) if infos else ():
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
        plugin = _load_one(pm, name, prov, ep_info, obj, record)
        if plugin is not None:
            loaded.append(plugin)
    return loaded, records, warnings


def _defining_file(obj: object) -> str | None:
    """The source file of a plugin module, or of the module defining a plugin object."""
    if isinstance(obj, types.ModuleType):
        return getattr(obj, "__file__", None)
    module_name = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    return getattr(module, "__file__", None)


def _fail(record: Record, reason: str) -> None:
    prov = record.provenance
    where = f"plugin {record.name!r}"
    if prov.distribution:
        where += f" from {prov.distribution} {prov.version}"
    if prov.file:
        where += f" ({prov.file})"
    record.set(Status.FAILED, f"{where}: {reason}")


def _load_one(
    pm: Any,
    name: str,
    prov: Provenance,
    info: EntryPointInfo | None,
    obj: object | None,
    record: Record,
) -> LoadedPlugin | None:
    if obj is None:
        assert info is not None
        try:
            obj = info.load()
        except Exception as exc:
            file = info.failure_file(exc)  # the plugin's own file nearest the error
            record.provenance = Provenance(
                prov.plugin, prov.distribution, prov.version, prov.entry_point, file
            )
            _fail(record, _describe_import_failure(info, exc))
            return None
    file = _defining_file(obj)
    prov = Provenance(prov.plugin, prov.distribution, prov.version, prov.entry_point, file)
    record.provenance = prov

    marker = f"{_hookspecs.PROJECT_NAME}_impl"
    attributes = (
        vars(obj)
        if isinstance(obj, types.ModuleType)
        else {a: getattr(obj, a, None) for a in dir(obj)}
    )
    for attr, value in sorted(attributes.items()):
        if attr.startswith("__"):
            continue
        if getattr(value, marker, None) is not None and attr not in HOOK_NAMES:
            hint = close_match(attr, HOOK_NAMES)
            _fail(
                record,
                f"implements unknown hook {attr!r}"
                + (
                    f"; did you mean {hint!r}?"
                    if hint
                    else f"; known hooks: {', '.join(HOOK_NAMES)}"
                ),
            )
            return None
        if attr in HOOK_NAMES and callable(value) and getattr(value, marker, None) is None:
            record.warnings.append(f"{attr} is not marked with @hookimpl and is ignored")
    try:
        pm.register(obj, name=name)
    except Exception as exc:
        _fail(record, f"invalid hook implementation: {exc}")
        return None

    plugin = LoadedPlugin(name, prov, record)
    try:
        for hook_name in HOOK_NAMES:
            hook = getattr(pm.hook, hook_name)
            for impl in hook.get_hookimpls():
                if impl.plugin is not obj:
                    continue
                try:
                    result = impl.function()
                except Exception as exc:
                    raise _HookFailure(
                        f"hook {hook_name} raised {type(exc).__name__}: {exc}"
                    ) from exc
                _collect(plugin, hook_name, result)
    except _HookFailure as exc:
        pm.unregister(obj)
        _fail(record, str(exc))
        return None
    record.set(Status.APPLIED, _declared_summary(plugin))
    return plugin


def _declared_summary(plugin: LoadedPlugin) -> str:
    """'18 patch groups, 0 import rules': units doctor's patch counts can be read against.

    A group holds many patches (doctor counts those: "249 patches"), so groups and
    single patches are named apart instead of summed as "declarations".
    """
    groups = sum(isinstance(p, type) and issubclass(p, Patch) for p in plugin.patches)
    singles = len(plugin.patches) - groups
    parts = []
    if groups or not singles:
        parts.append(f"{groups} patch group{'s' if groups != 1 else ''}")
    if singles:
        parts.append(f"{singles} single patch{'es' if singles != 1 else ''}")
    rules = len(plugin.rules)
    parts.append(f"{rules} import rule{'s' if rules != 1 else ''}")
    return ", ".join(parts)


class _HookFailure(Exception):
    pass


def _collect(plugin: LoadedPlugin, hook_name: str, result: object) -> None:
    if hook_name == "configure_env":
        try:
            plugin.env.extend(normalize_env(result))
        except Exception as exc:
            raise _HookFailure(f"configure_env returned an invalid value: {exc}") from exc
        return
    if result is None:
        return
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise _HookFailure(f"{hook_name} returned {type(result).__name__}; expected a list")
    items = list(result)
    if hook_name == "register_import_rules":
        bad = [i for i in items if not is_import_rule(i)]
        if bad:
            raise _HookFailure(
                f"register_import_rules returned {bad[0]!r}; expected SkipImport, ReplaceImport or InjectImport objects"
            )
        plugin.rules.extend(items)
        return
    bad = [i for i in items if not _is_patch_like(i)]
    if bad:
        raise _HookFailure(
            f"register_patches returned {bad[0]!r}; expected Patch subclasses, AtomicPatch or ModuleHook objects"
        )
    plugin.patches.extend(items)


def normalize_env(result: object) -> list[EnvSetting]:
    """Accept what a ``configure_env`` hook may return; raise TypeError otherwise."""
    if result is None:
        return []
    if isinstance(result, Mapping):
        return [EnvSetting(str(k), v) for k, v in result.items()]
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes)):
        items = list(result)
        bad = [x for x in items if not isinstance(x, EnvSetting)]
        if bad:
            raise TypeError(f"expected EnvSetting objects, got {bad[0]!r}")
        return items
    raise TypeError(f"expected a mapping or EnvSetting objects, got {type(result).__name__}")
