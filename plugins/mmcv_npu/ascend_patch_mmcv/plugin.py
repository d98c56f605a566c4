"""The plugin's entry point (``[project.entry-points.ascend_patch]``). Hook implementations only.

``apply()`` imports this module in every program, so it imports nothing heavy: the
groups and the import rules live in :mod:`ascend_patch_mmcv.groups` (the op groups in
:mod:`ascend_patch_mmcv.groups_ops`, which it imports), which import no patch family.
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
    """Every import rule of the plugin (:func:`ascend_patch_mmcv.groups.import_rules`)."""
    return list(groups.import_rules())


@hookimpl
def register_patches() -> list[type[Patch]]:
    """Every group of the plugin; the core checks each group's ``requires`` before building it."""
    # GROUPS spans two modules (groups, groups_ops), not one per family: each module
    # imported at apply() costs ~0.1 ms.
    return list(groups.GROUPS)
