"""The DrivingSDK patcher's 1.0 API: ``PatcherBuilder`` and function-style ``Patch(func, options)``.

Kept so 1.0 migrations run unchanged::

    builder = PatcherBuilder().add_module_patch("mmcv", Patch(msda), Patch(dc)).brake_at(1000)
    with builder.build():
        main()

A 1.0 patch function that a plugin ships for a 2.0 group carries
``__ascend_patch_group__ = TheGroup``; the builder then uses the group's declarative,
reversible patches instead of running the function. (The DrivingSDK patcher matched built-in
functions by ``__name__``, so a user's own function called ``index`` was silently
swapped for the built-in one.)

The 1.0 names of the plugins' groups (``msda``, ``dc``, ``index`` ...: each group's
``legacy_name``) are attributes of ``ascend_patch_core``, looked up on first use among
the installed plugins (:func:`legacy_function`), so that a 1.0 script whose import
line now names ``ascend_patch_core`` finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._engine.patcher import Patcher
from .._model.patch import LegacyPatch
from .._model.patch import Patch


__all__ = ["PatcherBuilder", "default_patcher_builder", "legacy_function"]


class PatcherBuilder:
    """Builds a :class:`Patcher` from 1.0-style module patches."""

    __module__ = "ascend_patch_core"

    def __init__(self) -> None:
        self._module_patches: list[tuple[str, LegacyPatch]] = []
        self._disabled: list[str] = []
        self._profiling: dict[str, Any] | None = None
        self._brake_step: int | None = None

    def add_module_patch(self, module_name: str, *patches: LegacyPatch) -> PatcherBuilder:
        for patch in patches:
            if not isinstance(patch, LegacyPatch):
                raise TypeError(
                    f"add_module_patch takes Patch(func, options) objects, got {patch!r}"
                )
            self._module_patches.append((module_name, patch))
        return self

    def disable_patches(self, *names: str) -> PatcherBuilder:
        self._disabled.extend(names)
        return self

    def with_profiling(
        self,
        path: str,
        level: int = 0,
        skip_first: int = 20,
        wait: int = 1,
        warmup: int = 1,
        active: int = 1,
        repeat: int = 1,
    ) -> PatcherBuilder:
        self._profiling = {
            "path": path,
            "level": level,
            "skip_first": skip_first,
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": repeat,
        }
        return self

    def brake_at(self, step: int) -> PatcherBuilder:
        self._brake_step = step
        return self

    #: Whether build() also holds every installed plugin's default patches.
    _autoload = False

    def build(self, allow_internal_format: bool | None = None) -> Patcher:
        """Return a new, unapplied :class:`Patcher` holding these patches (in priority order)."""
        patcher = Patcher(autoload=self._autoload)
        ordered = sorted(self._module_patches, key=lambda mp: mp[1].priority)
        for module_name, patch in ordered:
            group = getattr(patch.func, "__ascend_patch_group__", None)
            if isinstance(group, type) and issubclass(group, Patch):
                patcher.add(group, options=patch.options)
            else:
                patcher.add(patch.bound_to(module_name))
        if self._disabled:
            patcher.disable(*self._disabled)
        if self._profiling is not None:
            patcher.with_profiling(**self._profiling)
        if self._brake_step is not None:
            patcher.brake_at(self._brake_step)
        if allow_internal_format is not None:
            patcher.allow_internal_format(allow_internal_format)
        return patcher


class _DefaultPatcherBuilder(PatcherBuilder):
    """1.0's ``default_patcher_builder``: build() also holds the plugins' default patches.

    Each build() makes a new Patcher, apart from ``default_patcher``: apply one of the
    two, not both (both would install the plugins' patches twice; the second collides).
    """

    _autoload = True


#: The 1.0 builder preloaded with the default patches (of every installed plugin).
default_patcher_builder = _DefaultPatcherBuilder()


def _group_function(group: type[Patch]) -> Callable[..., None]:
    name = str(group.legacy_name)

    def legacy(module: Any = None, options: Any = None) -> None:
        # Called directly, as 1.0 code may do: apply the group (reversibly, on its own
        # Patcher); given to Patch(...), the builder adds the group instead.
        Patcher().add(group, options=options).apply()

    legacy.__name__ = legacy.__qualname__ = name
    legacy.__doc__ = f"The 1.0 name of the patch group {group.name}: use it in Patch({name})."
    legacy.__ascend_patch_group__ = group  # type: ignore[attr-defined]
    return legacy


def legacy_function(name: str) -> Callable[..., None] | None:
    """The 1.0 function ``name`` of an installed plugin's group (its ``legacy_name``), or None.

    Loads the selected plugins (their hooks only return declarations); applies nothing.
    """
    from .._discovery.metadata import MetadataCache
    from .._discovery.registry import PluginSelection
    from .._discovery.registry import load_plugins

    # A 1.0 name is asked for by name: its plugin is loaded even where its library is absent.
    loaded, _, _ = load_plugins(PluginSelection.from_env(), MetadataCache(), skip_idle=False)
    for plugin in loaded:
        for item in plugin.patches:
            if isinstance(item, type) and issubclass(item, Patch) and item.legacy_name == name:
                return _group_function(item)
    return None
