"""Patch groups of the plugin: the norms family (RMSNorm, rotary embedding, SwiGLU MLP).

Like every groups module of the plugin, this imports no patch family and no library: a
group's ``patches()`` imports its family module only when the core builds the group,
which it does only once the group's ``requires`` hold (checked from metadata).

Each group declares one pattern hook over ``transformers.models.*.modeling_*``: when
such a module is imported (or at once, if it already is), its source is searched for the
formula the group serves, whatever the model is called (see
:mod:`ascend_patch_transformers.source_shapes`). The three are opt-in: their kernels
round differently from the eager formulas in float16/bfloat16 (the last bits move), and
their speed on an NPU has not been measured here. Enable them by name
(``ASCEND_PATCH_ENABLE=TransformersRMSNorm,TransformersRotary,TransformersSwiGLU``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import ModuleHook
from ascend_patch_core import Patch


__all__ = [
    "GROUPS",
    "MODELING_MODULES",
    "TRANSFORMERS_NPU",
    "TransformersRMSNorm",
    "TransformersRotary",
    "TransformersSwiGLU",
]

#: Where the hooks look (``fnmatch``); source_shapes.MODELING_MODULES says the same.
MODELING_MODULES = "transformers.models.*.modeling_*"

#: The versions these groups support, and an NPU runtime (the emulator counts as one).
TRANSFORMERS_NPU = ("transformers>=4.51,<6", "torch>=2.1", "torch-npu")


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


#: The groups of this module, in the order the plugin registers them.
GROUPS: tuple[type[Patch], ...] = (TransformersRMSNorm, TransformersRotary, TransformersSwiGLU)
