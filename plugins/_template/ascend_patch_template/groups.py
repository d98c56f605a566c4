"""Every patch group of the plugin: its name, requirements and documentation.

``apply()`` imports this module; it imports no patch family. A group's
``patches()`` imports its family only when the core builds the group, which it
does only once the group's ``requires`` hold (and the group is not disabled): on a
machine without torch_npu the group costs a metadata lookup and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


__all__ = ["FusedRMSNorm"]


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
