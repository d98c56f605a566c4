"""TransformersRotary: ``apply_rotary_pos_emb`` -> ``torch_npu.npu_rotary_mul`` on the NPU.

Found by a pattern hook: each ``transformers.models.*.modeling_*`` module, when imported,
is searched for a module-level ``apply_rotary_pos_emb`` that is, by source
(:mod:`ascend_patch_transformers.source_shapes`), the standard one::

    cos = cos.unsqueeze(unsqueeze_dim); sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

in either signature transformers has used: ``(q, k, cos, sin, unsqueeze_dim=1)`` (5.x)
and ``(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)`` (4.x, where
``position_ids`` is unused), also with Olmo2's cast of the results back to q's and k's
dtypes (a no-op for the one-dtype calls served), with the module's ``rotate_half`` the
standard half rotation (``cat(-x2, x1)``). That is ``npu_rotary_mul(x, cos, sin)`` in ``half`` mode.

Partial rotary is served too: Phi-3's form rotates only ``q[..., :rotary_dim]`` with
``rotary_dim = cos.shape[-1]`` and concatenates the rest unchanged; GPT-NeoX (and the
models generated from it: Bamba, GLM-4-MoE, Qwen3-Next, ...) and Nemotron write the same
formula in other statements. The rotated part goes to ``npu_rotary_mul`` and the
pass-through part is concatenated as the original does (a new tensor even when it is
empty). Not matched: interleaved pairs (GLM, GLM-4: their ``rotate_half`` pairs
neighbours and cos/sin are ``repeat_interleave``d), multimodal sections (Qwen2-VL's
``apply_multimodal_rotary_pos_emb``), a module whose ``rotate_half`` has another name.

The runtime check sends a call to the kernel only where its documented layouts allow:
4-D ``q``/``k`` with ``unsqueeze_dim`` 1 (BNSD, cos/sin ``B1SD`` or ``11SD``) or 2 (BSND,
cos/sin ``BS1D`` or ``1S1D``), one dtype (float16, bfloat16, float32) for q, k, cos and
sin (else the original's type promotion decides the result's dtype), cos/sin as wide as
the head (``D``; for partial rotary, no wider than the head), the rotated width even,
above 0 and below 896, batch and heads below 1000. Everything else runs the original
and counts as a fallback.

Not checked: the op's documentation says r1/r2 (cos/sin) lie in [-1, 1]. Rope scalings
that multiply cos/sin by an ``attention_scaling`` above 1 (YaRN, LongRoPE) leave that
range; checking values would cost a device-to-host sync per call. Under the emulator the
formula holds for any values; on an NPU this case has not been measured. Nor is how the
op takes the rotated part of a partial rotary, a strided view of q (the emulator's
kernel takes any strides; q itself is usually a transposed view already).
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
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


__all__ = ["rotary_hook", "rotary_layout_ok"]

_BODY = """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
"""
_WITHOUT_POSITION_IDS = shape_of_source(
    "def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):" + _BODY
)
_WITH_POSITION_IDS = shape_of_source(
    "def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):" + _BODY
)
# Olmo2's: the same, cast back to q's and k's dtypes (a no-op for the one-dtype calls served).
_CAST_BACK = shape_of_source(
    """
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        q_type, k_type = q.dtype, k.dtype
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        q_embed = (q * cos) + (rotate_half(q) * sin)
        k_embed = (k * cos) + (rotate_half(k) * sin)
        return q_embed.to(q_type), k_embed.to(k_type)
    """
)
_CAST_BACK_WITH_POSITION_IDS = shape_of_source(
    """
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        q_type, k_type = q.dtype, k.dtype
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        q_embed = (q * cos) + (rotate_half(q) * sin)
        k_embed = (k * cos) + (rotate_half(k) * sin)
        return q_embed.to(q_type), k_embed.to(k_type)
    """
)
# Partial rotary: only the first cos.shape[-1] features of each head are rotated, the
# rest passes through (Phi-3, Phi-4-multimodal). Written three ways in transformers:
# the concatenation inline (Phi-3), in statements of its own (GPT-NeoX, Bamba, GLM-4-MoE,
# Qwen3-Next, ...), and with q and k rebound to their rotated parts (Nemotron).
_PARTIAL_BODIES = (
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed
    """,
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    q_embed = torch.cat([q_embed, q_pass], dim=-1)
    k_embed = torch.cat([k_embed, k_pass], dim=-1)
    return q_embed, k_embed
    """,
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rot_dim = cos.shape[-1]
    q, q_pass = q[..., :rot_dim], q[..., rot_dim:]
    k, k_pass = k[..., :rot_dim], k[..., rot_dim:]
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return torch.cat((q_embed, q_pass), dim=-1), torch.cat((k_embed, k_pass), dim=-1)
    """,
)
_SIGNATURE = "def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):"
_SIGNATURE_4X = "def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):"
_PARTIAL = {
    shape_of_source(_SIGNATURE + textwrap.indent(textwrap.dedent(b), "    "))
    for b in _PARTIAL_BODIES
}
_PARTIAL_4X = {
    shape_of_source(_SIGNATURE_4X + textwrap.indent(textwrap.dedent(b), "    "))
    for b in _PARTIAL_BODIES
}
_NPU_DTYPES = ("float16", "bfloat16", "float32")


def rotary_layout_ok(
    q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any, partial: bool = False
) -> bool:
    """Whether ``npu_rotary_mul`` takes q and k with cos/sin unsqueezed at ``unsqueeze_dim``.

    ``partial``: only the first ``cos.shape[-1]`` features of q and k go to the op, so
    the head may be wider than cos/sin (never narrower: the original fails there).
    """
    torch = sys.modules["torch"]
    if not all(type(t) is torch.Tensor for t in (q, k, cos, sin)):
        return False
    if not all(getattr(t, "is_npu", False) is True for t in (q, k, cos, sin)):
        return False
    if str(q.dtype).rpartition(".")[2] not in _NPU_DTYPES or any(
        t.dtype != q.dtype for t in (k, cos, sin)
    ):
        return False
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    if type(unsqueeze_dim) is not int or unsqueeze_dim not in (1, 2, -3, -2):
        return False
    heads_dim = unsqueeze_dim % 4  # 1: BNSD, 2: BSND
    seq_dim = 3 - heads_dim
    rotary = cos.shape[-1]
    if rotary % 2 or rotary >= 896 or rotary == 0:
        return False
    for x in (q, k):
        if (
            (x.shape[-1] < rotary if partial else x.shape[-1] != rotary)
            or x.shape[0] >= 1000
            or x.shape[heads_dim] >= 1000
            or cos.shape[0] not in (1, x.shape[0])
            or cos.shape[1] != x.shape[seq_dim]
        ):
            return False
    return True


def _check_without_position_ids(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> bool:
    return rotary_layout_ok(q, k, cos, sin, unsqueeze_dim)


def _check_with_position_ids(
    q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: Any = 1
) -> bool:
    # position_ids is unused by the original (4.x kept it for compatibility).
    return rotary_layout_ok(q, k, cos, sin, unsqueeze_dim)


def _check_partial(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> bool:
    return rotary_layout_ok(q, k, cos, sin, unsqueeze_dim, partial=True)


def _check_partial_4x(
    q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: Any = 1
) -> bool:
    return rotary_layout_ok(q, k, cos, sin, unsqueeze_dim, partial=True)


@with_imports(("torch_npu", "npu_rotary_mul"))
def _rotate_partial(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int) -> tuple[Any, Any]:
    cat = sys.modules["torch"].cat
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary = cos.shape[-1]
    # The original concatenates even an empty pass-through part: a new tensor, as here.
    q_embed = cat([npu_rotary_mul(q[..., :rotary], cos, sin), q[..., rotary:]], dim=-1)
    k_embed = cat([npu_rotary_mul(k[..., :rotary], cos, sin), k[..., rotary:]], dim=-1)
    return q_embed, k_embed


def _partial(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
    return _rotate_partial(q, k, cos, sin, unsqueeze_dim)


def _partial_4x(
    q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1
) -> Any:
    return _rotate_partial(q, k, cos, sin, unsqueeze_dim)


@with_imports(("torch_npu", "npu_rotary_mul"))
def _rotate(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int) -> tuple[Any, Any]:
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return npu_rotary_mul(q, cos, sin), npu_rotary_mul(k, cos, sin)


def _without_position_ids(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
    return _rotate(q, k, cos, sin, unsqueeze_dim)


def _with_position_ids(
    q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1
) -> Any:
    return _rotate(q, k, cos, sin, unsqueeze_dim)


_BY_SHAPE: dict[str, tuple[Callable[..., Any], Callable[..., bool]]] = {
    _WITHOUT_POSITION_IDS: (_without_position_ids, _check_without_position_ids),
    _WITH_POSITION_IDS: (_with_position_ids, _check_with_position_ids),
    _CAST_BACK: (_without_position_ids, _check_without_position_ids),
    _CAST_BACK_WITH_POSITION_IDS: (_with_position_ids, _check_with_position_ids),
    **dict.fromkeys(_PARTIAL, (_partial, _check_partial)),
    **dict.fromkeys(_PARTIAL_4X, (_partial_4x, _check_partial_4x)),
}
_NOTES = dict.fromkeys(_PARTIAL | _PARTIAL_4X, "partial rotary (the first cos.shape[-1] features)")


def rotary_hook(module: ModuleType) -> Iterator[AtomicPatch]:
    """The ``ModuleHook`` callback: a patch for ``module.apply_rotary_pos_emb`` if it is the standard one."""
    definitions = module_definitions(module)
    chosen = _BY_SHAPE.get(definitions.functions.get("apply_rotary_pos_emb", ""))
    if chosen is None or definitions.functions.get("rotate_half") != ROTATE_HALF:
        return
    function = module.__dict__.get("apply_rotary_pos_emb")
    if getattr(function, "__module__", None) != module.__name__:
        return  # rebound to something this module's source does not show
    replacement, check = chosen
    kind = _NOTES.get(definitions.functions["apply_rotary_pos_emb"], "standard")
    yield AtomicPatch(
        f"{module.__name__}:apply_rotary_pos_emb",
        replacement,
        runtime_check=check,
        note=f"npu_rotary_mul (half), {kind} apply_rotary_pos_emb recognised by source",
    )
