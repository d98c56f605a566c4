"""Patch groups of the plugin: the attention family.

Like every groups module of the plugin, this imports no patch family and no library: a
group's ``patches()`` imports its family module only when the core builds the group,
which it does only once the group's ``requires`` hold (checked from metadata).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch

from .attention_rules import import_rules


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
        from .attention_patches import attention_patches

        return attention_patches(options)


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (NpuAttention,)
