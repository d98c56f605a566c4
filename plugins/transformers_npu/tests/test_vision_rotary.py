"""TransformersRotary, vision side: apply_rotary_pos_emb_vision served by npu_rotary_mul.

The vision towers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, ...) rotate packed patches
``[T, heads, D]`` with cos/sin ``[T, D]`` in float32 and cast back; some newer models
pass ``[1, S, heads, D]``. Originals are saved before the patch is applied: under the
emulator every CPU tensor is an NPU tensor.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest
from hf_stacks import require_module


transformers = require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import TransformersRotary  # noqa: E402
from ascend_patch_transformers.vision_rotary import vision_rotary_hook  # noqa: E402

# Imported here, outside the emulator: 4.51's flash-attention utilities, imported under
# an NPU, import its NPU integration, which needs einops (the attention groups serve it
# without einops; this module tests the rotary group alone).
from transformers.models.qwen2_vl import modeling_qwen2_vl  # noqa: E402, F401


QWEN2_VL = "transformers.models.qwen2_vl.modeling_qwen2_vl"
TARGET = f"{QWEN2_VL}:apply_rotary_pos_emb_vision"


def _modules_with_vision_rotary():
    """Every installed modeling module whose source defines ``apply_rotary_pos_emb_vision``."""
    models = Path(transformers.__file__).parent / "models"
    return sorted(
        f"transformers.models.{path.parent.name}.{path.stem}"
        for path in models.glob("*/modeling_*.py")
        if "def apply_rotary_pos_emb_vision" in path.read_text(encoding="utf-8")
    )


def _counters(patcher, target=TARGET):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record.counters


def _cos_sin(seq, dim):
    # As the vision towers' rotary embedding: float32 [seq, dim], both halves alike.
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.arange(seq).float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


def _packed_qk(seq, heads, dim, dtype):
    # As the vision attention: qkv(x).reshape(S, 3, N, D).permute(1, 0, 2, 3).unbind(0),
    # non-contiguous views.
    qkv = torch.randn(seq, 3, heads, dim).to(dtype)
    q, k, _ = qkv.permute(1, 0, 2, 3).unbind(0)
    return q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_packed_patches_match_the_original(npu_emulator, isolated_patcher, assert_parity, dtype):
    module = importlib.import_module(QWEN2_VL)
    original = module.apply_rotary_pos_emb_vision
    isolated_patcher.add(TransformersRotary).apply()
    patched = module.apply_rotary_pos_emb_vision
    assert patched is not original
    q, k = _packed_qk(7, 4, 16, dtype)
    cos, sin = _cos_sin(7, 16)
    # Gradients of q and k (cos/sin come from a buffer in the model). Half-precision
    # outputs: both compute in float32 and round once, so they agree to the last bit or so.
    assert_parity(lambda q, k: original(q, k, cos, sin), lambda q, k: patched(q, k, cos, sin), q, k)
    counters = _counters(isolated_patcher)
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_computed_in_float32(npu_emulator, isolated_patcher, dtype):
    # The original upcasts q, k, cos and sin to float32 and rounds the result once. The
    # replacement hands the op float32 tensors (the emulator's kernel computes x*r1 +
    # rotate(x)*r2 in that order), so the outputs are the original's bit for bit; a
    # replacement giving the op half-precision cos/sin differs in the last bit of some
    # values, which the per-dtype parity tolerance alone does not see.
    module = importlib.import_module(QWEN2_VL)
    original = module.apply_rotary_pos_emb_vision
    isolated_patcher.add(TransformersRotary).apply()
    q, k = _packed_qk(64, 4, 32, dtype)
    cos, sin = _cos_sin(64, 32)
    expected = original(q, k, cos, sin)
    got = module.apply_rotary_pos_emb_vision(q, k, cos, sin)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == dtype
        assert torch.equal(g, e)
    assert _counters(isolated_patcher).replacement_calls == 1


def test_cos_sin_gradients_match(npu_emulator, isolated_patcher, assert_parity):
    module = importlib.import_module(QWEN2_VL)
    original = module.apply_rotary_pos_emb_vision
    isolated_patcher.add(TransformersRotary).apply()
    q, k = _packed_qk(5, 2, 8, torch.float32)
    cos, sin = _cos_sin(5, 8)
    assert_parity(original, module.apply_rotary_pos_emb_vision, q, k, cos, sin)
    assert _counters(isolated_patcher).replacement_calls == 1


@pytest.mark.parametrize("cos_shape", ["SD", "1SD", "BSD"])
def test_batched_layout_matches_the_original(
    npu_emulator, isolated_patcher, assert_parity, cos_shape
):
    # [B, S, N, D] queries (MLCD passes [1, S, D] cos/sin, newer towers [S, D]): BSND.
    module = importlib.import_module(QWEN2_VL)
    original = module.apply_rotary_pos_emb_vision
    isolated_patcher.add(TransformersRotary).apply()
    q, k = torch.randn(2, 6, 4, 16), torch.randn(2, 6, 2, 16)
    cos, sin = _cos_sin(6, 16)
    if cos_shape == "1SD":
        cos, sin = cos[None], sin[None]
    elif cos_shape == "BSD":
        cos, sin = cos[None].expand(2, 6, 16), sin[None].expand(2, 6, 16)
    assert_parity(
        lambda q, k: original(q, k, cos, sin),
        lambda q, k: module.apply_rotary_pos_emb_vision(q, k, cos, sin),
        q,
        k,
    )
    counters = _counters(isolated_patcher)
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


def test_unsupported_inputs_run_the_original(npu_emulator, isolated_patcher):
    module = importlib.import_module(QWEN2_VL)
    original = module.apply_rotary_pos_emb_vision
    isolated_patcher.add(TransformersRotary).apply()
    patched = module.apply_rotary_pos_emb_vision
    counters = _counters(isolated_patcher)
    q, k = _packed_qk(5, 2, 16, torch.float32)
    cos, sin = _cos_sin(5, 16)
    cases = [
        # float64: the op takes float16/bfloat16/float32 only.
        (q.double(), k.double(), cos, sin),
        (q, k, cos.double(), sin.double()),
        # a cos/sin of width 1, broadcast over the head: not a layout of the op.
        (q, k, cos[:, :1], sin[:, :1]),
        # a head dim of 896 or more, and an odd one.
        (torch.randn(3, 1, 896), torch.randn(3, 1, 896), *_cos_sin(3, 896)),
        # 5-D queries; BNSD queries [B, N, S, D] with [S, D] cos/sin broadcasting.
        (q[None, None], k[None, None], cos, sin),
        (torch.randn(1, 5, 5, 16), torch.randn(1, 5, 5, 16), cos[None, None], sin[None, None]),
        # heads from 1000.
        (torch.randn(5, 1000, 16), torch.randn(5, 1, 16), cos, sin),
    ]
    odd = torch.randn(5, 2, 15)
    odd_cos = torch.rand(5, 15)
    cases.append((odd, odd, odd_cos, odd_cos))
    for args in cases:
        before = counters.fallback_calls
        expected = original(*args)
        got = patched(*args)
        assert counters.fallback_calls == before + 1, [tuple(a.shape) for a in args]
        for e, g in zip(expected, got, strict=True):
            assert torch.equal(e, g)
    assert counters.replacement_calls == 0


def test_every_standard_vision_rotary_is_found_and_matches(npu_emulator, isolated_patcher):
    """Every installed modeling module with the function: the standard ones are served, exactly."""
    names = _modules_with_vision_rotary()
    modules = {}
    for name in names:
        try:
            modules[name] = importlib.import_module(name)
        except ImportError:  # an optional dependency of that model is missing here
            continue
    originals = {name: m.apply_rotary_pos_emb_vision for name, m in modules.items()}
    matched = {name for name, m in modules.items() if any(True for _ in vision_rotary_hook(m))}
    families = {name.split(".")[2] for name in matched}
    # The families the issue names, in every version that has them -- importable in this
    # process: after a module of the suite imported transformers' flash-attention utils
    # outside the emulator, 4.51's Qwen2.5-VL (which imports apply_rotary_emb from them
    # when flash-attn looks available) no longer imports under it; a program is on an
    # NPU or not from its start, and this module alone checks it there.
    imported = {name.split(".")[2] for name in modules}
    assert "qwen2_vl" in imported, "the oldest vision-language family imports in every version"
    for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe"):
        assert (family in families) == (family in imported), family
    # Other formulas under the same name are left alone: interleaved pairs (Inkling2),
    # partial rotary (MiniMax-M3-VL), and 4.57's Qwen2.5-Omni (freqs, one tensor).
    for name, function in originals.items():
        source = inspect.getsource(function)
        if "rotate_pairwise(q)" in source or "q_pass = " in source or "tensor, freqs" in source:
            assert name not in matched, name
    isolated_patcher.add(TransformersRotary).apply()
    q, k = _packed_qk(6, 2, 16, torch.bfloat16)
    cos, sin = _cos_sin(6, 16)
    for name in sorted(matched):
        expected = originals[name](q, k, cos, sin)
        got = modules[name].apply_rotary_pos_emb_vision(q, k, cos, sin)
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-2, msg=name)
        counters = _counters(isolated_patcher, f"{name}:apply_rotary_pos_emb_vision")
        assert (counters.replacement_calls, counters.fallback_calls) == (1, 0), name
