"""Patch groups of the plugin: the attention family.

Like every groups module of the plugin, this imports no patch family and no library: a
group's ``patches()`` imports its family module only when the core builds the group,
which it does only once the group's ``requires`` hold (checked from metadata).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch


if TYPE_CHECKING:
    from ascend_patch_core import ReplaceImport

__all__ = ["GROUPS", "NpuAttention", "import_rules", "npu_integration_needs_einops"]

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


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_rules() -> list[ReplaceImport]:
    """Modules served on an NPU machine (nothing is imported here; a few ``find_spec``).

    * ``flash_attn`` (and ``flash_attn.bert_padding``, ``flash_attn.flash_attn_interface``)
      by :mod:`ascend_patch_transformers.flash_attn_compat`, only while no real
      flash_attn is installed (``when_missing``): a real one is always imported instead;
    * with transformers 4.51/4.52 and no einops: transformers' own
      ``integrations.npu_flash_attention``, which imports einops and, through
      ``modeling_flash_attention_utils``, makes every model module fail to import.

    Only where an NPU runtime is importable (torch_npu, or the emulator's).
    """
    if not _findable("torch_npu"):
        return []
    # Imported here: the core loads its import-rule machinery only for programs that use it.
    from ascend_patch_core import ReplaceImport

    compat = "ascend_patch_transformers.flash_attn_compat"
    rules = [
        ReplaceImport(name, f"{compat}:build", when_missing=True)
        for name in ("flash_attn", "flash_attn.bert_padding", "flash_attn.flash_attn_interface")
    ]
    if npu_integration_needs_einops():
        rules.append(
            ReplaceImport(
                "transformers.integrations.npu_flash_attention", f"{compat}:build_npu_integration"
            )
        )
    return rules


def npu_integration_needs_einops() -> bool:
    """transformers 4.51/4.52 without einops, in the default (down-right) causal mode."""
    if os.environ.get("NPU_FA2_SPARSE_MODE", "3") != "3" or _findable("einops"):
        return False
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return False
    from packaging.version import Version

    return Version(version).release[:2] in ((4, 51), (4, 52))
