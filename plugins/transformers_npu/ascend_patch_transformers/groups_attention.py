"""Patch groups of the plugin: the attention family.

Like every groups module of the plugin, this imports no patch family and no library: a
group's ``patches()`` imports its family module only when the core builds the group,
which it does only once the group's ``requires`` hold (checked from metadata).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


if TYPE_CHECKING:
    from ascend_patch_core import ReplaceImport

__all__ = ["GROUPS", "NpuAttention", "import_rules"]

#: The transformers releases the attention groups support (4.51 to 5.x).
TRANSFORMERS = "transformers>=4.51,<6"
#: Where an NPU runtime exists (torch_npu, or the emulator, which announces its version).
NPU_RUNTIME = "torch-npu"


class NpuAttention(Patch):
    """``attn_implementation="npu"``: transformers' attention interface on npu_fusion_attention.

    Registers the name in ``ALL_ATTENTION_FUNCTIONS`` (and, from transformers 4.53, the
    SDPA mask builder under it); calls the op for the inputs it takes and transformers'
    ``sdpa`` (``eager`` for attention weights) for the others, counted in the report
    (see :mod:`ascend_patch_transformers.attention`). ``flash_attention_2`` is left to
    transformers' own NPU path (``transformers.integrations.npu_flash_attention``).
    """

    requires = (TRANSFORMERS, NPU_RUNTIME)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .attention import attention_patches

        return attention_patches(options)


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (NpuAttention,)


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_rules() -> list[ReplaceImport]:
    """``flash_attn`` served by :mod:`ascend_patch_transformers.flash_attn_compat`.

    Only where an NPU runtime is importable (torch_npu, or the emulator's), and, by
    ``when_missing``, only while no real flash_attn is installed: a real one is always
    imported instead. Nothing is imported here (one ``find_spec``).
    """
    if not _findable("torch_npu"):
        return []
    # Imported here: the core loads its import-rule machinery only for programs that use it.
    from ascend_patch_core import ReplaceImport

    factory = "ascend_patch_transformers.flash_attn_compat:build"
    return [
        ReplaceImport(name, factory, when_missing=True)
        for name in ("flash_attn", "flash_attn.bert_padding", "flash_attn.flash_attn_interface")
    ]
