"""Patch groups of the plugin: the ops family (see :mod:`ascend_patch_mmcv.groups` for the rules).

Like ``groups``, this module imports no patch family: a group's ``patches()`` imports
its family module only when the core builds the group.
"""

from __future__ import annotations

from ascend_patch_core import Patch


__all__ = ["GROUPS"]

#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = ()
