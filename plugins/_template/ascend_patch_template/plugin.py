"""The plugin's entry point (``[project.entry-points.ascend_patch]`` in pyproject.toml).

Hook implementations only. ``apply()`` imports this module in every program, so it
imports nothing heavy -- no torch, no torch_npu, no target library: the groups live
in :mod:`ascend_patch_template.groups`, which imports no patch family either.

The third hook, when a plugin needs it: ``configure_env()`` (``EnvSetting`` objects:
environment variables the user has not set), importing its module inside the hook.
See docs/plugin-authors.md ("Anatomy").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ascend_patch_core import Patch
from ascend_patch_core import hookimpl

from . import groups


if TYPE_CHECKING:
    from ascend_patch_core import ImportRule


@hookimpl
def register_import_rules() -> list[ImportRule]:
    """Every import rule of the plugin: they live in :func:`groups.import_rules`."""
    return list(groups.import_rules())


@hookimpl
def register_patches() -> list[type[Patch]]:
    """Every group of the plugin; the core checks each group's ``requires`` before building it."""
    return list(groups.GROUPS)
