"""The plugin's entry point (``[project.entry-points.ascend_patch]`` in pyproject.toml).

Hook implementations only. ``apply()`` imports this module in every program, so it
imports nothing heavy -- no torch, no torch_npu, no target library: the groups live
in :mod:`ascend_patch_template.groups`, which imports no patch family either.

The other hooks, when a plugin needs them: ``configure_env()`` (``EnvSetting``
objects: environment variables the user has not set) and ``register_import_rules()``
(``SkipImport`` / ``ReplaceImport`` / ``InjectImport``). See docs/plugin-authors.md.
"""

from __future__ import annotations

from ascend_patch_core import Patch
from ascend_patch_core import hookimpl

from . import groups


@hookimpl
def register_patches() -> list[type[Patch]]:
    """Every group of the plugin; the core checks each group's ``requires`` before building it."""
    return [groups.FusedRMSNorm]
