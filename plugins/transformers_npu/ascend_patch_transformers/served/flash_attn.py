"""A ``flash_attn``-compatible module on npu_fusion_attention, for machines without flash-attn.

flash-attn is CUDA-only (it does not build without CUDA), so code written for it fails at
``import flash_attn`` on an Ascend machine. Served as ``flash_attn`` (and
``flash_attn.bert_padding``, ``flash_attn.flash_attn_interface``) by a ``ReplaceImport``
rule with ``when_missing=True``: only where no real flash_attn is installed and an NPU
runtime is importable (see :func:`ascend_patch_transformers.groups.import_rules`).
The same module also serves, on these functions, transformers 4.51/4.52's
``transformers.integrations.npu_flash_attention`` where einops is missing
(:func:`build_npu_integration`); it is named after ``flash_attn``, the main one.

Same names, arguments and results as flash-attn 2.x:

* ``flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
  return_attn_probs=False)``, ``q`` ``[B, Sq, Nq, D]``, ``k``/``v`` ``[B, Sk, Nkv, D]``
  (the op's ``BSND`` layout; GQA by the op); ``flash_attn_kvpacked_func`` and
  ``flash_attn_qkvpacked_func`` unpack and call it;
* ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, ...)``, ``q`` ``[Tq, Nq, D]`` (the op's ``TND`` layout, with
  ``actual_seq_qlen = cu_seqlens_q[1:]``: cumulative ends without the leading 0), and
  its packed variants;
* ``flash_attn.bert_padding``: ``unpad_input`` (five results, as flash-attn >= 2.7),
  ``pad_input``, ``index_first_axis``, ``index_put_first_axis``.

Mapping: ``softmax_scale`` defaults to ``1/sqrt(D)`` (the op's default is 1.0);
``keep_prob = 1 - dropout_p``; ``causal`` is flash-attn's bottom-right alignment
(``sparse_mode=3`` with the compressed ``triu(ones(2048, 2048), 1)`` mask), and a
sliding window ``window_size=(left, right)`` is the op's band (``sparse_mode=4``,
``pre_tockens=left``, ``next_tockens=right``, 0 when causal). Inputs the op does not
take -- tensors not on the NPU, ``softcap``, ``alibi_slopes``, dtypes other than
float16/bfloat16/float32, more than 256 query heads, head dims above 768 -- are
computed by :func:`reference_attention` (plain PyTorch, the same definition).
``return_attn_probs=True`` raises ``NotImplementedError``: the op does not return the
probabilities flash-attn's testing path gives.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ..causal_mask import compressed_causal_mask


__all__ = [
    "MODULES",
    "VERSION",
    "build",
    "build_npu_integration",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "index_first_axis",
    "index_put_first_axis",
    "pad_input",
    "reference_attention",
    "unpad_input",
]

#: The flash-attn release whose interface this module follows.
VERSION = "2.8.3"

_INT_MAX = 2147483647
_RIGHT_DOWN_CAUSAL = 3
_BAND = 4


# --------------------------------------------------------------------------- bert_padding


def index_first_axis(input: Any, indices: Any) -> Any:
    """``input[indices]`` along the first axis (differentiable)."""
    return input[indices]


def index_put_first_axis(values: Any, indices: Any, first_axis_dim: int) -> Any:
    """A ``[first_axis_dim, ...]`` tensor of zeros with ``values`` at ``indices``."""
    import torch

    out = torch.zeros(first_axis_dim, *values.shape[1:], device=values.device, dtype=values.dtype)
    return out.index_put((indices,), values)


def unpad_input(
    hidden_states: Any, attention_mask: Any, unused_mask: Any = None
) -> tuple[Any, ...]:
    """``(tokens [nnz, ...], indices, cu_seqlens [B + 1] int32, max_seqlen, seqused [B])``."""
    import torch
    import torch.nn.functional as F

    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item())
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states: Any, indices: Any, batch: int, seqlen: int) -> Any:
    """The inverse of :func:`unpad_input`: ``[batch, seqlen, ...]`` with zeros at padding."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


# --------------------------------------------------------------------------- the reference


def _allowed(sq: int, sk: int, causal: bool, window: tuple[int, int], device: Any) -> Any:
    """``[sq, sk]`` bool, True = attended: flash-attn's bottom-right aligned causal/window."""
    import torch

    row = torch.arange(sq, device=device)[:, None] + (sk - sq)
    col = torch.arange(sk, device=device)[None, :]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= col >= row - left
    if right >= 0:
        allowed &= col <= row + right
    return allowed


def reference_attention(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
) -> Any:
    """flash-attn's definition in PyTorch, ``[B, S, N, D]`` layout (rows with no key give 0)."""
    import torch

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    groups = q.shape[2] // k.shape[2]
    qf, kf, vf = (t.transpose(1, 2).float() for t in (q, k, v))
    kf, vf = kf.repeat_interleave(groups, 1), vf.repeat_interleave(groups, 1)
    scores = qf @ kf.transpose(-2, -1) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    sq, sk = q.shape[1], k.shape[1]
    if alibi_slopes is not None:
        row = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        distance = (torch.arange(sk, device=q.device)[None, :] - row).abs()
        slopes = alibi_slopes.float().reshape(-1, q.shape[2], 1, 1)
        scores = scores - slopes * distance
    allowed = _allowed(sq, sk, causal, tuple(window_size), q.device)  # type: ignore[arg-type]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if dropout_p > 0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return (probs @ vf).transpose(1, 2).to(q.dtype)


# --------------------------------------------------------------------------- the NPU path


def _fused(q: Any, k: Any, v: Any, softcap: float, alibi_slopes: Any) -> bool:
    import torch

    if not all(getattr(t, "is_npu", False) is True for t in (q, k, v)):
        return False
    if softcap or alibi_slopes is not None:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    heads, kv_heads, dim = q.shape[-2], k.shape[-2], q.shape[-1]
    if kv_heads < 1 or heads % kv_heads or heads > 256 or dim > 768 or k.shape[-1] != dim:
        return False
    return not (q.dtype == torch.float32 and dim % 4)


def _band(causal: bool, window: tuple[int, int], device: Any) -> dict[str, Any]:
    """The op's mask arguments for flash-attn's ``causal`` and ``window_size``."""

    left, right = window
    if left < 0 and right < 0 and not causal:
        return {}
    mask = compressed_causal_mask(device)
    if left < 0 and (right < 0 or causal):
        return {"atten_mask": mask, "sparse_mode": _RIGHT_DOWN_CAUSAL if causal else 0}
    if causal:
        right = 0
    return {
        "atten_mask": mask,
        "sparse_mode": _BAND,
        "pre_tockens": left if left >= 0 else _INT_MAX,
        "next_tockens": right if right >= 0 else _INT_MAX,
    }


def _no_probs(return_attn_probs: bool) -> None:
    if return_attn_probs:
        raise NotImplementedError(
            "flash_attn served by ascend-patch (npu_fusion_attention): return_attn_probs=True "
            "is not supported; the op does not return attention probabilities"
        )


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """flash-attn's ``flash_attn_func``: ``q [B, Sq, Nq, D]``, ``k``/``v`` ``[B, Sk, Nkv, D]``."""
    _no_probs(return_attn_probs)
    window = (int(window_size[0]), int(window_size[1]))
    if not _fused(q, k, v, softcap, alibi_slopes):
        return reference_attention(
            q, k, v, dropout_p, softmax_scale, causal, window, softcap, alibi_slopes
        )
    import torch_npu

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        q.shape[2],
        "BSND",
        scale=scale,
        keep_prob=1.0 - dropout_p,
        **_band(causal, window, q.device),
    )[0]


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
) -> Any:
    """flash-attn's ``flash_attn_varlen_func``: ``q [Tq, Nq, D]`` with ``cu_seqlens`` ``[B + 1]``."""
    _no_probs(return_attn_probs)
    if block_table is not None:
        raise NotImplementedError(
            "flash_attn served by ascend-patch (npu_fusion_attention): block_table (paged KV) "
            "is not supported"
        )
    window = (int(window_size[0]), int(window_size[1]))
    ends_q = [int(n) for n in cu_seqlens_q.tolist()]
    ends_k = [int(n) for n in cu_seqlens_k.tolist()]
    if not _fused(q, k, v, softcap, alibi_slopes):
        import torch

        parts = [
            reference_attention(
                q[sq0:sq1][None],
                k[sk0:sk1][None],
                v[sk0:sk1][None],
                dropout_p,
                softmax_scale,
                causal,
                window,
                softcap,
                None
                if alibi_slopes is None
                else alibi_slopes[i : i + 1]
                if alibi_slopes.dim() == 2
                else alibi_slopes,
            )[0]
            for i, (sq0, sq1, sk0, sk1) in enumerate(
                zip(ends_q[:-1], ends_q[1:], ends_k[:-1], ends_k[1:], strict=True)
            )
        ]
        out = torch.cat(parts) if parts else q.new_zeros(0, q.shape[1], v.shape[-1])
        if out.shape[0] < q.shape[0]:  # tokens after the last sequence stay zero
            out = torch.cat((out, out.new_zeros(q.shape[0] - out.shape[0], *out.shape[1:])))
        return out
    import torch_npu

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        q.shape[1],
        "TND",
        scale=scale,
        keep_prob=1.0 - dropout_p,
        actual_seq_qlen=ends_q[1:],
        actual_seq_kvlen=ends_k[1:],
        **_band(causal, window, q.device),
    )[0]


def flash_attn_kvpacked_func(q: Any, kv: Any, *args: Any, **kwargs: Any) -> Any:
    """``kv [B, Sk, 2, Nkv, D]``."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], *args, **kwargs)


def flash_attn_qkvpacked_func(qkv: Any, *args: Any, **kwargs: Any) -> Any:
    """``qkv [B, S, 3, N, D]``."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)


def flash_attn_varlen_kvpacked_func(
    q: Any, kv: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *args: Any, **kwargs: Any
) -> Any:
    """``kv [Tk, 2, Nkv, D]``."""
    return flash_attn_varlen_func(
        q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, *args, **kwargs
    )


def flash_attn_varlen_qkvpacked_func(qkv: Any, cu_seqlens: Any, *args: Any, **kwargs: Any) -> Any:
    """``qkv [T, 3, N, D]``; ``max_seqlen`` follows as for flash-attn."""
    max_seqlen = args[0] if args else kwargs.pop("max_seqlen", None)
    rest = args[1:]
    return flash_attn_varlen_func(
        qkv[:, 0],
        qkv[:, 1],
        qkv[:, 2],
        cu_seqlens,
        cu_seqlens,
        max_seqlen,
        max_seqlen,
        *rest,
        **kwargs,
    )


# --------------------------------------------------------------------------- the module

_INTERFACE = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]
_PADDING = ["index_first_axis", "index_put_first_axis", "pad_input", "unpad_input"]
#: The modules served, and the names each holds.
MODULES = {
    "flash_attn": _INTERFACE,
    "flash_attn.flash_attn_interface": _INTERFACE,
    "flash_attn.bert_padding": _PADDING,
}


def build(name: str) -> types.ModuleType:
    """``ReplaceImport`` factory: the module served as ``flash_attn`` (or a submodule)."""
    names = MODULES.get(name)
    if names is None:
        raise ImportError(f"ascend-patch serves no module {name!r} in place of flash_attn")
    this = sys.modules[__name__]
    module = types.ModuleType(
        name,
        f"flash-attn {VERSION}-compatible functions on npu_fusion_attention, served by "
        f"ascend-patch ({__name__}); flash-attn itself is not installed.",
    )
    if name == "flash_attn":
        module.__path__ = []  # a package: flash_attn.bert_padding and the interface import
        module.__version__ = VERSION  # type: ignore[attr-defined]
    for attr in names:
        setattr(module, attr, getattr(this, attr))
    module.__all__ = list(names)  # type: ignore[attr-defined]
    return module


# --------------------------------------------------------------------------- transformers 4.51

#: transformers 4.51/4.52's ``transformers.integrations.npu_flash_attention`` imports
#: einops (not a transformers dependency) when an NPU is present, and every model module
#: imports it through ``modeling_flash_attention_utils``: without einops no model loads.
#: Served in its place there, with the same names, on the functions above.
NPU_INTEGRATION = "transformers.integrations.npu_flash_attention"


def _npu_flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **kwargs: Any,
) -> Any:
    # transformers' own takes **kwargs and ignores them; a softcap is honoured here.
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, softcap=kwargs.get("softcap") or 0.0
    )


def _npu_flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **kwargs: Any,
) -> Any:
    return flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        softcap=kwargs.get("softcap") or 0.0,
    )


def build_npu_integration(name: str) -> types.ModuleType:
    """``ReplaceImport`` factory: ``transformers.integrations.npu_flash_attention`` without einops.

    Served only in its down-right causal mode (``NPU_FA2_SPARSE_MODE`` unset or 3), the
    one flash-attn >= 2.1 and the functions above use.
    """
    if name != NPU_INTEGRATION:
        raise ImportError(f"ascend-patch serves no module {name!r} in place of {NPU_INTEGRATION}")
    module = types.ModuleType(
        name,
        f"transformers' NPU flash-attention functions on npu_fusion_attention without einops, "
        f"served by ascend-patch ({__name__}).",
    )
    values: dict[str, Any] = {
        "TOP_LEFT_ALIGNED_CAUSAL_MASK_MODE": 2,
        "DOWN_RIGHT_ALIGNED_CAUSAL_MASK_MODE": _RIGHT_DOWN_CAUSAL,
        "SPARSE_MODE": _RIGHT_DOWN_CAUSAL,
        "is_npu_fa2_top_left_aligned_causal_mask": lambda: False,
        "index_first_axis": index_first_axis,
        "index_put_first_axis": index_put_first_axis,
        "pad_input": pad_input,
        "unpad_input": unpad_input,
        "npu_flash_attn_func": _npu_flash_attn_func,
        "npu_flash_attn_varlen_func": _npu_flash_attn_varlen_func,
    }
    for attr, value in values.items():
        setattr(module, attr, value)
    return module
