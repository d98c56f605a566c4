"""TransformersRotary: the standard apply_rotary_pos_emb served by npu_rotary_mul, same numbers.

The original is saved before the patch is applied: under the emulator every CPU tensor
is an NPU tensor.
"""

from __future__ import annotations

import importlib

import pytest
from hf_stacks import require_module
from hf_stacks import transformers_version


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import TransformersRotary  # noqa: E402
from ascend_patch_transformers.rotary import rotary_hook  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402


TARGET = "transformers.models.llama.modeling_llama:apply_rotary_pos_emb"


def _counters(patcher, target=TARGET):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record.counters


def _cos_sin(batch, seq, dim, dtype):
    # As LlamaRotaryEmbedding: [batch, seq, dim], both halves the same frequencies.
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    positions = torch.arange(seq).float()[None, :, None].expand(batch, seq, 1)
    freqs = positions * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("layout", "cos_batch"),
    [("BNSD", 2), ("BNSD", 1), ("BSND", 2), ("BSND", 1)],
)
def test_matches_the_original(
    npu_emulator, isolated_patcher, assert_parity, dtype, layout, cos_batch
):
    original = modeling_llama.apply_rotary_pos_emb
    isolated_patcher.add(TransformersRotary).apply()
    patched = modeling_llama.apply_rotary_pos_emb
    assert patched is not original
    heads, kv_heads, seq, dim = 4, 2, 5, 16
    if layout == "BNSD":
        q, k, unsqueeze_dim = torch.randn(2, heads, seq, dim), torch.randn(2, kv_heads, seq, dim), 1
    else:
        q, k, unsqueeze_dim = torch.randn(2, seq, heads, dim), torch.randn(2, seq, kv_heads, dim), 2
    cos, sin = _cos_sin(cos_batch, seq, dim, dtype)
    q, k = q.to(dtype), k.to(dtype)
    if dtype == torch.float32:
        # Gradients of q and k, and of cos and sin as plain inputs.
        assert_parity(original, patched, q, k, cos, sin, kwargs={"unsqueeze_dim": unsqueeze_dim})
    else:
        # In a model cos/sin come from buffers and need no gradient; in half precision
        # their gradient is a sum over batch and heads, whose rounding is the original's
        # own error rather than the kernel's.
        assert_parity(
            lambda q, k: original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim),
            lambda q, k: patched(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim),
            q,
            k,
        )
    assert (
        _counters(isolated_patcher).replacement_calls,
        _counters(isolated_patcher).fallback_calls,
    ) == (1, 0)


def _fallback(patched, counters, *args, **kwargs):
    before = counters.fallback_calls
    patched(*args, **kwargs)
    return counters.fallback_calls - before


def test_unsupported_inputs_run_the_original(npu_emulator, isolated_patcher):
    isolated_patcher.add(TransformersRotary).apply()
    rope = modeling_llama.apply_rotary_pos_emb
    counters = _counters(isolated_patcher)
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = _cos_sin(2, 5, 16, torch.float32)
    # cos/sin of another dtype: the original promotes, the kernel keeps q's dtype.
    assert _fallback(rope, counters, q.bfloat16(), k.bfloat16(), cos, sin) == 1
    # unsqueeze_dim 0 (heads first, then batch): not a layout of the kernel.
    assert (
        _fallback(rope, counters, q.transpose(0, 1), k.transpose(0, 1), cos, sin, unsqueeze_dim=0)
        == 1
    )
    # q/k of another rank than 4.
    assert _fallback(rope, counters, q[None], k[None], cos[None], sin[None], unsqueeze_dim=2) == 1
    assert counters.replacement_calls == 0
    # A head dim of 896 or more.
    big_cos, big_sin = _cos_sin(1, 2, 896, torch.float32)
    assert (
        _fallback(
            rope, counters, torch.randn(1, 1, 2, 896), torch.randn(1, 1, 2, 896), big_cos, big_sin
        )
        == 1
    )


@pytest.mark.skipif(transformers_version() >= (5,), reason="position_ids left the signature in 5.0")
def test_position_ids_of_the_4x_signature_are_accepted(
    npu_emulator, isolated_patcher, assert_parity
):
    original = modeling_llama.apply_rotary_pos_emb
    isolated_patcher.add(TransformersRotary).apply()
    patched = modeling_llama.apply_rotary_pos_emb
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = _cos_sin(2, 5, 16, torch.float32)
    positions = torch.arange(5)[None].expand(2, 5)
    assert_parity(original, patched, q, k, cos, sin, positions, 1)
    assert _counters(isolated_patcher).replacement_calls == 1


def _module(name):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def test_partial_rotary_is_matched_by_formula():
    # Phi-3 rotates only the first cos.shape[-1] features; GPT-NeoX writes the same
    # formula in more statements, Nemotron rebinds q and k: all three are served.
    for name in ("phi3", "gpt_neox", "nemotron", "qwen3"):
        (patch,) = rotary_hook(_module(name))
        assert patch.target == f"transformers.models.{name}.modeling_{name}:apply_rotary_pos_emb"
        assert ("partial" in patch.note) == (name != "qwen3")
    # GLM's partial rotary is interleaved (its rotate_half pairs neighbours): not half mode.
    assert list(rotary_hook(_module("glm"))) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize(
    ("model", "rotary"), [("phi3", 8), ("phi3", 16), ("gpt_neox", 6), ("nemotron", 10)]
)
def test_partial_rotary_matches_the_original(
    npu_emulator, isolated_patcher, assert_parity, dtype, layout, model, rotary
):
    module = _module(model)
    original = module.apply_rotary_pos_emb
    isolated_patcher.add(TransformersRotary).apply()
    patched = module.apply_rotary_pos_emb
    assert patched is not original
    heads, kv_heads, seq, dim = 4, 2, 5, 16
    if layout == "BNSD":
        q, k, unsqueeze_dim = torch.randn(2, heads, seq, dim), torch.randn(2, kv_heads, seq, dim), 1
    else:
        q, k, unsqueeze_dim = torch.randn(2, seq, heads, dim), torch.randn(2, seq, kv_heads, dim), 2
    cos, sin = _cos_sin(2, seq, rotary, dtype)
    q, k = q.to(dtype), k.to(dtype)
    if dtype == torch.float32:
        assert_parity(original, patched, q, k, cos, sin, kwargs={"unsqueeze_dim": unsqueeze_dim})
    else:
        assert_parity(
            lambda q, k: original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim),
            lambda q, k: patched(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim),
            q,
            k,
        )
    target = f"transformers.models.{model}.modeling_{model}:apply_rotary_pos_emb"
    counters = _counters(isolated_patcher, target)
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


def test_partial_rotary_outside_the_envelope_runs_the_original(npu_emulator, isolated_patcher):
    phi3 = _module("phi3")
    isolated_patcher.add(TransformersRotary).apply()
    rope = phi3.apply_rotary_pos_emb
    counters = _counters(
        isolated_patcher, "transformers.models.phi3.modeling_phi3:apply_rotary_pos_emb"
    )
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    # An odd rotary width: not a layout of the op (half mode splits it in two).
    odd = torch.randn(2, 5, 7)
    assert _fallback(rope, counters, q, k, odd, odd) == 1
    # cos/sin wider than the head: the original's own error, not the kernel's.
    wide_cos, wide_sin = _cos_sin(2, 5, 32, torch.float32)
    with pytest.raises(RuntimeError):
        rope(q, k, wide_cos, wide_sin)
    assert counters.fallback_calls == 2
    # A rotated width of 896 or more.
    big_cos, big_sin = _cos_sin(1, 2, 896, torch.float32)
    big_q = torch.randn(1, 1, 2, 1024)
    assert _fallback(rope, counters, big_q, big_q, big_cos, big_sin) == 1
    assert counters.replacement_calls == 0


def test_olmo2_cast_back_variant_matches(npu_emulator, isolated_patcher, assert_parity):
    # Olmo2 casts the results back to q's and k's dtypes: the same numbers for one dtype.
    olmo2 = importlib.import_module("transformers.models.olmo2.modeling_olmo2")
    original = olmo2.apply_rotary_pos_emb
    isolated_patcher.add(TransformersRotary).apply()
    cos, sin = _cos_sin(2, 5, 16, torch.bfloat16)
    q, k = torch.randn(2, 4, 5, 16).bfloat16(), torch.randn(2, 2, 5, 16).bfloat16()
    assert_parity(
        lambda q, k: original(q, k, cos, sin),
        lambda q, k: olmo2.apply_rotary_pos_emb(q, k, cos, sin),
        q,
        k,
    )
    target = "transformers.models.olmo2.modeling_olmo2:apply_rotary_pos_emb"
    assert _counters(isolated_patcher, target).replacement_calls == 1
