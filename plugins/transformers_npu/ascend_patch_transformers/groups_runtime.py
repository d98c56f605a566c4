"""Patch groups of the plugin: the runtime family (accelerate, the Trainer's CUDA checks).

Like every groups module of the plugin, this imports no patch family and no library: a
group's ``patches()`` imports its family module only when the core builds the group,
which it does only once the group's ``requires`` hold (checked from metadata).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook
from ascend_patch_core import Patch

from .groups_norms import MODELING_MODULES


__all__ = [
    "GROUPS",
    "AccelerateNpu",
    "DiffusersAttention",
    "DiffusersRMSNorm",
    "PlaceholderMaskCount",
    "VisionPatchify",
]

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
        from .accelerate_compat import accelerate_patches

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

    requires = ("transformers>=4.51,<6", "torch-npu")

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
    requires = ("transformers>=4.51,<6", "torch>=2.1", "torch-npu")

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .image_processing import PROCESSOR_MODULES
        from .image_processing import vision_patchify_hook

        for pattern in PROCESSOR_MODULES:
            yield ModuleHook(pattern, vision_patchify_hook, name=f"{pattern}: permutes of > 8 dims")


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (
    AccelerateNpu,
    DiffusersAttention,
    DiffusersRMSNorm,
    PlaceholderMaskCount,
    VisionPatchify,
)
