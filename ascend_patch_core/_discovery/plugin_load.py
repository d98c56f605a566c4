"""Loading one plugin in isolation: its import, its hooks, and reading what they return.

Everything a plugin runs is contained here -- the import of its module, each hook,
and what is evaluated lazily from a hook's result (a generator, an iterable whose
``__iter__`` or ``__len__`` raises, a mapping whose ``items()`` does, an object whose
``repr`` does): an exception, ``SystemExit`` (``sys.exit()`` in a plugin) included,
fails that plugin alone, with its distribution, version, file and the hook it was
in; the others still load. ``KeyboardInterrupt`` is the user's and stops the
program. A plugin that takes longer than the selection's bound fails the same way
(:mod:`.plugin_bound`, loaded only when a bound is set).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from .._model.patch import AtomicPatch
from .._model.patch import EnvSetting
from .._model.patch import LegacyPatch
from .._model.patch import ModuleHook
from .._model.patch import Patch
from .._model.patch import PatchLike
from .._model.patch import is_import_rule
from .._model.report import Provenance
from .._model.report import Record
from .._model.report import Status
from .metadata import EntryPointInfo


if TYPE_CHECKING:
    from ..imports._rules import ImportRule


__all__ = ["HOOK_NAMES", "LoadedPlugin", "close_match", "load_one", "normalize_env"]

HOOK_NAMES = ("configure_env", "register_import_rules", "register_patches")


class LoadedPlugin:
    """A healthy plugin and what its hooks declared."""

    def __init__(self, name: str, provenance: Provenance, record: Record) -> None:
        self.name = name
        self.provenance = provenance
        self.record = record
        self.env: list[EnvSetting] = []
        self.rules: list[ImportRule] = []
        self.patches: list[PatchLike] = []


def close_match(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``word`` was probably meant to be, for a "did you mean" hint."""
    import difflib  # only for error messages: ~1 ms to import

    found = difflib.get_close_matches(word, candidates, n=1)
    return found[0] if found else None


class _Progress:
    """What loading one plugin has got to, for the message when it fails or hangs."""

    __slots__ = ("file", "obj", "result_type", "stage")

    def __init__(self, stage: str) -> None:
        self.stage = stage
        #: The plugin object, once imported (to unregister it when it fails).
        self.obj: object | None = None
        #: Its defining file, once known.
        self.file: str | None = None
        #: The type name of the hook result being read.
        self.result_type = ""


class _HookFailure(Exception):
    """A failure this module has already put into words (an invalid declaration)."""


def load_one(
    pm: Any,
    project: str,
    name: str,
    prov: Provenance,
    info: EntryPointInfo | None,
    obj: object | None,
    record: Record,
    timeout: float | None,
) -> LoadedPlugin | None:
    """Load the plugin ``name`` and call its hooks; on any failure mark ``record`` FAILED.

    ``timeout``: seconds it may take, or None for no bound. ``pm``: the pluggy manager
    to register it with; None gives it one of its own (with a bound, a plugin left
    running in a thread must share nothing with the others).
    """
    progress = _Progress(f"importing {info.value!r}" if info is not None else "registering it")
    warnings: list[str] = []
    try:
        if timeout is None:
            plugin = _load(pm, project, name, prov, info, obj, record, progress, warnings)
        else:
            from .plugin_bound import call_bounded

            plugin = call_bounded(
                lambda: _load(pm, project, name, prov, info, obj, record, progress, warnings),
                timeout,
                lambda: _roots(info, progress),
            )
    except KeyboardInterrupt:  # the user's, not the plugin's: it stops the program
        raise
    except BaseException as exc:  # SystemExit from a plugin included
        file = progress.file
        if file is None and info is not None and exc.__traceback__ is not None:
            file = info.failure_file(exc)  # the plugin's own file nearest the error
        record.provenance = Provenance(
            prov.plugin, prov.distribution, prov.version, prov.entry_point, file
        )
        record.warnings.extend(warnings)
        _fail(record, _describe(exc, progress, info))
        if pm is not None and progress.obj is not None and pm.is_registered(progress.obj):
            pm.unregister(progress.obj)
        return None
    record.provenance = plugin.provenance
    record.warnings.extend(warnings)
    record.set(Status.APPLIED, _declared_summary(plugin))
    return plugin


def _load(
    pm: Any,
    project: str,
    name: str,
    prov: Provenance,
    info: EntryPointInfo | None,
    obj: object | None,
    record: Record,
    progress: _Progress,
    warnings: list[str],
) -> LoadedPlugin:
    """The plugin loaded and its hooks' declarations read; raises whatever goes wrong."""
    if obj is None:
        assert info is not None
        obj = info.load()
    progress.obj = obj
    progress.stage = "registering it"
    progress.file = _defining_file(obj)
    prov = Provenance(prov.plugin, prov.distribution, prov.version, prov.entry_point, progress.file)

    marker = f"{project}_impl"
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
            raise _HookFailure(
                f"implements unknown hook {attr!r}"
                + (
                    f"; did you mean {hint!r}?"
                    if hint
                    else f"; known hooks: {', '.join(HOOK_NAMES)}"
                )
            )
        if attr in HOOK_NAMES and callable(value) and getattr(value, marker, None) is None:
            warnings.append(f"{attr} is not marked with @hookimpl and is ignored")
    if pm is None:
        import pluggy

        from . import hookspecs as _hookspecs

        pm = pluggy.PluginManager(project)
        pm.add_hookspecs(_hookspecs)
    try:
        pm.register(obj, name=name)
    except Exception as exc:
        raise _HookFailure(f"invalid hook implementation: {exc}") from exc

    plugin = LoadedPlugin(name, prov, record)
    for hook_name in HOOK_NAMES:
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.plugin is not obj:  # the manager may hold the plugins loaded before
                continue
            progress.stage = f"in hook {hook_name}"
            result = impl.function()
            progress.stage = f"reading what hook {hook_name} returned"
            progress.result_type = type(result).__name__
            _collect(plugin, hook_name, result)
    return plugin


def _roots(info: EntryPointInfo | None, progress: _Progress) -> list[str]:
    """Where the plugin's own files are: its top-level package (or module), else its file."""
    import os

    roots: list[str] = []
    if info is not None:
        spec = _spec_of(info.module.partition(".")[0])
        if spec is not None:
            roots = list(spec.submodule_search_locations or ([spec.origin] if spec.origin else []))
    if not roots and progress.file:
        roots = [progress.file]
    return [os.path.normpath(os.path.abspath(r)) for r in roots]


def _spec_of(module: str) -> Any:
    import importlib.util

    try:
        return importlib.util.find_spec(module)
    except Exception:  # a broken parent, a module without __spec__: no place to name
        return None


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


def _raised(exc: BaseException) -> str:
    """'raised ValueError: bad', said so that an exception with no message still says something."""
    if isinstance(exc, SystemExit):
        return (
            f"called sys.exit({exc.code!r}): a plugin may not end the program (SystemExit caught)"
        )
    text = _shown(exc, str)
    return f"raised {type(exc).__name__}" + (f": {text}" if text else "")


def _describe(exc: BaseException, progress: _Progress, info: EntryPointInfo | None) -> str:
    """Why the plugin failed, with the stage it was at."""
    from .plugin_bound import PluginTimeout

    if isinstance(exc, _HookFailure):
        return str(exc)
    if isinstance(exc, PluginTimeout):
        from .._model.env_flags import PLUGIN_TIMEOUT

        at = f" at {exc.where}" if exc.where else ""
        if exc.left_running:
            what = f"it is still {progress.stage}{at} (left running; what it declares later is ignored)"
        else:
            what = f"it was stopped {progress.stage}{at}"
        return (
            f"did not finish within {exc.seconds:g} s ({PLUGIN_TIMEOUT}): {what}. Loading a "
            "plugin, its import and hooks, should take milliseconds"
        )
    if progress.stage.startswith("importing") and info is not None:
        if (
            isinstance(exc, ModuleNotFoundError)
            and exc.name
            and (info.module == exc.name or info.module.startswith(exc.name + "."))
        ):
            return (
                f"its module {info.module!r} does not exist; reinstall {info.distribution}"
                f" or fix the entry point '{info.name} = {info.value}'"
            )
        return f"importing {info.value!r} {_raised(exc)}"
    if progress.stage.startswith("in hook"):
        return f"hook {progress.stage[len('in hook ') :]} {_raised(exc)}"
    if progress.stage.startswith("reading"):
        hook = progress.stage.rpartition(" returned")[0].rpartition(" ")[2]
        return f"hook {hook} returned a {progress.result_type} that {_raised(exc)} when it was read"
    return f"{progress.stage}: {_raised(exc)}"


def _shown(obj: object, show: Any = repr) -> str:
    """``repr(obj)`` (or ``str``), or a stand-in when the plugin's object raises there too."""
    try:
        return str(show(obj))
    except KeyboardInterrupt:
        raise
    except BaseException:  # a plugin object's __repr__ may do anything
        return f"<{type(obj).__name__} object whose {show.__name__}() raised>"


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


def _is_patch_like(item: object) -> bool:
    return (isinstance(item, type) and issubclass(item, Patch) and item is not Patch) or isinstance(
        item, (AtomicPatch, ModuleHook, LegacyPatch)
    )


def _collect(plugin: LoadedPlugin, hook_name: str, result: object) -> None:
    """Read a hook's result into ``plugin``: materialized first (plugin code may run), then checked."""
    if hook_name == "configure_env":
        pairs = None
        if isinstance(result, Mapping):
            pairs = list(result.items())
        elif isinstance(result, Iterable) and not isinstance(result, (str, bytes)):
            result = list(result)
        try:
            if pairs is not None:
                plugin.env.extend(EnvSetting(str(k), v) for k, v in pairs)
            else:
                plugin.env.extend(normalize_env(result))
        except (TypeError, ValueError) as exc:
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
                f"register_import_rules returned {_shown(bad[0])}; "
                "expected SkipImport, ReplaceImport or InjectImport objects"
            )
        plugin.rules.extend(items)
        return
    bad = [i for i in items if not _is_patch_like(i)]
    if bad:
        raise _HookFailure(
            f"register_patches returned {_shown(bad[0])}; "
            "expected Patch subclasses, AtomicPatch or ModuleHook objects"
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
            raise TypeError(f"expected EnvSetting objects, got {_shown(bad[0])}")
        return items
    raise TypeError(f"expected a mapping or EnvSetting objects, got {type(result).__name__}")
