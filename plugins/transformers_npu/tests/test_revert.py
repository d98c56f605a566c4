"""revert() puts back exactly what apply() changed, for every group of the plugin.

Attention names and masks registered in transformers' interfaces are removed again, the
replaced methods and functions are the originals, and a pattern hook's patches (opt-in
groups, enabled here) are undone on the modeling module it visited.
"""

from __future__ import annotations

from typing import Any

from ascend_patch_transformers.groups import ATTENTION_GROUPS as ATTENTION
from ascend_patch_transformers.groups import NORMS_GROUPS as NORMS
from ascend_patch_transformers.groups import RUNTIME_GROUPS as RUNTIME
from hf_stacks import require_module


transformers = require_module("transformers")
diffusers = require_module("diffusers")
accelerate = require_module("accelerate")

import importlib.util  # noqa: E402

import accelerate.state as accelerate_state  # noqa: E402
import accelerate.utils.environment as accelerate_environment  # noqa: E402
import diffusers.models.attention_processor as attention_processor  # noqa: E402
import diffusers.models.normalization as normalization  # noqa: E402
import transformers.modeling_utils as modeling_utils  # noqa: E402
import transformers.models.llama.modeling_llama as modeling_llama  # noqa: E402


def _masks() -> dict[str, Any]:
    """transformers' mask builders by implementation (none before 4.53: no masking_utils)."""
    if importlib.util.find_spec("transformers.masking_utils") is None:
        return {}
    import transformers.masking_utils as masking_utils

    return dict(masking_utils.AttentionMaskInterface._global_mapping)


def _state() -> dict[str, Any]:
    return {
        "attention functions": dict(modeling_utils.AttentionInterface._global_mapping),
        "attention masks": _masks(),
        "flash check": vars(modeling_utils.PreTrainedModel).get("_check_and_enable_flash_attn_2"),
        "AttnProcessor2_0": vars(attention_processor.AttnProcessor2_0)["__call__"],
        "RMSNorm": vars(normalization.RMSNorm)["forward"],
        "MochiRMSNorm": vars(normalization.MochiRMSNorm)["forward"],
        "numa": accelerate_environment.override_numa_affinity,
        "backend": vars(accelerate_state.PartialState)["_prepare_backend"],
        "LlamaRMSNorm": vars(modeling_llama.LlamaRMSNorm)["forward"],
        "rotary": modeling_llama.apply_rotary_pos_emb,
        "LlamaMLP": vars(modeling_llama.LlamaMLP)["forward"],
    }


def test_revert_restores_everything(npu_emulator, isolated_patcher) -> None:
    before = _state()
    isolated_patcher.add(*ATTENTION, *NORMS, *RUNTIME)
    for group in NORMS:
        isolated_patcher.enable(group.__name__)
    isolated_patcher.apply()
    applied = _state()
    changed = {name for name in before if applied[name] != before[name]}
    # 4.51-4.56's flash_attention_2 check is patched only where the flash_attn stand-in
    # is findable; masks only from 4.53 on.
    assert changed >= set(before) - {"flash check", "attention masks"}
    assert "npu" in applied["attention functions"]
    isolated_patcher.revert()
    after = _state()
    for name, value in before.items():
        assert after[name] == value, name
    assert "npu" not in after["attention functions"]
