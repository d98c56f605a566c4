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

from ._discovery.hookspecs import hookimpl
from ._discovery.requires import override_version
from ._engine.patcher import Patcher
from ._model.errors import ImportRuleError
from ._model.errors import PatchConflictError
from ._model.errors import PatchDefinitionError
from ._model.errors import PatchError
from ._model.errors import PluginError
from ._model.errors import SkipPatch
from ._model.errors import StubUsageError
from ._model.patch import AtomicPatch
from ._model.patch import EnvSetting
from ._model.patch import LegacyPatch
from ._model.patch import ModuleHook
from ._model.patch import Patch
from ._model.paths import use_engine_check
from ._model.report import InstalledPatch
from ._model.report import Provenance
from ._model.report import Record
from ._model.report import Report
from ._model.report import Status
from ._model.standalone import use_standalone


if TYPE_CHECKING:
    from ._compat.legacy import PatcherBuilder
    from ._compat.legacy import default_patcher_builder
    from ._compat.mx_names import PatchResult
    from ._compat.mx_names import PatchStatus
    from ._compat.mx_names import RegistryPatch
    from ._compat.mx_names import check_version
    from ._compat.mx_names import get_version
    from ._compat.mx_names import is_mmcv_v1x
    from ._compat.mx_names import is_mmcv_v2x
    from ._compat.mx_names import mmcv_version
    from ._install.with_imports import with_imports
    from ._model.env_flags import env_flag
    from .imports._replace_args import replace_with
    from .imports._rules import ImportRule
    from .imports._rules import InjectImport
    from .imports._rules import ReplaceImport
    from .imports._rules import SkipImport
    from .imports._stubs import is_stub

# Loaded on first use: start-up time inside a training process is budgeted
# (docs/benchmarks.md), and most programs never touch these.
_LAZY = {
    "env_flag": "._model.env_flags",
    "ImportRule": ".imports._rules",
    "InjectImport": ".imports._rules",
    "ReplaceImport": ".imports._rules",
    "SkipImport": ".imports._rules",
    "PatcherBuilder": "._compat.legacy",
    "default_patcher_builder": "._compat.legacy",
    # The DrivingSDK patcher's names (docs/migrating-from-mx-driving.md).
    "PatchResult": "._compat.mx_names",
    "PatchStatus": "._compat.mx_names",
    "RegistryPatch": "._compat.mx_names",
    "check_version": "._compat.mx_names",
    "get_version": "._compat.mx_names",
    "is_mmcv_v1x": "._compat.mx_names",
    "is_mmcv_v2x": "._compat.mx_names",
    "mmcv_version": "._compat.mx_names",
    "replace_with": ".imports._replace_args",
    "is_stub": ".imports._stubs",
    "with_imports": "._install.with_imports",
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
    from ._install.engine_targets import refuse_declared

    return refuse_declared


use_engine_check(_engine_check)


def _per_patch() -> Any:
    # AtomicPatch.apply() and Patch.apply_all(): loaded on first use (start-up is budgeted).
    from ._compat import per_patch

    return per_patch


use_standalone(_per_patch)

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
        from ._discovery.registry import split_names

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
        from ._compat.legacy import legacy_function

        function = legacy_function(name)
        if function is not None:
            globals()[name] = function
            return function
        _NOT_LEGACY.add(name)  # probes (hasattr) load the plugins once per name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
