"""The plugin's patch groups and import rules: everything ``apply()`` imports of it.

This module imports no patch family and no library: a group's ``patches()`` imports its
family module only when the core builds the group, which it does only once the group's
``requires`` hold (checked from metadata). One module, not one per family: each module
``apply()`` imports costs ~0.1 ms of every program's start-up (docs/benchmarks.md).

* runtime: :class:`AccelerateNpu`, :class:`DiffusersAttention`,
  :class:`DiffusersRMSNorm`, :class:`PlaceholderMaskCount`, :class:`VisionPatchify`;
* attention: :class:`NpuAttention`, and :func:`import_rules` (the modules served on an
  NPU machine);
* norms (opt-in): :class:`TransformersRMSNorm`, :class:`TransformersRotary`,
  :class:`TransformersSwiGLU`. Each declares one pattern hook over
  ``transformers.models.*.modeling_*``: when such a module is imported (or at once, if
  it already is), its source is searched for the formula the group serves, whatever the
  model is called (see :mod:`ascend_patch_transformers.source_shapes`). They are opt-in:
  their kernels round differently from the eager formulas in float16/bfloat16 (the last
  bits move), and their speed on an NPU has not been measured here. Enable them by name
  (``ASCEND_PATCH_ENABLE=TransformersRMSNorm,TransformersRotary,TransformersSwiGLU``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook
from ascend_patch_core import Patch


if TYPE_CHECKING:
    from ascend_patch_core import ImportRule


__all__ = [
    "ATTENTION_GROUPS",
    "GROUPS",
    "MODELING_MODULES",
    "NORMS_GROUPS",
    "RUNTIME_GROUPS",
    "TRANSFORMERS_NPU",
    "AccelerateNpu",
    "DiffusersAttention",
    "DiffusersRMSNorm",
    "NpuAttention",
    "PlaceholderMaskCount",
    "TransformersRMSNorm",
    "TransformersRotary",
    "TransformersSwiGLU",
    "VisionPatchify",
    "findable",
    "import_rules",
    "npu_integration_needs_einops",
]

#: Where the pattern hooks look (``fnmatch``); source_shapes.MODELING_MODULES says the same.
MODELING_MODULES = "transformers.models.*.modeling_*"

#: The transformers releases the plugin supports (4.51 to 5.x): the library first, so a
#: program without it needs no version logic (requirements are checked in order).
TRANSFORMERS = "transformers>=4.51,<6"
#: Where an NPU runtime exists (torch_npu, or the emulator, which announces its version).
NPU_RUNTIME = "torch-npu"
#: The groups that run torch code of their own: transformers, torch, an NPU runtime.
TRANSFORMERS_NPU = (TRANSFORMERS, "torch>=2.1", NPU_RUNTIME)

# ---------------------------------------------------------------------------- runtime

#: The diffusers releases the diffusers groups are tested with: 0.35.1 to 0.42.1.
DIFFUSERS = "diffusers>=0.35,<0.43"


class AccelerateNpu(Patch):
    """accelerate on the NPU: no NVML NUMA binding; ``hccl`` -> gloo under the emulator.

    ``Accelerator()`` and the ``Trainer`` pick ``npu`` and ``hccl`` by themselves
    (accelerate >= 1.0 asks for the NPU before CUDA); see docs/transformers-plugin.md,
    "accelerate, the Trainer and transfer_to_npu's library functions".
    """

    #: torch-npu: only where an NPU stack exists (the emulator counts as one).
    requires = ("torch-npu", "accelerate>=1.0")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .accelerate_npu import accelerate_patches

        return accelerate_patches(options)


class DiffusersAttention(Patch):
    """diffusers' ``AttnProcessor2_0`` -> ``npu_fusion_attention`` (no mask or a boolean one)."""

    requires = ("torch-npu", DIFFUSERS)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .diffusers_attention import attention_processor_patches

        return attention_processor_patches(options)


class DiffusersRMSNorm(Patch):
    """diffusers' ``RMSNorm`` and ``MochiRMSNorm`` -> ``npu_rms_norm``."""

    requires = ("torch-npu", DIFFUSERS)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .diffusers_norms import norm_patches

        return norm_patches(options)


class PlaceholderMaskCount(Patch):
    """Multimodal ``get_placeholder_mask``: count the placeholder mask, not a gather of the embeddings.

    Where the method's source checks the token count with ``inputs_embeds[mask].numel()``
    (4.57's vision-language models, some 5.x audio models) it runs its own code with that
    expression counted instead: the same masks, values and errors, without copying the
    selected embeddings. Default: the results are identical. See
    :mod:`ascend_patch_transformers.placeholder_mask`.
    """

    requires = (TRANSFORMERS, NPU_RUNTIME)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .placeholder_mask import placeholder_mask_hook

        yield ModuleHook(
            MODELING_MODULES,
            placeholder_mask_hook,
            name="get_placeholder_mask: count the mask, no gather",
        )


class VisionPatchify(Patch):
    """Vision processors' patchify permutes of 9-10 dims -> passes of at most 8 (same values).

    See :mod:`ascend_patch_transformers.image_processing`.
    """

    #: torch-npu: the rewritten methods run only on NPU inputs (the emulator counts).
    requires = TRANSFORMERS_NPU

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .image_processing import PROCESSOR_MODULES
        from .image_processing import vision_patchify_hook

        for pattern in PROCESSOR_MODULES:
            yield ModuleHook(pattern, vision_patchify_hook, name=f"{pattern}: permutes of > 8 dims")


# -------------------------------------------------------------------------- attention


class NpuAttention(Patch):
    """``attn_implementation="npu"``: transformers' attention interface on npu_fusion_attention.

    Registers the name in ``ALL_ATTENTION_FUNCTIONS`` (and, from transformers 4.53, the
    SDPA mask builder under it); calls the op for the inputs it takes and transformers'
    ``sdpa`` (``eager`` for attention weights) for the others, counted in the report
    (see :mod:`ascend_patch_transformers.attention_kernels`). ``flash_attention_2`` is left to
    transformers' own NPU path (``transformers.integrations.npu_flash_attention``).
    """

    requires = (TRANSFORMERS, NPU_RUNTIME)

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .attention import attention_patches

        return attention_patches(options, npu_module_served=npu_integration_needs_einops())


def findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_rules() -> list[ImportRule]:
    """Modules served on an NPU machine (nothing is imported here; a few ``find_spec``).

    * ``flash_attn`` (and ``flash_attn.bert_padding``, ``flash_attn.flash_attn_interface``)
      by :mod:`ascend_patch_transformers.served.flash_attn`, only while no real
      flash_attn is installed (``when_missing``): a real one is always imported instead;
    * with transformers 4.51/4.52 and no einops: transformers' own
      ``integrations.npu_flash_attention`` (by the same module), which imports einops
      and, through ``modeling_flash_attention_utils``, makes every model module fail to
      import.

    Only where an NPU runtime is importable (torch_npu, or the emulator's).
    """
    if not findable("torch_npu"):
        return []
    # Imported here: the core loads its import-rule machinery only for programs that use it.
    from ascend_patch_core import ReplaceImport

    rules: list[ImportRule] = [
        ReplaceImport(name, "ascend_patch_transformers.served.flash_attn:build", when_missing=True)
        for name in ("flash_attn", "flash_attn.bert_padding", "flash_attn.flash_attn_interface")
    ]
    if npu_integration_needs_einops():
        rules.append(
            ReplaceImport(
                "transformers.integrations.npu_flash_attention",
                "ascend_patch_transformers.served.flash_attn:build_npu_integration",
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


# ------------------------------------------------------------------------------ norms


class TransformersRMSNorm(Patch):
    """RMSNorm classes of a known formula (standard, Gemma's ``1 + weight``) -> ``npu_rms_norm``.

    See :mod:`ascend_patch_transformers.rms_norm`.
    """

    opt_in = True
    requires = TRANSFORMERS_NPU

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .rms_norm import rms_norm_hook

        yield ModuleHook(MODELING_MODULES, rms_norm_hook, name="RMSNorm classes -> npu_rms_norm")


class TransformersRotary(Patch):
    """The standard ``apply_rotary_pos_emb`` and the vision towers' rotary -> ``npu_rotary_mul``.

    See :mod:`ascend_patch_transformers.rotary` and
    :mod:`ascend_patch_transformers.vision_rotary`.
    """

    opt_in = True
    requires = TRANSFORMERS_NPU

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .rotary import rotary_hook
        from .vision_rotary import vision_rotary_hook

        yield ModuleHook(
            MODELING_MODULES, rotary_hook, name="apply_rotary_pos_emb -> npu_rotary_mul"
        )
        yield ModuleHook(
            MODELING_MODULES,
            vision_rotary_hook,
            name="apply_rotary_pos_emb_vision -> npu_rotary_mul",
        )


class TransformersSwiGLU(Patch):
    """SwiGLU MLP classes (separate or fused gate/up projections) -> ``npu_swiglu``.

    See :mod:`ascend_patch_transformers.swiglu`.
    """

    opt_in = True
    requires = TRANSFORMERS_NPU

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .swiglu import swiglu_hook

        yield ModuleHook(MODELING_MODULES, swiglu_hook, name="SwiGLU MLP classes -> npu_swiglu")


#: The groups by family (tests and tools take one family), and every group in the order
#: the plugin registers them.
RUNTIME_GROUPS: tuple[type[Patch], ...] = (
    AccelerateNpu,
    DiffusersAttention,
    DiffusersRMSNorm,
    PlaceholderMaskCount,
    VisionPatchify,
)
ATTENTION_GROUPS: tuple[type[Patch], ...] = (NpuAttention,)
NORMS_GROUPS: tuple[type[Patch], ...] = (
    TransformersRMSNorm,
    TransformersRotary,
    TransformersSwiGLU,
)
GROUPS: tuple[type[Patch], ...] = (*RUNTIME_GROUPS, *ATTENTION_GROUPS, *NORMS_GROUPS)
