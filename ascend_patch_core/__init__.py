"""ascend_patch_core: lazy, reversible runtime patches for moving CUDA-era PyTorch code to Ascend NPUs.

Apply every installed plugin's patches::

    import ascend_patch_core
    ascend_patch_core.apply()

or compose patches yourself, in the style of the DrivingSDK patcher::

    from ascend_patch_core import default_patcher, Patch, AtomicPatch, with_imports
    default_patcher.add(MyPatch)
    default_patcher.apply()

Importing this package imports no torch and no target library; ``apply()`` neither.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any

from . import _per_patch  # noqa: F401 (lets AtomicPatch.apply() and Patch.apply_all() work)
from ._errors import ImportRuleError
from ._errors import PatchConflictError
from ._errors import PatchDefinitionError
from ._errors import PatchError
from ._errors import PluginError
from ._errors import SkipPatch
from ._errors import StubUsageError
from ._hookspecs import hookimpl
from ._patch import AtomicPatch
from ._patch import EnvSetting
from ._patch import LegacyPatch
from ._patch import ModuleHook
from ._patch import Patch
from ._patcher import Patcher
from ._paths import use_engine_check
from ._report import InstalledPatch
from ._report import Provenance
from ._report import Record
from ._report import Report
from ._report import Status
from ._requires import override_version


if TYPE_CHECKING:
    from ._env_flags import env_flag
    from ._legacy import PatcherBuilder
    from ._legacy import default_patcher_builder
    from ._mx_names import PatchResult
    from ._mx_names import PatchStatus
    from ._mx_names import RegistryPatch
    from ._mx_names import check_version
    from ._mx_names import get_version
    from ._mx_names import is_mmcv_v1x
    from ._mx_names import is_mmcv_v2x
    from ._mx_names import mmcv_version
    from ._replace_args import replace_with
    from ._rules import ImportRule
    from ._rules import InjectImport
    from ._rules import ReplaceImport
    from ._rules import SkipImport
    from ._stubs import is_stub
    from ._with_imports import with_imports

# Loaded on first use: start-up time inside a training process is budgeted
# (docs/benchmarks.md), and most programs never touch these.
_LAZY = {
    "env_flag": "._env_flags",
    "ImportRule": "._rules",
    "InjectImport": "._rules",
    "ReplaceImport": "._rules",
    "SkipImport": "._rules",
    "PatcherBuilder": "._legacy",
    "default_patcher_builder": "._legacy",
    # The DrivingSDK patcher's names (docs/migrating-from-mx-driving.md).
    "PatchResult": "._mx_names",
    "PatchStatus": "._mx_names",
    "RegistryPatch": "._mx_names",
    "check_version": "._mx_names",
    "get_version": "._mx_names",
    "is_mmcv_v1x": "._mx_names",
    "is_mmcv_v2x": "._mx_names",
    "mmcv_version": "._mx_names",
    "replace_with": "._replace_args",
    "is_stub": "._stubs",
    "with_imports": "._with_imports",
}


__all__ = [
    "AtomicPatch",
    "EnvSetting",
    "ImportRule",
    "ImportRuleError",
    "InjectImport",
    "InstalledPatch",
    "LegacyPatch",
    "ModuleHook",
    "Patch",
    "PatchConflictError",
    "PatchDefinitionError",
    "PatchError",
    "PatchResult",
    "PatchStatus",
    "Patcher",
    "PatcherBuilder",
    "PluginError",
    "Provenance",
    "Record",
    "RegistryPatch",
    "ReplaceImport",
    "Report",
    "SkipImport",
    "SkipPatch",
    "Status",
    "StubUsageError",
    "apply",
    "check_version",
    "default_patcher",
    "default_patcher_builder",
    "env_flag",
    "get_version",
    "hookimpl",
    "is_mmcv_v1x",
    "is_mmcv_v2x",
    "is_stub",
    "mmcv_version",
    "override_version",
    "replace_with",
    "revert",
    "with_imports",
]


def _engine_check() -> Any:
    # AtomicPatch(...) of a path that may reach the engine (sys.modules...): loaded then.
    from ._engine_targets import refuse_declared

    return refuse_declared


use_engine_check(_engine_check)

#: The patcher holding the default patches of every installed plugin, plus what you add.
default_patcher = Patcher(autoload=True)


def apply(
    *,
    disable: str | Iterable[str] | None = None,
    plugins: str | Iterable[str] | None = None,
    autoload: bool | None = None,
    strict: bool | None = None,
    enable: str | Iterable[str] | None = None,
) -> Report:
    """Apply :data:`default_patcher`: every installed plugin, plus what was added to it.

    The keyword arguments are the API form of the environment switches and add to
    them: ``disable`` (``ASCEND_PATCH_DISABLE``), ``plugins`` (``ASCEND_PATCH_PLUGINS``),
    ``autoload`` (``ASCEND_PATCH_AUTOLOAD``), ``strict`` (``ASCEND_PATCH_STRICT``),
    ``enable`` (``ASCEND_PATCH_ENABLE``: opt-in patch groups to turn on).
    Returns the live :class:`Report`. A second call returns the same report.
    """
    default_patcher.select_plugins(
        disable=disable, plugins=plugins, autoload=autoload, strict=strict
    )
    if enable is not None:
        from ._registry import split_names

        default_patcher.enable(*sorted(split_names(enable)))
    return default_patcher.apply()


def revert() -> Report:
    """Undo everything :func:`apply` did."""
    return default_patcher.revert()


_NOT_LEGACY: set[str] = set()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    if name == "__version__":
        from importlib.metadata import version

        return version("ascend-patch-core")
    if name.isidentifier() and not name.startswith("_") and name not in _NOT_LEGACY:
        # A 1.0 function name of a plugin's group (msda, dc, index ...).
        from ._legacy import legacy_function

        function = legacy_function(name)
        if function is not None:
            globals()[name] = function
            return function
        _NOT_LEGACY.add(name)  # probes (hasattr) load the plugins once per name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
