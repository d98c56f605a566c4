"""TransformersRotary, vision side: the vision towers' rotary -> ``torch_npu.npu_rotary_mul``.

The vision encoders of Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and its MoE), GLM-4V and the
models generated from them rotate the patch queries and keys with one function, found
here by its source (:mod:`ascend_patch_transformers.source_shapes`), whatever it is
called (transformers names it ``apply_rotary_pos_emb_vision``)::

    orig_q_dtype, orig_k_dtype = q.dtype, k.dtype
    q, k = q.float(), k.float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    q_embed = q * cos + rotate_half(q) * sin; k_embed = ...
    return q_embed.to(orig_q_dtype), k_embed.to(orig_k_dtype)

with the module's ``rotate_half`` the standard half rotation. The replacement keeps the
float32 computation and the casts back: ``npu_rotary_mul(q.float(), cos', sin')`` in
``half`` mode, cos'/sin' being cos/sin unsqueezed at -2 in float32, and the result cast
to q's (k's) dtype. Variants that rotate interleaved pairs (``rotate_pairwise``), only
part of the head, or take ``freqs`` instead of cos/sin (Qwen2.5-Omni's audio side in
4.57) have other shapes and are not matched.

The runtime check sends a call to the kernel only in the op's documented layouts:

* ``q``/``k`` ``[T, N, D]`` (TND; the vision towers' packed patches) with cos/sin
  ``[T, D]``, so the factors are ``[T, 1, D]`` (``T1D``);
* ``q``/``k`` ``[B, S, N, D]`` (BSND) with cos/sin ``[S, D]``, ``[1, S, D]`` or
  ``[B, S, D]``, so the factors are ``1S1D`` or ``BS1D`` (a 2-D cos/sin is viewed as
  ``[1, S, 1, D]``: the broadcasting the original relies on);

with q and k in float16, bfloat16 or float32, cos/sin in one of them, ``D`` even and
below 896, ``N`` and ``B`` below 1000, NPU tensors. Everything else (float64, a
partial-width cos, other ranks) runs the original and counts as a fallback. As for the
text rotary, the values of cos/sin are not checked against the op's [-1, 1].
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import with_imports

from .source_shapes import ROTATE_HALF
from .source_shapes import module_definitions
from .source_shapes import shape_of_source


if TYPE_CHECKING:  # at run time, with_imports binds it on the replacement's first call
    from torch_npu import npu_rotary_mul


__all__ = ["vision_rotary_hook", "vision_rotary_layout_ok"]

_VISION_ROTARY = shape_of_source(
    """
    def apply_rotary_pos_emb_vision(q, k, cos, sin):
        orig_q_dtype = q.dtype
        orig_k_dtype = k.dtype
        q, k = q.float(), k.float()
        cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        q_embed = (q * cos) + (rotate_half(q) * sin)
        k_embed = (k * cos) + (rotate_half(k) * sin)
        q_embed = q_embed.to(orig_q_dtype)
        k_embed = k_embed.to(orig_k_dtype)
        return q_embed, k_embed
    """
)

_NPU_DTYPES = ("float16", "bfloat16", "float32")


def _factor_shape(x: Any, cos: Any) -> tuple[int, ...] | None:
    """The shape of cos unsqueezed at -2 as the op takes it next to ``x``; None outside the layouts."""
    width = cos.shape[-1]
    factor = (*cos.shape[:-1], 1, width)
    if x.shape[-1] != width:
        return None  # partial rotary: another formula
    if x.dim() == 3:  # TND with T1D
        return factor if factor == (x.shape[0], 1, width) and x.shape[1] < 1000 else None
    if x.dim() == 4 and len(factor) <= 4:  # BSND with 1S1D or BS1D
        factor = (1,) * (4 - len(factor)) + factor
        batch, seq, heads = x.shape[:3]
        ok = factor[0] in (1, batch) and factor[1:] == (seq, 1, width)
        return factor if ok and batch < 1000 and heads < 1000 else None
    return None


def vision_rotary_layout_ok(q: Any, k: Any, cos: Any, sin: Any) -> bool:
    """Whether ``npu_rotary_mul`` takes q and k with cos/sin unsqueezed at -2 (``runtime_check``)."""
    torch = sys.modules["torch"]
    tensors = (q, k, cos, sin)
    if not all(type(t) is torch.Tensor and getattr(t, "is_npu", False) is True for t in tensors):
        return False
    if any(str(t.dtype).rpartition(".")[2] not in _NPU_DTYPES for t in tensors):
        return False
    if sin.shape != cos.shape or cos.dim() == 0:
        return False
    width = cos.shape[-1]
    if width == 0 or width % 2 or width >= 896:
        return False
    return _factor_shape(q, cos) is not None and _factor_shape(k, cos) is not None


def _factors(x: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    shape = _factor_shape(x, cos)
    return cos.float().reshape(shape), sin.float().reshape(shape)


@with_imports(("torch_npu", "npu_rotary_mul"))
def _vision_rotary(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    # As the original: computed in float32, cast back to each input's dtype.
    q_cos, q_sin = _factors(q, cos, sin)
    k_cos, k_sin = (q_cos, q_sin) if k.dim() == q.dim() else _factors(k, cos, sin)
    q_embed = npu_rotary_mul(q.float(), q_cos, q_sin, rotary_mode="half")
    k_embed = npu_rotary_mul(k.float(), k_cos, k_sin, rotary_mode="half")
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


def vision_rotary_hook(module: ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: a patch for each function of ``module`` with the vision rotary's source."""
    definitions = module_definitions(module)
    if definitions.functions.get("rotate_half") != ROTATE_HALF:
        return
    for name, function_shape in definitions.functions.items():
        if function_shape != _VISION_ROTARY:
            continue
        if getattr(module.__dict__.get(name), "__module__", None) != module.__name__:
            continue  # rebound to something this module's source does not show
        yield AtomicPatch(
            f"{module.__name__}:{name}",
            _vision_rotary,
            runtime_check=vision_rotary_layout_ok,
            note="npu_rotary_mul (half, float32), vision rotary recognised by source",
        )
