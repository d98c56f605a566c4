"""Every patch group of the plugin, listed in :data:`GROUPS`, and every import rule, in :func:`import_rules`.

``apply()`` imports this module; it imports no patch family and no library. A group's
``patches()`` imports its family only when the core builds the group, which it
does only once the group's ``requires`` hold (and the group is not disabled): on a
machine without torch_npu the group costs a metadata lookup and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


if TYPE_CHECKING:
    from ascend_patch_core import ImportRule


__all__ = ["GROUPS", "FusedRMSNorm", "import_rules"]


class FusedRMSNorm(Patch):
    """``torch.nn.functional.rms_norm`` (and so ``nn.RMSNorm``) -> ``torch_npu.npu_rms_norm``."""

    #: Checked from distribution metadata before anything is imported; every entry must
    #: hold, alternatives join with ``|`` (``"mmcv>=2.0 | mmcv-lite>=2.0"``). Under the
    #: NPU emulator, torch-npu has the emulated version.
    requires = ("torch>=2.4", "torch-npu")
    # A group that costs something on every call of a hot function, or that moves
    # results in the last bits, is opt-in: planned but skipped unless the user enables
    # it by name (ASCEND_PATCH_ENABLE=FusedRMSNorm, apply(enable=...), Patcher.enable()).
    # opt_in = True

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .norm import rms_norm_patches

        return rms_norm_patches(options)


#: Every group, in the order the report lists them: the one list ``plugin.py`` returns.
#: A plugin with many groups may keep one area's classes in ``groups_<area>.py`` and
#: import them here by name; the order is still written once, here.
GROUPS: tuple[type[Patch], ...] = (FusedRMSNorm,)


def import_rules() -> list[ImportRule]:
    """Every import rule of the plugin (this one has none).

    A module served where a library is missing lives in ``served/`` and is named for the
    library it stands in for; its rule names the factory as a literal string::

        from ascend_patch_core import ReplaceImport  # the rule machinery: only here

        return [ReplaceImport("foo_ext", "ascend_patch_foo.served.foo_ext:build", when_missing=True)]

    The rule classes are imported inside this function: declaring a rule loads the
    core's rule machinery, which a plugin without rules should not make every
    ``apply()`` pay for.
    """
    return []
