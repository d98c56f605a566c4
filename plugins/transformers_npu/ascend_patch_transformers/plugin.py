"""The plugin's entry point (``[project.entry-points.ascend_patch]``). Hook implementations only.

``apply()`` imports this module in every program, so it imports nothing heavy: the
groups live in :mod:`ascend_patch_transformers.groups`, which imports no patch family
and no library.
"""

from __future__ import annotations

from ascend_patch_core import Patch
from ascend_patch_core import hookimpl

from . import groups


@hookimpl
def register_import_rules() -> list[object]:
    """Modules served where the real one is missing (``flash_attn`` on an NPU machine)."""
    return list(groups.import_rules())


@hookimpl
def register_patches() -> list[type[Patch]]:
    """Every group of the plugin; the core checks each group's ``requires`` before building it."""
    return list(groups.GROUPS)
