"""Fused attention: ``npu_fusion_attention``.

Formula (op docs): ``out = Dropout(Softmax(Mask(q @ kᵀ * scale + pse)), keep_prob) @ v``
per head, with these torch_npu conventions, all checked here:

* layouts ``BSH``, ``SBH``, ``BSND``, ``BNSD`` and ``TND`` (variable length, with
  ``actual_seq_qlen``/``actual_seq_kvlen`` as cumulative ends without a leading 0,
  trailing 0s for batches that take no part);
* ``atten_mask`` is bool/uint8 with **True = masked out** (the opposite of SDPA);
* ``scale`` defaults to 1.0, not ``1/sqrt(D)``;
* GQA: ``head_num`` query heads share ``Nkv`` key/value heads, query head ``h``
  using kv head ``h // (head_num / Nkv)``;
* ``sparse_mode`` 0 (mask plus the ``pre_tockens``/``next_tockens`` band), 1 (mask
  only), 2 (causal from the top-left), 3 (causal from the bottom-right), 4 (band
  from the bottom-right); 2 to 4 need the compressed mask
  ``torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)``; without a mask,
  ``sparse_mode`` and the band are ignored, as documented;
* ``sink`` (one logit per head) joins every softmax row and is dropped after.

Returns the op's seven values: the output, ``softmax_max`` and ``softmax_sum``
(float32, ``[B, N, S1, 8]``, the value repeated 8 times; TND: ``[N, T, 8]``, or
``[T, N, 8]`` with ``softmax_layout="TND"``), an empty ``softmax_out``, and the
dropout ``seed``, ``offset`` and ``numels``. Dropout draws from a CPU generator
seeded with ``seed`` when it is non-zero, else with a seed drawn from torch's RNG;
the backward replays the same mask. A fully masked row gives zeros. Not emulated:
sparse modes 5 to 8 (prefix and split variants), ``dropout_mask`` input, and
pse-type variants of other ops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import torch

from . import compute_dtype
from . import kernel


_INT_MAX = 2147483647
_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
_COMPRESSED = 2048


def _fail(message: str) -> RuntimeError:
    return RuntimeError(f"npu_fusion_attention: {message}")


def _to_bnsd(query: Any, key: Any, value: Any, head_num: int, layout: str) -> tuple[Any, Any, Any]:
    if layout in ("BSH", "SBH"):
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise _fail(f"{layout} expects 3-D query, key and value")
        if layout == "SBH":
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if query.shape[-1] % head_num:
            raise _fail(f"hidden size {query.shape[-1]} is not a multiple of head_num {head_num}")
        dim = query.shape[-1] // head_num
        if key.shape[-1] % dim:
            raise _fail(f"key hidden size {key.shape[-1]} is not a multiple of head dim {dim}")
        kv_heads = key.shape[-1] // dim
        if value.shape[-1] % kv_heads:
            raise _fail(f"value hidden size {value.shape[-1]} is not a multiple of {kv_heads}")

        def split(t: Any, heads: int) -> Any:
            return t.reshape(t.shape[0], t.shape[1], heads, t.shape[2] // heads).transpose(1, 2)

        return split(query, head_num), split(key, kv_heads), split(value, kv_heads)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise _fail(f"{layout} expects 4-D query, key and value")
    if layout == "BSND":
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    if query.shape[1] != head_num:
        raise _fail(f"query has {query.shape[1]} heads but head_num is {head_num}")
    return query, key, value


def _from_bnsd(out: Any, layout: str) -> Any:
    batch, heads, length, dim = out.shape
    if layout == "BSH":
        return out.transpose(1, 2).reshape(batch, length, heads * dim)
    if layout == "SBH":
        return out.permute(2, 0, 1, 3).reshape(length, batch, heads * dim)
    if layout == "BSND":
        return out.transpose(1, 2).contiguous()
    return out.contiguous()


def _check_compressed(mask: Any, mode: int) -> None:
    if tuple(mask.shape) != (_COMPRESSED, _COMPRESSED):
        raise _fail(
            f"sparse_mode {mode} expects the compressed {_COMPRESSED}x{_COMPRESSED} mask "
            f"torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1), got shape "
            f"{tuple(mask.shape)}"
        )
    expected = torch.ones(_COMPRESSED, _COMPRESSED, dtype=torch.bool).triu(1)
    if not torch.equal(mask.bool(), expected):
        raise _fail(
            f"sparse_mode {mode} expects the compressed mask "
            f"torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1); this one differs"
        )


def _user_mask(mask: Any, batch: int, heads: int, s1: int, s2: int) -> Any:
    allowed = [(batch, heads, s1, s2), (batch, 1, s1, s2), (1, 1, s1, s2), (s1, s2)]
    if tuple(mask.shape) not in allowed:
        raise _fail(
            f"atten_mask shape {tuple(mask.shape)} is none of BNSS/B1SS/11SS/SS = {allowed}"
        )
    return mask.bool() if mask.dim() == 4 else mask.bool().view(1, 1, s1, s2)


def _mask(
    atten_mask: Any,
    sparse_mode: int,
    pre: int,
    nxt: int,
    shape: tuple[int, int, int, int],
) -> Any:
    """A bool ``masked`` tensor broadcastable to ``[B, N, S1, S2]``, or None for no mask."""
    if atten_mask is None:
        return None
    if atten_mask.dtype not in (torch.bool, torch.uint8):
        raise _fail(f"atten_mask must be bool or uint8 (True = masked out), got {atten_mask.dtype}")
    batch, heads, s1, s2 = shape
    rows = torch.arange(s1).unsqueeze(1)
    cols = torch.arange(s2).unsqueeze(0)
    if sparse_mode in (0, 1):
        masked = _user_mask(atten_mask, batch, heads, s1, s2)
        if sparse_mode == 0 and (pre < s1 or nxt < s2):
            masked = masked | (cols - rows > nxt) | (rows - cols > pre)
        return masked
    if sparse_mode in (2, 3, 4):
        _check_compressed(atten_mask, sparse_mode)
        shift = 0 if sparse_mode == 2 else s2 - s1
        if sparse_mode == 4:
            return (cols - rows - shift > nxt) | (rows + shift - cols > pre)
        return cols > rows + shift
    raise _fail(
        f"sparse_mode {sparse_mode} is not emulated (modes 0 to 4 are; 5 to 8 are the prefix "
        f"and split-sequence variants)"
    )


def _attend(
    q: Any,
    k: Any,
    v: Any,
    *,
    scale: float,
    pse: Any,
    masked: Any,
    keep_prob: float,
    generator: Any,
    sink: Any,
) -> tuple[Any, Any, Any]:
    """Attention on BNSD tensors in the compute dtype: (out, row max, row sum of exp)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise _fail(f"head_num {heads} must be a multiple of the key/value heads {kv_heads}")
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-2, -1) * scale
    if pse is not None:
        scores = scores + pse.to(scores.dtype)
    if masked is not None:
        scores = scores.masked_fill(masked, -math.inf)
    peak = scores.amax(-1, keepdim=True)
    if sink is not None:
        sink_logits = sink.to(scores.dtype).view(1, heads, 1, 1).expand(*scores.shape[:3], 1)
        peak = torch.maximum(peak, sink_logits)
    finite_peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)
    weights = torch.exp(scores - finite_peak)
    total = weights.sum(-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink_logits - finite_peak)
    probs = weights / torch.where(total == 0, torch.ones_like(total), total)
    if keep_prob < 1.0:
        keep = torch.rand(probs.shape, generator=generator, dtype=torch.float64) < keep_prob
        probs = probs * keep / keep_prob
    return probs @ v, peak, total


def _stats(value: Any) -> Any:
    return value.float().expand(*value.shape[:-1], 8).contiguous()


def _cumulative(name: str, ends: Sequence[int] | None, total: int) -> list[tuple[int, int]]:
    if ends is None:
        raise _fail(f"TND needs {name} (cumulative sequence ends, e.g. [2, 4, 6])")
    ends = list(ends)
    # The op's API page: trailing 0s mark batches that take no part ([2, 5, 9, 0, 0]).
    while len(ends) > 1 and ends[-1] == 0:
        ends.pop()
    spans, start = [], 0
    for end in ends:
        if end < start or end > total:
            raise _fail(f"{name} must be non-decreasing ends within {total}, got {list(ends)}")
        spans.append((start, end))
        start = end
    return spans


def _replay(named: Mapping[str, Any], output: Any) -> Mapping[str, Any]:
    return {"_dropout_seed": output[4]}


@kernel("npu_fusion_attention", differentiable=True, grad_outputs=(0,), replay=_replay)
def fusion_attention(
    query: Any,
    key: Any,
    value: Any,
    head_num: int,
    input_layout: str,
    pse: Any = None,
    padding_mask: Any = None,
    atten_mask: Any = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = _INT_MAX,
    next_tockens: int = _INT_MAX,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: Any = None,
    dropout_mask: Any = None,
    seed: int = 0,
    offset: int = 0,
    _dropout_seed: int | None = None,
) -> tuple[Any, Any, Any, Any, int, int, int]:
    if input_layout not in _LAYOUTS:
        raise _fail(f"input_layout must be one of {', '.join(_LAYOUTS)}, got {input_layout!r}")
    if head_num <= 0:
        raise _fail(f"head_num must be positive, got {head_num}")
    if not (query.dtype == key.dtype == value.dtype):
        raise _fail(
            f"query, key and value dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}"
        )
    if not 0.0 < keep_prob <= 1.0:
        raise _fail(f"keep_prob must be in (0, 1], got {keep_prob}")
    if dropout_mask is not None:
        raise _fail("a dropout_mask input is not emulated; pass keep_prob (and seed) instead")
    wide = compute_dtype(query)
    q, k, v = (t.to(wide) for t in (query, key, value))
    dropping = keep_prob < 1.0
    if _dropout_seed is not None:
        used_seed = _dropout_seed
    elif dropping:
        used_seed = seed or int(torch.randint(1, _INT_MAX, ()).item())
    else:
        used_seed = 0
    generator = torch.Generator().manual_seed(used_seed) if dropping else None
    options = {
        "scale": scale,
        "keep_prob": keep_prob,
        "generator": generator,
        "sink": sink,
    }
    if input_layout == "TND":
        out, peak, total, numels = _varlen(
            q,
            k,
            v,
            head_num,
            pse,
            atten_mask,
            sparse_mode,
            pre_tockens,
            next_tockens,
            actual_seq_qlen,
            actual_seq_kvlen,
            options,
        )
        if softmax_layout != "TND":
            peak, total = peak.transpose(0, 1), total.transpose(0, 1)
    else:
        q4, k4, v4 = _to_bnsd(q, k, v, head_num, input_layout)
        batch, _, s1, _ = q4.shape
        s2 = k4.shape[2]
        if k4.shape[0] != batch or v4.shape[2] != s2 or k4.shape[3] != q4.shape[3]:
            raise _fail(
                f"inconsistent shapes: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                f"value {tuple(value.shape)} for layout {input_layout}"
            )
        masked = _mask(
            atten_mask, sparse_mode, pre_tockens, next_tockens, (batch, head_num, s1, s2)
        )
        out4, peak, total = _attend(q4, k4, v4, pse=pse, masked=masked, **options)
        out = _from_bnsd(out4, input_layout)
        numels = batch * head_num * s1 * s2
    softmax_out = torch.empty(0, dtype=query.dtype)
    return (
        out.to(query.dtype),
        _stats(peak),
        _stats(total),
        softmax_out,
        used_seed,
        0,
        numels if dropping else 0,
    )


def _varlen(
    q: Any,
    k: Any,
    v: Any,
    head_num: int,
    pse: Any,
    atten_mask: Any,
    sparse_mode: int,
    pre: int,
    nxt: int,
    qlen: Sequence[int] | None,
    kvlen: Sequence[int] | None,
    options: dict[str, Any],
) -> tuple[Any, Any, Any, int]:
    """TND: each sequence attends within itself; returns ``[T, N, ...]`` results."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise _fail("TND expects 3-D query, key and value [T, N, D]")
    if q.shape[1] != head_num:
        raise _fail(f"query has {q.shape[1]} heads but head_num is {head_num}")
    if pse is not None:
        raise _fail("pse with the TND layout is not emulated")
    q_spans = _cumulative("actual_seq_qlen", qlen, q.shape[0])
    kv_spans = _cumulative("actual_seq_kvlen", kvlen, k.shape[0])
    if len(q_spans) != len(kv_spans):
        raise _fail("actual_seq_qlen and actual_seq_kvlen must have the same length")
    outs, peaks, totals, numels = [], [], [], 0
    for (qs, qe), (ks, ke) in zip(q_spans, kv_spans, strict=True):
        if qe == qs:
            continue
        q4 = q[qs:qe].transpose(0, 1).unsqueeze(0)
        k4 = k[ks:ke].transpose(0, 1).unsqueeze(0)
        v4 = v[ks:ke].transpose(0, 1).unsqueeze(0)
        s1, s2 = qe - qs, ke - ks
        mask = atten_mask
        if mask is not None and sparse_mode in (0, 1):
            if mask.dim() != 2:
                raise _fail("with TND, atten_mask must be 2-D (SS)")
            mask = mask[:s1, :s2]
        masked = _mask(mask, sparse_mode, pre, nxt, (1, head_num, s1, s2))
        out4, peak, total = _attend(q4, k4, v4, pse=None, masked=masked, **options)
        outs.append(out4[0].transpose(0, 1))
        peaks.append(peak[0].transpose(0, 1))
        totals.append(total[0].transpose(0, 1))
        numels += head_num * s1 * s2
    if not outs:
        raise _fail("actual_seq_qlen selects no query token")
    out = torch.cat(outs)
    if out.shape[0] != q.shape[0]:
        tail = q.shape[0] - out.shape[0]
        out = torch.cat([out, out.new_zeros(tail, *out.shape[1:])])
        peaks.append(torch.full((tail, head_num, 1), -math.inf, dtype=out.dtype))
        totals.append(torch.zeros(tail, head_num, 1, dtype=out.dtype))
    return out, torch.cat(peaks), torch.cat(totals), numels
