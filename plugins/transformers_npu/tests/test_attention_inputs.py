"""The "npu" attention function on each kind of input transformers hands it, against SDPA.

Called the way a model layer calls it (``ALL_ATTENTION_FUNCTIONS["npu"](module, q, k, v,
mask, dropout=..., scaling=...)``, BNSD, GQA), compared with ``torch``'s
``scaled_dot_product_attention`` computed before ``apply()``. The report's counters say
which calls the op served and which fell back.
"""

from __future__ import annotations

import types

import pytest
from hf_stacks import require_module


require_module("transformers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ascend_patch_transformers.groups import NpuAttention  # noqa: E402
from ascend_patch_transformers.groups import import_rules  # noqa: E402


FUSED = "ascend_patch_transformers.attention_kernels:npu_attention_forward"
B, NQ, NKV, S, D = 2, 4, 2, 5, 16


def _inputs(dtype=torch.float32, sq=S, sk=S):
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    return rand(B, NQ, sq, D), rand(B, NKV, sk, D), rand(B, NKV, sk, D)


def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    k, v = (t.repeat_interleave(NQ // NKV, 1) for t in (k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    return out.transpose(1, 2)


def _padding(sk=S):
    keep = torch.ones(B, sk, dtype=torch.bool)
    keep[1, :2] = False
    return keep


@pytest.fixture
def npu_attention(npu_emulator, isolated_patcher):
    isolated_patcher.add(NpuAttention, *import_rules()).apply()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    function = ALL_ATTENTION_FUNCTIONS["npu"]
    counters = isolated_patcher.report.get(FUSED).counters

    def call(*args, causal=True, **kwargs):
        module = types.SimpleNamespace(is_causal=causal, num_key_value_groups=NQ // NKV)
        before = counters.replacement_calls, counters.fallback_calls
        out, weights = function(module, *args, **kwargs)
        assert weights is None
        after = counters.replacement_calls, counters.fallback_calls
        return out, "fused" if after[0] > before[0] else "fallback"

    return call


def test_boolean_sdpa_mask_is_inverted_for_the_op(npu_attention):
    q, k, v = _inputs()
    allowed = torch.ones(S, S, dtype=torch.bool).tril()[None, None] & _padding()[:, None, None, :]
    expected = _sdpa(q, k, v, allowed)
    out, path = npu_attention(q, k, v, allowed, scaling=D**-0.5)
    rows = allowed.any(-1).squeeze(1)  # query rows that attend to something
    torch.testing.assert_close(out[rows], expected[rows], atol=1e-5, rtol=1e-4)
    assert path == "fused"


def test_additive_float_mask_of_transformers_4_51(npu_attention):
    """0 where attended, the dtype's minimum elsewhere (wider than the keys, as 4.51 builds it)."""
    q, k, v = _inputs()
    allowed = torch.ones(S, S + 3, dtype=torch.bool).tril()[None, None].expand(B, 1, S, S + 3)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    expected = _sdpa(q, k, v, allowed[..., :S])
    out, path = npu_attention(q, k, v, additive, scaling=D**-0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert path == "fused"


def test_a_float_bias_is_not_a_mask_and_falls_back(npu_attention):
    q, k, v = _inputs()
    bias = torch.randn(B, 1, S, S, generator=torch.Generator().manual_seed(5))
    expected = _sdpa(q, k, v, bias)
    out, path = npu_attention(q, k, v, bias, scaling=D**-0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert path == "fallback"


@pytest.mark.parametrize("causal", [True, False])
def test_no_mask_is_causal_or_full_by_the_module(npu_attention, causal):
    q, k, v = _inputs()
    expected = _sdpa(q, k, v, is_causal=causal)
    out, path = npu_attention(q, k, v, None, scaling=0.3, causal=causal)
    torch.testing.assert_close(
        out, _sdpa(q, k, v, is_causal=causal, scale=0.3), atol=1e-5, rtol=1e-4
    )
    assert path == "fused"
    # scale defaults to 1/sqrt(D) (the op's own default would be 1.0)
    out, _ = npu_attention(q, k, v, None, causal=causal)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_one_query_against_a_cache_attends_to_every_key(npu_attention):
    q, k, v = _inputs(sq=1, sk=7)
    out, path = npu_attention(q, k, v, None)
    torch.testing.assert_close(out, _sdpa(q, k, v), atol=1e-5, rtol=1e-4)
    assert path == "fused"


def test_causal_without_a_mask_and_longer_keys_falls_back(npu_attention):
    q, k, v = _inputs(sq=3, sk=6)
    _, path = npu_attention(q, k, v, None)
    assert path == "fallback"


@pytest.mark.parametrize(
    ("dtype", "path"),
    [(torch.bfloat16, "fused"), (torch.float16, "fused"), (torch.float64, "fallback")],
)
def test_dtypes(npu_attention, dtype, path):
    q, k, v = _inputs(dtype)
    out, taken = npu_attention(q, k, v, None, causal=False)
    assert taken == path
    assert out.dtype == dtype
    expected = _sdpa(q.float(), k.float(), v.float())
    tolerance = 1e-5 if dtype == torch.float64 else 2e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


def test_attention_weights_fall_back(npu_attention):
    q, k, v = _inputs()
    out, path = npu_attention(q, k, v, None, output_attentions=True)
    assert path == "fallback"
    torch.testing.assert_close(out, _sdpa(q, k, v, is_causal=True), atol=1e-5, rtol=1e-4)


def test_softcap_falls_back_to_the_models_eager_attention(npu_attention):
    """Gemma 2 caps its logits; the op cannot, and transformers 4.57's sdpa ignores the cap."""
    gemma2 = require_module("transformers.models.gemma2.modeling_gemma2")
    q, k, v = _inputs()
    cap, scale = 0.5, D**-0.5
    k2, v2 = (t.repeat_interleave(NQ // NKV, 1) for t in (k, v))
    scores = torch.tanh(q @ k2.transpose(-2, -1) * scale / cap) * cap
    expected = (torch.softmax(scores, -1) @ v2).transpose(1, 2)

    layer = type("Gemma2Attention", (), {"__module__": gemma2.__name__})()
    layer.num_key_value_groups, layer.training, layer.is_causal = NQ // NKV, False, False
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    out, _ = ALL_ATTENTION_FUNCTIONS["npu"](layer, q, k, v, None, scaling=scale, softcap=cap)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_dropout_is_the_ops_keep_probability(npu_attention):
    """dropout=p runs the op with keep_prob=1-p: reproducible under a seed, and not a no-op."""
    q, k, v = _inputs()
    plain, _ = npu_attention(q, k, v, None, dropout=0.0)
    torch.manual_seed(7)
    first, path = npu_attention(q, k, v, None, dropout=0.4)
    torch.manual_seed(7)
    second, _ = npu_attention(q, k, v, None, dropout=0.4)
    assert path == "fused"
    assert torch.equal(first, second)
    assert not torch.allclose(first, plain)
    # keep_prob 1 - 0.4 scales the kept weights by 1/0.6: the expectation is the plain output
    runs = []
    for seed in range(200):
        torch.manual_seed(seed)
        runs.append(npu_attention(q, k, v, None, dropout=0.4)[0])
    assert (torch.stack(runs).mean(0) - plain).abs().mean() < 0.05
