"""The ``npu`` attention implementation: transformers' attention interface on npu_fusion_attention.

A model built with ``attn_implementation="npu"`` calls, in every attention layer,
``ALL_ATTENTION_FUNCTIONS["npu"](module, query, key, value, attention_mask, dropout=...,
scaling=..., **kwargs)`` with ``query`` ``[B, Nq, Sq, D]`` and ``key``/``value``
``[B, Nkv, Skv, D]`` (BNSD), and expects ``(output [B, Sq, Nq, D], weights or None)``,
as from transformers' ``sdpa_attention_forward``. This module serves that call:

* :func:`npu_attention_forward` -- what is registered under ``"npu"``; the group's
  ``runtime_check`` patch (see :mod:`ascend_patch_transformers.attention`, the group's
  declarations) puts the fused path in front of it for the inputs the op takes, so the
  report counts fused calls and fallbacks; unpatched it is the fallback: transformers'
  ``sdpa`` (``eager`` when attention weights are asked for).
* :func:`fusion_attention_forward` -- one ``torch_npu.npu_fusion_attention`` call,
  BNSD layout, ``head_num = Nq`` (GQA: the op takes ``Nkv`` key/value heads itself),
  ``scale`` given explicitly (the op's default is 1.0, transformers' ``1/sqrt(D)``),
  ``keep_prob = 1 - dropout``, and the mask mapped to the op's polarity (True = masked out):
  a boolean SDPA mask (True = attend) is inverted; transformers 4.51's additive float
  mask (0 or the dtype's minimum) becomes ``mask != 0``; no mask with a causal module is
  the compressed ``triu(ones(2048, 2048), 1)`` mask with ``sparse_mode=2`` (top-left
  causal, as SDPA's ``is_causal`` and torch_npu's own SDPA kernel).
* :func:`fusion_supported` -- the ``runtime_check``: NPU tensors, float16/bfloat16/
  float32, ``Nq % Nkv == 0``, ``Nq <= 256``, head dim ``1..768`` (float32: a multiple of
  4, as torch_npu's SDPA kernel requires), no attention weights asked for, no softcap,
  no position bias, no attention sinks, and a mask the op can take (boolean, or additive
  with only 0 and "masked" values; any other float mask is a bias the op has no slot for).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from .causal_mask import compressed_causal_mask


__all__ = [
    "IMPLEMENTATION",
    "fusion_attention_forward",
    "fusion_supported",
    "npu_attention_forward",
]

#: The ``attn_implementation`` name this plugin registers.
IMPLEMENTATION = "npu"

_MAX_HEADS = 256
_MAX_HEAD_DIM = 768
_TOP_LEFT_CAUSAL = 2
# Keyword arguments some models pass that the op has no slot for.
_UNSUPPORTED_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def _on_npu(*tensors: Any) -> bool:
    # ``Tensor.is_npu`` (torch_npu's, and the emulator's, whose NPU tensors live on the CPU).
    return all(getattr(t, "is_npu", False) is True for t in tensors)


class _MaskCache:
    """The op's mask for the last mask seen: one model forward passes the same to every layer.

    Converting an additive float mask needs a look at its values (a host sync); keyed by
    the tensor's identity and version, that happens once per forward, not once per layer.
    """

    def __init__(self) -> None:
        self.key: tuple[Any, int] | None = None
        self.value: Any = None

    def get(self, mask: Any) -> Any:
        key = self.key
        if key is not None and key[0]() is mask and key[1] == mask._version:
            return self.value
        return _MISSING

    def put(self, mask: Any, value: Any) -> Any:
        self.key, self.value = (weakref.ref(mask), mask._version), value
        return value


_MISSING = object()
_masks = _MaskCache()


def _op_mask(mask: Any) -> Any:
    """The op's boolean mask (True = masked out) for ``mask``, or None if it has none."""
    import torch

    if mask.dtype == torch.bool:
        return torch.logical_not(mask)
    cached = _masks.get(mask)
    if cached is not _MISSING:
        return cached
    # transformers 4.51 gives custom implementations an additive mask: 0 where a token is
    # attended, the dtype's minimum where not. Anything else (ALiBi, a learnt bias) is a
    # bias, not a mask.
    masked = mask != 0
    floor = torch.finfo(mask.dtype).min / 2
    if bool(torch.where(masked, mask, floor).max() <= floor):
        return _masks.put(mask, masked)
    return _masks.put(mask, None)


def _mask_fits(mask: Any, query: Any, key: Any) -> bool:
    if mask.dim() != 4:
        return False
    batch, heads = query.shape[0], query.shape[1]
    return (
        mask.shape[0] in (1, batch)
        and mask.shape[1] in (1, heads)
        and mask.shape[2] == query.shape[2]
        and mask.shape[3] >= key.shape[2]
    )


def fusion_supported(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> bool:
    """Whether npu_fusion_attention computes this call exactly (the group's ``runtime_check``)."""
    import torch

    if not _on_npu(query, key, value):
        return False
    if kwargs.get("output_attentions") or any(
        kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS
    ):
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    dtype = query.dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if key.dtype != dtype or value.dtype != dtype:
        return False
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
    if kv_heads < 1 or heads % kv_heads or heads > _MAX_HEADS or value.shape[1] != kv_heads:
        return False
    if key.shape[3] != dim or not 1 <= value.shape[3] <= dim or dim > _MAX_HEAD_DIM:
        return False
    if dtype == torch.float32 and dim % 4:
        return False
    if attention_mask is None:
        causal = _causal(module, is_causal, query)
        # SDPA's is_causal is top-left; transformers gives no mask for a causal layer only
        # when query and key lengths are equal (or one query): anything else goes to SDPA.
        return not causal or query.shape[2] == key.shape[2]
    if not isinstance(attention_mask, torch.Tensor) or not _mask_fits(attention_mask, query, key):
        return False
    return attention_mask.dtype == torch.bool or (
        attention_mask.dtype.is_floating_point and _op_mask(attention_mask) is not None
    )


def _causal(module: Any, is_causal: bool | None, query: Any) -> bool:
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(causal) and query.shape[2] > 1


def fusion_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """The call on ``torch_npu.npu_fusion_attention`` (inputs :func:`fusion_supported` accepts)."""
    import torch_npu

    atten_mask = None
    sparse_mode = 0
    if attention_mask is None:
        if _causal(module, is_causal, query):
            atten_mask = compressed_causal_mask(query.device)
            sparse_mode = _TOP_LEFT_CAUSAL
    else:
        atten_mask = _op_mask(attention_mask)[..., : key.shape[2]]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = torch_npu.npu_fusion_attention(
        query,
        key,
        value,
        query.shape[1],
        "BNSD",
        atten_mask=atten_mask,
        scale=scale,
        keep_prob=1.0 - dropout,
        sparse_mode=sparse_mode,
    )[0]
    return out.transpose(1, 2).contiguous(), None


def _eager_mask(module: Any, query: Any, key: Any, attention_mask: Any, is_causal: Any) -> Any:
    """An additive mask for ``eager_attention_forward`` (which adds whatever it is given)."""
    import torch

    minimum = torch.finfo(query.dtype).min
    if attention_mask is None:
        if not _causal(module, is_causal, query):
            return None
        q_len, kv_len = query.shape[2], key.shape[2]
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril()
        attention_mask = allowed[None, None]
    if attention_mask.dtype != torch.bool:
        return attention_mask
    return torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
        ~attention_mask, minimum
    )


def _is_bias(mask: Any) -> bool:
    """A float mask with values other than 0 and "masked": an additive bias."""
    return (
        mask is not None
        and getattr(mask, "is_floating_point", lambda: False)()
        and mask.dim() == 4
        and _op_mask(mask) is None
    )


def _sdpa_with_bias(
    module: Any, query: Any, key: Any, value: Any, bias: Any, dropout: float, scaling: Any
) -> Any:
    """torch's SDPA with the bias added as it is.

    Not transformers' ``sdpa``: from 5.x, on an NPU, it turns every float mask into a
    boolean one (non-zero = masked), which drops a bias.
    """
    import torch

    groups = query.shape[1] // key.shape[1]
    key, value = (t.repeat_interleave(groups, 1) for t in (key, value))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias[..., : key.shape[2]], dropout_p=dropout, scale=scaling
    )
    return out.transpose(1, 2).contiguous()


def npu_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The ``"npu"`` implementation for inputs the op does not take: transformers' own.

    ``eager`` (the module's ``eager_attention_forward``) when attention weights or a
    softcap are asked for, torch's SDPA with the bias for an additive float bias, transformers' ``sdpa``
    otherwise; the group's patch runs :func:`fusion_attention_forward` in
    front of this for the inputs :func:`fusion_supported` accepts.
    """
    # Loaded: the model calling this went through it.
    interface = sys.modules["transformers.modeling_utils"].ALL_ATTENTION_FUNCTIONS
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    # Attention weights, and softcap (which transformers 4.57's sdpa ignores and 5.x's
    # refuses): the model's own eager attention, which computes both.
    wants_eager = kwargs.get("output_attentions") or kwargs.get("softcap") is not None
    if wants_eager and eager is not None:
        mask = _eager_mask(module, query, key, attention_mask, is_causal)
        return eager(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)  # type: ignore[no-any-return]
    if _is_bias(attention_mask):
        return _sdpa_with_bias(module, query, key, value, attention_mask, dropout, scaling), None
    if attention_mask is None:
        # Resolved here: transformers 4.51's sdpa ignores the module's is_causal and
        # treats every maskless call with more than one query as causal.
        kwargs["is_causal"] = _causal(module, is_causal, query)
    elif is_causal is not None:
        kwargs["is_causal"] = is_causal
    sdpa = interface["sdpa"]
    return sdpa(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )  # type: ignore[no-any-return]
