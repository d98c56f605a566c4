"""The plugin's entry point (``[project.entry-points.ascend_patch]``). Hook implementations only.

``apply()`` imports this module in every program, so it imports nothing heavy: the
groups live in :mod:`ascend_patch_mmcv.groups` and :mod:`ascend_patch_mmcv.groups_ops`,
which import no patch family.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from ascend_patch_core import Patch
from ascend_patch_core import hookimpl

from . import groups
from . import groups_ops


if TYPE_CHECKING:
    from ascend_patch_core import ImportRule


#: The factory of the served ``mmcv._ext``, imported on its first import only.
EXT_PROVIDER = "ascend_patch_mmcv.ext.provider:build_module"


@hookimpl
def register_import_rules() -> list[ImportRule]:
    """``mmcv._ext`` where mmcv has no compiled ops (mmcv-lite): a compiled mmcv keeps its own.

    Only where mmcv is installed at all: declaring the rule imports the core's rule
    machinery (~0.4 ms of every ``apply()``), which a program without mmcv need not pay.
    """
    if importlib.util.find_spec("mmcv") is None:
        return []
    from ascend_patch_core import ReplaceImport  # the rule machinery: only now

    return [ReplaceImport("mmcv._ext", EXT_PROVIDER, when_missing=True)]


@hookimpl
def register_patches() -> list[type[Patch]]:
    """Every group of the plugin; the core checks each group's ``requires`` before building it."""
    # Two modules, not one per family: each module imported at apply() costs ~0.1 ms.
    return [*groups.GROUPS[:4], *groups_ops.GROUPS, *groups.GROUPS[4:]]
