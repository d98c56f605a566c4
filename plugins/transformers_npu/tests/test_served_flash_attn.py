"""The flash_attn served on an NPU machine: each function equals per-sequence SDPA.

``flash_attn_func`` and ``flash_attn_varlen_func`` (with ``cu_seqlens``) under the
emulator run ``npu_fusion_attention`` (the emulator's call recorder proves it) and equal a
reference computed with torch's ``scaled_dot_product_attention`` one sequence at a time
(flash-attn's bottom-right causal alignment, GQA by repeating the key/value heads),
values and gradients. The bert_padding helpers round-trip. Served through the plugin's
import rule only where no real flash_attn exists.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from ascend_patch_emulator import CallRecorder
from ascend_patch_transformers.groups import import_rules
from ascend_patch_transformers.served import flash_attn as fa


NQ, NKV, D = 4, 2, 16


def _sdpa_one(q, k, v, causal=False, window=(-1, -1), scale=None):
    """One sequence, ``[S, N, D]``: torch SDPA with flash-attn's bottom-right alignment."""
    sq, sk = q.shape[0], k.shape[0]
    row = torch.arange(sq)[:, None] + (sk - sq)
    col = torch.arange(sk)[None, :]
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    left, right = window
    if causal:
        allowed &= col <= row
    if left >= 0:
        allowed &= col >= row - left
    if right >= 0:
        allowed &= col <= row + right
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, 1).transpose(0, 1) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=allowed, scale=scale)
    return out.transpose(0, 1)


def _leaves(*shapes, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=generator).to(dtype).requires_grad_() for s in shapes]


def _fused_calls(recorder):
    return [c for c in recorder.calls if c.op == "npu_fusion_attention" and c.file == fa.__file__]


def _grads(out, leaves, seed=9):
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out.float(), leaves, cotangent)


CASES = [
    # (sq, sk, causal, window)
    (6, 6, False, (-1, -1)),
    (6, 6, True, (-1, -1)),
    (3, 7, True, (-1, -1)),  # fewer queries than keys: causal from the bottom right
    (7, 7, True, (2, 0)),  # sliding window
    (5, 8, False, (1, 2)),
]


@pytest.mark.parametrize(("sq", "sk", "causal", "window"), CASES)
def test_flash_attn_func_equals_sdpa_per_sequence(npu_emulator, sq, sk, causal, window):
    q, k, v = _leaves((2, sq, NQ, D), (2, sk, NKV, D), (2, sk, NKV, D))
    with CallRecorder() as recorder:
        out = fa.flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert _fused_calls(recorder)
    expected = torch.stack([_sdpa_one(q[b], k[b], v[b], causal, window) for b in range(2)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    for got, want in zip(_grads(out, (q, k, v)), _grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_softmax_scale_and_half_precision(npu_emulator):
    q, k, v = (t.detach() for t in _leaves((1, 5, NQ, D), (1, 5, NKV, D), (1, 5, NKV, D)))
    out = fa.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), softmax_scale=0.2)
    assert out.dtype == torch.bfloat16
    expected = _sdpa_one(q[0], k[0], v[0], scale=0.2)
    torch.testing.assert_close(out[0].float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_equals_sdpa_per_sequence(npu_emulator, causal):
    lengths_q, lengths_k = [3, 5, 2], [4, 5, 6]
    q, k, v = _leaves((10, NQ, D), (15, NKV, D), (15, NKV, D), seed=2)
    cu_q = F.pad(torch.tensor(lengths_q).cumsum(0), (1, 0)).int()
    cu_k = F.pad(torch.tensor(lengths_k).cumsum(0), (1, 0)).int()
    with CallRecorder() as recorder:
        out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, causal=causal)
    assert _fused_calls(recorder)
    expected = torch.cat(
        [
            _sdpa_one(
                q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]], causal
            )
            for i in range(3)
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    for got, want in zip(_grads(out, (q, k, v)), _grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_unpad_varlen_pad_equals_the_padded_batch(npu_emulator):
    """flash-attn's padding recipe: unpad, varlen attention, pad back."""
    batch, seqlen = 3, 6
    keep = torch.ones(batch, seqlen, dtype=torch.long)
    keep[1, 4:] = 0
    keep[2, 2:] = 0
    q, k, v = (
        t.detach() for t in _leaves(*[(batch, seqlen, n, D) for n in (NQ, NKV, NKV)], seed=4)
    )
    q_un, indices, cu, max_len, used = fa.unpad_input(q, keep)
    k_un, _, _, _, _ = fa.unpad_input(k, keep)
    v_un, _, _, _, _ = fa.unpad_input(v, keep)
    assert cu.tolist() == [0, 6, 10, 12] and max_len == 6 and used.tolist() == [6, 4, 2]
    out = fa.pad_input(
        fa.flash_attn_varlen_func(q_un, k_un, v_un, cu, cu, max_len, max_len, causal=True),
        indices,
        batch,
        seqlen,
    )
    for b, n in enumerate(used.tolist()):
        torch.testing.assert_close(
            out[b, :n], _sdpa_one(q[b, :n], k[b, :n], v[b, :n], True), atol=1e-5, rtol=1e-4
        )
        assert not out[b, n:].any()
    # index_first_axis / index_put_first_axis are each other's inverse on the kept rows
    flat = q.reshape(batch * seqlen, NQ, D)
    assert torch.equal(
        fa.index_put_first_axis(fa.index_first_axis(flat, indices), indices, batch * seqlen)[
            indices
        ],
        flat[indices],
    )


def test_inputs_off_the_npu_take_the_reference():
    q, k, v = (t.detach() for t in _leaves((1, 4, NQ, D), (1, 4, NKV, D), (1, 4, NKV, D)))
    with CallRecorder() as recorder:
        out = fa.flash_attn_func(q, k, v, causal=True)
    assert not _fused_calls(recorder)
    torch.testing.assert_close(out[0], _sdpa_one(q[0], k[0], v[0], True), atol=1e-5, rtol=1e-4)


def test_softcap_takes_the_reference(npu_emulator):
    q, k, v = (t.detach() for t in _leaves((1, 4, NQ, D), (1, 4, NKV, D), (1, 4, NKV, D)))
    with CallRecorder() as recorder:
        out = fa.flash_attn_func(q, k, v, softcap=0.5)
    assert not _fused_calls(recorder)
    k2, v2 = (t.repeat_interleave(2, 2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k2) * D**-0.5
    expected = torch.einsum(
        "bhqk,bkhd->bqhd", torch.softmax(torch.tanh(scores / 0.5) * 0.5, -1), v2
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="a real flash_attn")
def test_import_flash_attn_is_served_only_with_an_npu_runtime(npu_emulator, isolated_patcher):
    rules = import_rules()
    served = {"flash_attn", "flash_attn.bert_padding", "flash_attn.flash_attn_interface"}
    assert served <= {rule.module for rule in rules}
    isolated_patcher.add(*rules).apply()
    try:
        from flash_attn import flash_attn_func
        from flash_attn import flash_attn_varlen_func
        from flash_attn.bert_padding import index_first_axis
        from flash_attn.bert_padding import pad_input
        from flash_attn.bert_padding import unpad_input

        assert flash_attn_func is fa.flash_attn_func
        assert flash_attn_varlen_func is fa.flash_attn_varlen_func
        assert (pad_input, unpad_input, index_first_axis) == (
            fa.pad_input,
            fa.unpad_input,
            fa.index_first_axis,
        )
        assert sys.modules["flash_attn"].__version__ == fa.VERSION
    finally:
        isolated_patcher.revert()
    assert "flash_attn" not in sys.modules


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="an NPU runtime")
def test_no_rule_without_an_npu_runtime():
    """On a CUDA or CPU machine a missing flash_attn stays missing (transformers checks for it)."""
    assert import_rules() == []
