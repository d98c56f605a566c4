"""npu_fusion_attention against F.scaled_dot_product_attention (with the mask inverted)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


SETTINGS = settings(max_examples=40, deadline=None)
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


def _randn(shape, seed, dtype=torch.float64):
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    ).to(dtype)


def _sdpa(q, k, v, *, masked=None, pse=None, scale):
    """float64 SDPA on BNSD tensors; ``masked`` uses torch_npu's convention (True = masked out)."""
    bias = torch.zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=torch.float64)
    if pse is not None:
        bias = bias + pse.double()
    if masked is not None:
        bias = bias.masked_fill(masked, float("-inf"))
    return F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=bias, scale=scale, enable_gqa=True
    )


def _layout(t, layout):
    """BNSD -> ``layout`` (written independently of the kernel's inverse)."""
    b, n, s, d = t.shape
    if layout == "BNSD":
        return t.contiguous()
    if layout == "BSND":
        return t.permute(0, 2, 1, 3).contiguous()
    if layout == "BSH":
        return t.permute(0, 2, 1, 3).reshape(b, s, n * d)
    return t.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _keep_a_column(masked):
    """No row fully masked (SDPA gives NaN there; the NPU kernel gives 0, tested apart)."""
    masked = masked.clone()
    masked[..., 0] = False
    return masked


@SETTINGS
@given(
    b=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 3),
    s1=st.integers(1, 6),
    s2=st.integers(1, 6),
    d=st.integers(1, 8),
    dv=st.integers(1, 8),
    layout=st.sampled_from(["BSH", "SBH", "BSND", "BNSD"]),
    mask_shape=st.sampled_from([None, "BNSS", "B1SS", "11SS", "SS"]),
    mask_dtype=st.sampled_from([torch.bool, torch.uint8]),
    with_pse=st.booleans(),
    scale=st.floats(0.05, 2.0),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_matches_sdpa(
    emulated,
    assert_close,
    b,
    kv_heads,
    group,
    s1,
    s2,
    d,
    dv,
    layout,
    mask_shape,
    mask_dtype,
    with_pse,
    scale,
    dtype,
    seed,
):
    import torch_npu

    n = kv_heads * group
    if layout in ("BSH", "SBH") and dv != d:
        dv = d  # the hidden-size layouts derive the value head size from the key heads
    q = _randn((b, n, s1, d), seed, dtype)
    k = _randn((b, kv_heads, s2, d), seed + 1, dtype)
    v = _randn((b, kv_heads, s2, dv), seed + 2, dtype)
    masked = None
    atten_mask = None
    if mask_shape is not None:
        full = {
            "BNSS": (b, n, s1, s2),
            "B1SS": (b, 1, s1, s2),
            "11SS": (1, 1, s1, s2),
            "SS": (s1, s2),
        }
        masked = _keep_a_column(
            torch.rand(full[mask_shape], generator=torch.Generator().manual_seed(seed)) < 0.4
        )
        atten_mask = masked.to(mask_dtype)
    pse = _randn((b, n, s1, s2), seed + 3, dtype) if with_pse else None
    result = torch_npu.npu_fusion_attention(
        _layout(q, layout),
        _layout(k, layout),
        _layout(v, layout),
        n,
        layout,
        pse=pse,
        atten_mask=atten_mask,
        scale=scale,
    )
    assert len(result) == 7
    out, softmax_max, softmax_sum, softmax_out, seed_out, offset, numels = result
    expected = _sdpa(q, k, v, masked=masked, pse=pse, scale=scale)
    assert out.dtype == dtype
    assert_close(out, _layout(expected, layout), dtype=dtype)
    assert softmax_max.shape == softmax_sum.shape == (b, n, s1, 8)
    assert softmax_max.dtype == softmax_sum.dtype == torch.float32
    assert softmax_out.shape == (0,)
    assert (seed_out, offset, numels) == (0, 0, 0)


def test_scale_defaults_to_one_and_the_statistics_are_the_softmax_ones(emulated, assert_close):
    import torch_npu

    q, k, v = (_randn((1, 2, 3, 4), seed) for seed in range(3))
    out, softmax_max, softmax_sum, *_ = torch_npu.npu_fusion_attention(q, k, v, 2, "BNSD")
    assert_close(out, _sdpa(q, k, v, scale=1.0))
    scores = q @ k.transpose(-2, -1)
    assert_close(
        softmax_max, scores.amax(-1, keepdim=True).expand(-1, -1, -1, 8), dtype=torch.float32
    )
    expected_sum = torch.exp(scores - scores.amax(-1, keepdim=True)).sum(-1, keepdim=True)
    assert_close(softmax_sum, expected_sum.expand(-1, -1, -1, 8), dtype=torch.float32)


@SETTINGS
@given(
    s1=st.integers(1, 7),
    s2=st.integers(1, 7),
    mode=st.sampled_from([2, 3]),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_causal_sparse_modes_with_the_compressed_mask(
    emulated, assert_close, s1, s2, mode, dtype, seed
):
    import torch_npu

    q, k, v = (
        _randn((1, 2, s1, 4), seed, dtype),
        _randn((1, 2, s2, 4), seed + 1, dtype),
        _randn((1, 2, s2, 4), seed + 2, dtype),
    )
    i = torch.arange(s1).unsqueeze(1)
    j = torch.arange(s2).unsqueeze(0)
    allowed = j <= i if mode == 2 else j <= i + (s2 - s1)
    out = torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        2,
        "BNSD",
        atten_mask=COMPRESSED,
        scale=0.5,
        sparse_mode=mode,
        pre_tockens=2147483647,
        next_tockens=0,
    )[0]
    expected = _sdpa(q, k, v, masked=~allowed.view(1, 1, s1, s2), scale=0.5)
    empty_rows = ~allowed.any(-1)  # right-down causal with s1 > s2: those queries see nothing
    expected = torch.where(empty_rows.view(1, 1, s1, 1), torch.zeros_like(expected), expected)
    assert_close(out, expected, dtype=dtype)


def test_sdpa_is_causal_maps_to_sparse_mode_2(emulated, assert_close):
    """The mapping torch_npu itself uses for F.scaled_dot_product_attention(is_causal=True)."""
    import torch_npu

    q, k, v = (_randn((2, 3, 5, 8), seed) for seed in range(3))
    out = torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        3,
        "BNSD",
        atten_mask=COMPRESSED,
        scale=8**-0.5,
        pre_tockens=2147483647,
        next_tockens=0,
        sparse_mode=2,
    )[0]
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@SETTINGS
@given(
    s=st.integers(1, 7), pre=st.integers(0, 7), nxt=st.integers(0, 7), seed=st.integers(0, 2**16)
)
def test_band_of_sparse_mode_0(emulated, assert_close, s, pre, nxt, seed):
    import torch_npu

    q, k, v = (_randn((1, 1, s, 4), seed + i) for i in range(3))
    none_masked = torch.zeros(s, s, dtype=torch.bool)
    out = torch_npu.npu_fusion_attention(
        q, k, v, 1, "BNSD", atten_mask=none_masked, pre_tockens=pre, next_tockens=nxt
    )[0]
    i = torch.arange(s).unsqueeze(1)
    j = torch.arange(s).unsqueeze(0)
    allowed = (j - i <= nxt) & (i - j <= pre)
    assert_close(out, _sdpa(q, k, v, masked=~allowed.view(1, 1, s, s), scale=1.0))
    # Without a mask, the band is ignored, as documented.
    unmasked = torch_npu.npu_fusion_attention(
        q, k, v, 1, "BNSD", pre_tockens=pre, next_tockens=nxt
    )[0]
    assert_close(unmasked, _sdpa(q, k, v, scale=1.0))


def test_wrong_masks_fail_like_the_npu_would(emulated):
    import torch_npu

    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="compressed 2048x2048 mask"):
        torch_npu.npu_fusion_attention(
            q, q, q, 2, "BNSD", atten_mask=torch.ones(4, 4, dtype=torch.bool).triu(1), sparse_mode=2
        )
    with pytest.raises(RuntimeError, match="BNSS/B1SS/11SS/SS"):
        torch_npu.npu_fusion_attention(
            q, q, q, 2, "BNSD", atten_mask=torch.zeros(2, 4, dtype=torch.bool)
        )
    with pytest.raises(RuntimeError, match="bool or uint8"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BNSD", atten_mask=torch.zeros(4, 4))
    with pytest.raises(RuntimeError, match="input_layout"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "NSD")
    with pytest.raises(RuntimeError, match="multiple of the key/value heads"):
        torch_npu.npu_fusion_attention(q, q[:, :1].expand(1, 3, 4, 8).contiguous(), q, 2, "BNSD")


def test_fully_masked_rows_give_zeros(emulated):
    import torch_npu

    q = torch.randn(1, 1, 3, 4)
    masked = torch.zeros(3, 3, dtype=torch.bool)
    masked[1] = True
    out = torch_npu.npu_fusion_attention(q, q, q, 1, "BNSD", atten_mask=masked)[0]
    assert torch.equal(out[0, 0, 1], torch.zeros(4)) and not out.isnan().any()


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3),
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 2),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tnd_varlen_attends_within_each_sequence(
    emulated, assert_close, lengths, kv_heads, group, causal, seed
):
    import torch_npu

    n = kv_heads * group
    q_lens = [a for a, _ in lengths]
    kv_lens = [b for _, b in lengths]
    q = _randn((sum(q_lens), n, 4), seed)
    k = _randn((sum(kv_lens), kv_heads, 4), seed + 1)
    v = _randn((sum(kv_lens), kv_heads, 3), seed + 2)
    cum_q = torch.tensor(q_lens).cumsum(0).tolist()
    cum_kv = torch.tensor(kv_lens).cumsum(0).tolist()
    options = {"atten_mask": COMPRESSED, "sparse_mode": 3} if causal else {}
    out, softmax_max, *_ = torch_npu.npu_fusion_attention(
        q, k, v, n, "TND", scale=0.7, actual_seq_qlen=cum_q, actual_seq_kvlen=cum_kv, **options
    )
    assert out.shape == (sum(q_lens), n, 3)
    assert softmax_max.shape == (n, sum(q_lens), 8)
    starts_q = [0, *cum_q[:-1]]
    starts_kv = [0, *cum_kv[:-1]]
    for sq, eq, sk, ek in zip(starts_q, cum_q, starts_kv, cum_kv, strict=True):
        qi = q[sq:eq].transpose(0, 1).unsqueeze(0)
        ki = k[sk:ek].transpose(0, 1).unsqueeze(0)
        vi = v[sk:ek].transpose(0, 1).unsqueeze(0)
        masked = None
        if causal:
            i = torch.arange(eq - sq).unsqueeze(1)
            j = torch.arange(ek - sk).unsqueeze(0)
            masked = (j > i + (ek - sk) - (eq - sq)).view(1, 1, eq - sq, ek - sk)
        expected = _sdpa(qi, ki, vi, masked=masked, scale=0.7)[0].transpose(0, 1)
        if masked is not None:
            expected = torch.nan_to_num(expected, nan=0.0)
        assert_close(out[sq:eq], expected)


def test_sink_joins_every_softmax_row(emulated, assert_close):
    import torch_npu

    q, k, v = (_randn((1, 2, 3, 4), seed) for seed in range(3))
    sink = torch.tensor([0.5, -1.0], dtype=torch.float32)
    out = torch_npu.npu_fusion_attention(q, k, v, 2, "BNSD", sink=sink)[0]
    scores = torch.cat(
        [q @ k.transpose(-2, -1), sink.double().view(1, 2, 1, 1).expand(1, 2, 3, 1)], -1
    )
    probs = scores.softmax(-1)[..., :-1]
    assert_close(out, probs @ v)


def test_dropout_keeps_the_documented_fraction_and_replays_in_backward(emulated):
    import torch_npu

    s = 64
    q = torch.zeros(1, 1, s, 4, dtype=torch.float64)
    v = torch.eye(s, dtype=torch.float64).view(1, 1, s, s)
    torch.manual_seed(0)
    out, _, _, _, seed, offset, numels = torch_npu.npu_fusion_attention(
        q, q, v, 1, "BNSD", keep_prob=0.75
    )
    kept = out * s * 0.75  # uniform probabilities 1/s, kept ones scaled by 1/keep_prob
    assert torch.allclose(kept, kept.round()) and set(kept.round().unique().tolist()) <= {0.0, 1.0}
    assert abs(kept.mean().item() - 0.75) < 0.03
    assert seed != 0 and offset == 0 and numels == s * s
    # The same seed draws the same mask; gradients are consistent with it.
    qg, kg, vg = (_randn((1, 2, 3, 4), i).requires_grad_() for i in range(3))

    def attention(a, b, c):
        return torch_npu.npu_fusion_attention(a, b, c, 2, "BNSD", keep_prob=0.6, seed=1234)[0]

    assert torch.equal(attention(qg, kg, vg), attention(qg, kg, vg))
    assert torch.autograd.gradcheck(attention, (qg, kg, vg))


def test_gradients_for_query_key_value_and_pse(emulated):
    import torch_npu

    q, k, v = (_randn((1, 4, 3, 2), i).requires_grad_() for i in range(3))
    k2, v2 = k[:, :2].detach().clone().requires_grad_(), v[:, :2].detach().clone().requires_grad_()
    pse = _randn((1, 4, 3, 3), 9).requires_grad_()
    masked = torch.tensor([[False, True, False], [False, False, True], [True, False, False]])

    def attention(a, b, c, p):
        return torch_npu.npu_fusion_attention(
            a, b, c, 4, "BNSD", pse=p, atten_mask=masked, scale=0.8
        )[0]

    assert torch.autograd.gradcheck(attention, (q, k2, v2, pse))
    out, softmax_max, softmax_sum, *_ = torch_npu.npu_fusion_attention(q, k2, v2, 4, "BNSD")
    # The statistics are outputs the backward formula ignores, but they still require grad.
    assert out.requires_grad and softmax_max.requires_grad and softmax_sum.requires_grad
