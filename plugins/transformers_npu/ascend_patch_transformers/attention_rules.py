"""The attention family's import rules: what the plugin serves on an NPU machine.

Imported by :mod:`ascend_patch_transformers.groups_attention`, so by every ``apply()``:
it imports no library, only asks the import system (``find_spec``); on an NPU machine,
also distribution metadata.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from ascend_patch_core import ReplaceImport


__all__ = ["findable", "import_rules", "npu_integration_needs_einops"]


def findable(name: str) -> bool:
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
    if not findable("torch_npu"):
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
    if os.environ.get("NPU_FA2_SPARSE_MODE", "3") != "3" or findable("einops"):
        return False
    # Imported here, on NPU machines only: importlib.metadata costs ~27 ms in a fresh
    # interpreter, which apply() avoids (the core caches what it needs of metadata).
    import importlib.metadata

    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return False
    from packaging.version import Version

    return Version(version).release[:2] in ((4, 51), (4, 52))
