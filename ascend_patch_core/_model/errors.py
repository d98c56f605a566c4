"""Exceptions raised by the core. Each names what failed and how to fix it."""

from __future__ import annotations


__all__ = [
    "ImportRuleError",
    "PatchConflictError",
    "PatchDefinitionError",
    "PatchError",
    "PluginError",
    "SkipPatch",
    "StubUsageError",
]


class PatchError(Exception):
    """Base class of every error the core raises on purpose.

    In strict mode (``ASCEND_PATCH_STRICT=1`` or ``strict=True``) any failed patch,
    rule or plugin raises a :class:`PatchError` instead of becoming a FAILED result.
    """

    __module__ = "ascend_patch_core"


class PatchDefinitionError(PatchError, ValueError):
    """A patch or rule was declared wrongly (bad target path, bad argument)."""

    __module__ = "ascend_patch_core"


class PatchConflictError(PatchError, ValueError):
    """Two enabled patches declare each other in ``conflicts_with``, or collide in strict mode."""

    __module__ = "ascend_patch_core"


class PluginError(PatchError):
    """A plugin could not be loaded or one of its hooks failed (strict mode only)."""

    __module__ = "ascend_patch_core"


class ImportRuleError(PatchError, ImportError):
    """An import rule could not build the module it serves."""

    __module__ = "ascend_patch_core"


class StubUsageError(PatchError, RuntimeError):
    """Code really used something from a module that ``skip_import`` replaced by a stub."""

    __module__ = "ascend_patch_core"


class SkipPatch(Exception):
    """Raise from a ``precheck`` to skip the patch with a reason: ``raise SkipPatch("no NPU runtime")``.

    The report shows the patch as SKIPPED with that reason (returning False gives only
    "precheck returned False"). Any other exception from a precheck fails the patch.
    """

    __module__ = "ascend_patch_core"
