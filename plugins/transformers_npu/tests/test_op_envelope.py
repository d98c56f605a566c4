"""Every op call the norms-family replacements make lies inside the op's documented envelope.

The emulator's kernels take any layout, rank, size and stride; on an NPU only the
documented ones are promised (see :mod:`op_envelope`). A property test per family
drives the patched functions with random shapes, ranks, dtypes and memory layouts
(transposed, strided views; projections that return strided tensors, as a LoRA or
quantized layer may) and checks that (a) each result equals the original's (values and
input gradients, or the original's own error) and (b) every ``npu_rotary_mul``,
``npu_swiglu`` and ``npu_rms_norm`` call was inside the envelope. Draws are
derandomized, so a run is reproducible.
"""

from __future__ import annotations

import contextlib
import importlib

import pytest
from ascend_patch_emulator.pytest_plugin import assert_parity
from hf_stacks import require_module
from hf_stacks import transformers_version


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import TransformersRMSNorm  # noqa: E402
from ascend_patch_transformers.groups import TransformersRotary  # noqa: E402
from ascend_patch_transformers.groups import TransformersSwiGLU  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from op_envelope import LAYOUTS  # noqa: E402
from op_envelope import OpEnvelope  # noqa: E402
from op_envelope import StridedResults  # noqa: E402
from op_envelope import restride  # noqa: E402
from op_envelope import rms_norm_violations  # noqa: E402
from op_envelope import rotary_mul_violations  # noqa: E402
from op_envelope import swiglu_violations  # noqa: E402
from test_rotary import _cos_sin  # noqa: E402
from test_swiglu import _bf16_close  # noqa: E402
from test_swiglu import _experts  # noqa: E402
from test_swiglu import _mlp  # noqa: E402

# Imported outside the emulator, as test_vision_rotary does (4.51 and einops).
from transformers.models.qwen2_vl import modeling_qwen2_vl  # noqa: E402


_DRAWS = settings(max_examples=100, deadline=None, derandomize=True)
_ERRORS = (RuntimeError, IndexError, ValueError)
_FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def _module(name):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _counters(patcher, target):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record.counters


def _matches(original, patched, *inputs, layouts=None, grad=True, close=None):
    """(a) patched equals original on ``inputs`` restrided per ``layouts``; (b) its op calls are inside."""
    layouts = layouts or ["contiguous"] * len(inputs)

    def viewed(function):
        def call(*tensors):
            return function(*(restride(t, lay) for t, lay in zip(tensors, layouts, strict=True)))

        return call

    try:
        expected = viewed(original)(*(t.detach().clone() for t in inputs))
    except _ERRORS:
        with OpEnvelope() as envelope, pytest.raises(_ERRORS):
            viewed(patched)(*inputs)
        envelope.assert_inside()
        return
    with OpEnvelope() as envelope:
        if close is None:
            assert_parity(viewed(original), viewed(patched), *inputs, grad=grad)
        else:
            got = viewed(patched)(*inputs)
            for e, g in (
                zip(expected, got, strict=True) if isinstance(got, tuple) else [(expected, got)]
            ):
                close(g, e)
    envelope.assert_inside()


def _served_and_fell_back(counters):
    # Not vacuous: the draws reached the op and also its fallback.
    assert counters.replacement_calls > 0 and counters.fallback_calls > 0, counters


# -- the checks themselves -----------------------------------------------------------


def test_the_envelopes_say_what_the_documentation_says():
    t = torch.empty
    assert rotary_mul_violations(t(2, 4, 5, 8), t(1, 1, 5, 8), t(1, 1, 5, 8)) == []  # BNSD 11SD
    assert rotary_mul_violations(t(2, 5, 4, 8), t(2, 5, 1, 8), t(2, 5, 1, 8)) == []  # BSND BS1D
    assert rotary_mul_violations(t(5, 2, 4, 8), t(5, 1, 1, 8), t(5, 1, 1, 8)) == []  # SBND S11D
    assert rotary_mul_violations(t(7, 4, 8), t(7, 1, 8), t(7, 1, 8)) == []  # TND T1D
    assert rotary_mul_violations(t(2, 4, 5, 8), t(1, 4, 1, 8), t(1, 4, 1, 8)) == []  # BSND 1S1D
    outside = [
        (t(1, 2, 4, 5, 8), t(1, 1, 1, 5, 8)),  # 5-D
        (t(2, 4, 5, 8), t(2, 4, 1, 1)),  # r1 narrower than D
        (t(2, 4, 5, 7), t(1, 1, 5, 7)),  # odd D
        (t(1, 1, 2, 896), t(1, 1, 2, 896)),  # D from 896
        (t(1, 1000, 2, 8), t(1, 1, 2, 8)),  # N (BNSD) from 1000, and no other layout fits
        (t(7, 4, 8), t(7, 8)),  # r1 of another rank
        (t(2, 4, 5, 8), t(1, 4, 5, 1, 8)[0, :, :, 0]),  # [4, 5, 8]: another rank again
    ]
    for x, r in outside:
        assert rotary_mul_violations(x, r, r), (tuple(x.shape), tuple(r.shape))
    half = t(2, 4, 5, 8, dtype=torch.bfloat16)
    assert rotary_mul_violations(half, t(1, 1, 5, 8), t(1, 1, 5, 8))  # mixed dtypes
    assert swiglu_violations(t(3, 8)) == []
    assert swiglu_violations(t(8, 3).t())  # not contiguous
    assert swiglu_violations(t(3, 7))  # odd
    assert swiglu_violations(t(*[1] * 8, 2)) and swiglu_violations(t(()))  # 9-D, 0-D
    assert swiglu_violations(t(4, dtype=torch.float64))
    assert rms_norm_violations(t(2, 8, dtype=torch.bfloat16), t(8)) == []  # bf16 with fp32
    assert rms_norm_violations(t(2, 3, 8), t(3, 8)) == []
    assert rms_norm_violations(t(8), t(8))  # 1-D
    assert rms_norm_violations(t(2, 8), t(4))
    assert rms_norm_violations(t(2, 8), t(8, dtype=torch.bfloat16))  # fp32 with bf16


# -- rotary ------------------------------------------------------------------------


@st.composite
def _text_rotary(draw, partial):
    dims = st.sampled_from([1, 2, 3])
    batch, heads, kv_heads, seq = (
        draw(dims),
        draw(st.sampled_from([1, 2, 4])),
        draw(dims),
        draw(dims),
    )
    if draw(st.integers(0, 9)) == 0:  # from 1000: batch or heads
        batch, heads = draw(st.sampled_from([(1000, 1), (1, 1000)]))
    rotary = draw(st.sampled_from([2, 4, 6, 8, 16, 7, 896]))
    head = rotary + (draw(st.sampled_from([0, 2, 3, 8])) if partial else 0)
    unsqueeze_dim = draw(st.sampled_from([1, 2, -3, -2, 0]))
    dtype = draw(st.sampled_from(_FLOATS))
    cos_dtype = dtype if draw(st.integers(0, 4)) else draw(st.sampled_from(_FLOATS))
    if unsqueeze_dim % 4 == 1:
        q_shape, k_shape = (batch, heads, seq, head), (batch, kv_heads, seq, head)
    else:  # BSND; unsqueeze_dim 0 gets it too (and falls back)
        q_shape, k_shape = (batch, seq, heads, head), (batch, seq, kv_heads, head)
    extra = draw(st.sampled_from([(), (), (), (1,)]))  # sometimes 5-D
    q = torch.randn(*extra, *q_shape).to(dtype)
    k = torch.randn(*extra, *k_shape).to(dtype)
    cos, sin = _cos_sin(draw(st.sampled_from([1, batch])), seq, rotary, cos_dtype)
    layouts = [draw(st.sampled_from(LAYOUTS)) for _ in range(4)]
    return q, k, cos, sin, unsqueeze_dim, layouts


@pytest.mark.parametrize(("model", "partial"), [("llama", False), ("phi3", True)])
def test_text_rotary_stays_inside_the_envelope(npu_emulator, isolated_patcher, model, partial):
    module = _module(model)
    original = module.apply_rotary_pos_emb
    isolated_patcher.add(TransformersRotary).apply()
    patched = module.apply_rotary_pos_emb

    @_DRAWS
    @given(_text_rotary(partial))
    def check(case):
        q, k, cos, sin, unsqueeze_dim, layouts = case
        if q.dtype == torch.float32 == cos.dtype:  # gradients of cos and sin too
            _matches(
                lambda *a: original(*a, unsqueeze_dim=unsqueeze_dim),
                lambda *a: patched(*a, unsqueeze_dim=unsqueeze_dim),
                q,
                k,
                cos,
                sin,
                layouts=layouts,
            )
        else:  # cos/sin from buffers, as in a model
            _matches(
                lambda q, k: original(
                    q, k, restride(cos, layouts[2]), sin, unsqueeze_dim=unsqueeze_dim
                ),
                lambda q, k: patched(
                    q, k, restride(cos, layouts[2]), sin, unsqueeze_dim=unsqueeze_dim
                ),
                q,
                k,
                layouts=layouts[:2],
            )

    check()
    target = f"{module.__name__}:apply_rotary_pos_emb"
    _served_and_fell_back(_counters(isolated_patcher, target))


@st.composite
def _vision_rotary(draw):
    dims = st.sampled_from([1, 2, 3, 5])
    tokens, heads, kv_heads, batch = (
        draw(dims),
        draw(dims),
        draw(dims),
        draw(st.sampled_from([1, 2])),
    )
    if draw(st.integers(0, 4)) == 0:  # from 1000
        heads, batch = draw(st.sampled_from([(1000, batch), (heads, 1000)]))
    width = draw(st.sampled_from([2, 4, 8, 16, 6, 7, 896]))
    kind = draw(st.sampled_from(["TND", "BSND", "BSND", "BNSD", "5-D"]))
    if kind == "TND":
        q_shape, k_shape, cos_shape = (
            (tokens, heads, width),
            (tokens, kv_heads, width),
            (tokens, width),
        )
    else:
        q_shape, k_shape = (batch, tokens, heads, width), (batch, tokens, kv_heads, width)
        cos_shape = draw(
            st.sampled_from([(tokens, width), (1, tokens, width), (batch, tokens, width)])
        )
        if kind == "BNSD":  # heads before tokens: [S, D] cos/sin broadcast over S only if N == S
            q_shape, k_shape = (batch, heads, tokens, width), (batch, heads, tokens, width)
        elif kind == "5-D":
            q_shape, k_shape = (1, *q_shape), (1, *k_shape)
    if draw(st.integers(0, 9)) == 0:  # a cos/sin of width 1, broadcast over the head
        cos_shape = (*cos_shape[:-1], 1)
    dtypes = [draw(st.sampled_from([*_FLOATS, torch.float64])) for _ in range(3)]
    q, k = torch.randn(q_shape).to(dtypes[0]), torch.randn(k_shape).to(dtypes[1])
    angles = torch.rand(cos_shape) * 6
    layouts = [draw(st.sampled_from([*LAYOUTS, "packed"])) for _ in range(2)]
    return q, k, angles.cos().to(dtypes[2]), angles.sin().to(dtypes[2]), layouts


def _packed(tensor, layout):
    # As the vision attention: qkv.reshape(S, 3, N, D).permute(1, 0, 2, 3).unbind(0).
    if layout != "packed":
        return restride(tensor, layout)
    return torch.stack((tensor, tensor, tensor), 1).movedim(1, 0)[1]


def test_vision_rotary_stays_inside_the_envelope(npu_emulator, isolated_patcher):
    original = modeling_qwen2_vl.apply_rotary_pos_emb_vision
    isolated_patcher.add(TransformersRotary).apply()
    patched = modeling_qwen2_vl.apply_rotary_pos_emb_vision

    @_DRAWS
    @given(_vision_rotary())
    def check(case):
        q, k, cos, sin, (q_layout, k_layout) = case
        _matches(
            lambda q, k: original(_packed(q, q_layout), _packed(k, k_layout), cos, sin),
            lambda q, k: patched(_packed(q, q_layout), _packed(k, k_layout), cos, sin),
            q,
            k,
        )

    check()
    target = f"{modeling_qwen2_vl.__name__}:apply_rotary_pos_emb_vision"
    _served_and_fell_back(_counters(isolated_patcher, target))


# -- SwiGLU ------------------------------------------------------------------------

_MLPS = [("llama", "LlamaMLP", "act_fn"), ("phi3", "Phi3MLP", "activation_fn")]
if transformers_version() < (5,):  # 4.x: Mixtral's experts are w1/w3/w2 MLPs
    _MLPS.append(("mixtral", "MixtralBlockSparseTop2MLP", "act_fn"))


def _close(dtype):
    """Whole modules: fp32 within its tolerance; half precision by :func:`_bf16_close`'s measure."""
    if dtype in (torch.float32, torch.float64):
        return lambda got, expected: torch.testing.assert_close(got, expected)
    return _bf16_close


@st.composite
def _tokens(draw, width, max_rank=9):
    rank = draw(st.integers(1, max_rank))
    leading = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(rank - 1)]
    dtype = draw(st.sampled_from([*_FLOATS, torch.float64]))
    return torch.randn(*leading, width).to(dtype), draw(st.sampled_from(LAYOUTS))


@pytest.mark.parametrize(("arch", "cls_name", "activation"), _MLPS)
def test_swiglu_mlps_stay_inside_the_envelope(
    npu_emulator, isolated_patcher, arch, cls_name, activation
):
    module, mlp = _mlp(arch, cls_name, torch.float32)
    original = type(mlp).forward
    isolated_patcher.add(TransformersSwiGLU).apply()
    patched = type(mlp).forward
    silu = getattr(mlp, activation)

    @_DRAWS
    @given(_tokens(32), st.booleans(), st.booleans())
    def check(case, strided_projections, gelu):
        x, layout = case
        setattr(mlp, activation, torch.nn.GELU() if gelu else silu)
        mlp.to(x.dtype)
        with StridedResults() if strided_projections else contextlib.nullcontext():
            _matches(
                lambda x: original(mlp, x),
                lambda x: patched(mlp, x),
                x,
                layouts=[layout],
                close=_close(x.dtype),
            )

    check()
    _served_and_fell_back(_counters(isolated_patcher, f"{module.__name__}:{cls_name}.forward"))


def test_llama4_stacked_experts_stay_inside_the_envelope(npu_emulator, isolated_patcher):
    from transformers import Llama4TextConfig

    module = _module("llama4")
    cfg = Llama4TextConfig(hidden_size=32, intermediate_size=24, num_local_experts=3)
    torch.manual_seed(0)
    experts = module.Llama4TextExperts(cfg)
    for param in experts.parameters():
        torch.nn.init.normal_(param, std=0.2)
    original = type(experts).forward
    isolated_patcher.add(TransformersSwiGLU).apply()
    patched = type(experts).forward

    @_DRAWS
    @given(
        st.integers(1, 4),
        st.sampled_from([(-1, 32), (3, -1, 32), (-1,)]),
        st.sampled_from([*_FLOATS, torch.float64]),
        st.sampled_from(LAYOUTS),
        st.booleans(),
    )
    def check(per_expert, shape, dtype, layout, strided_bmm):
        experts.to(dtype)
        x = torch.randn(3 * per_expert, 32).to(dtype).reshape(shape)
        with StridedResults() if strided_bmm else contextlib.nullcontext():
            _matches(
                lambda x: original(experts, x),
                lambda x: patched(experts, x),
                x,
                layouts=[layout],
                close=_close(dtype),
            )

    check()
    _served_and_fell_back(
        _counters(isolated_patcher, f"{module.__name__}:Llama4TextExperts.forward")
    )


_NEW = pytest.mark.skipif(
    transformers_version() < (5,), reason="transformers 4.x has no @use_experts_implementation"
)


@_NEW
def test_experts_gate_stays_inside_the_envelope(npu_emulator, isolated_patcher):
    module, experts = _experts(
        "qwen3_moe", "Qwen3MoeExperts", torch.float32, "grouped_mm", num_experts=4
    )
    original = type(experts)._apply_gate
    isolated_patcher.add(TransformersSwiGLU).apply()
    patched = type(experts)._apply_gate

    @_DRAWS
    @given(_tokens(48), st.sampled_from([48, 7, 2]))
    def check(case, width):
        x, layout = case
        x = x[..., :width]
        _matches(lambda g: original(experts, g), lambda g: patched(experts, g), x, layouts=[layout])

    check()
    _served_and_fell_back(
        _counters(isolated_patcher, f"{module.__name__}:Qwen3MoeExperts._apply_gate")
    )


@_NEW
@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
def test_fused_experts_stay_inside_the_envelope(npu_emulator, isolated_patcher, implementation):
    _, experts = _experts(
        "qwen3_moe", "Qwen3MoeExperts", torch.float32, implementation, num_experts=4
    )
    original = type(experts).__dict__["_apply_gate"]
    isolated_patcher.add(TransformersSwiGLU).apply()

    @_DRAWS
    @given(st.integers(1, 9), st.integers(1, 2), st.sampled_from(_FLOATS), st.integers(0, 2**16))
    def check(tokens, top_k, dtype, seed):
        experts.to(dtype)
        generator = torch.Generator().manual_seed(seed)
        index = torch.stack([torch.randperm(4, generator=generator)[:top_k] for _ in range(tokens)])
        weights = torch.rand(tokens, top_k, generator=generator).softmax(-1).to(dtype)
        x = torch.randn(tokens, 32, generator=generator).to(dtype)
        with OpEnvelope() as envelope:
            got = experts(x, index, weights)
        envelope.assert_inside()
        assert envelope.of("npu_swiglu")
        patched = type(experts)._apply_gate
        type(experts)._apply_gate = original  # the unpatched run
        try:
            expected = experts(x, index, weights)
        finally:
            type(experts)._apply_gate = patched
        _close(dtype)(got, expected)

    check()


# -- RMSNorm -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "cls_name"), [("llama", "LlamaRMSNorm"), ("gemma", "GemmaRMSNorm")]
)
def test_rms_norms_stay_inside_the_envelope(npu_emulator, isolated_patcher, model, cls_name):
    module = _module(model)
    cls = getattr(module, cls_name)
    original = cls.forward
    isolated_patcher.add(TransformersRMSNorm).apply()
    patched = cls.forward

    @_DRAWS
    @given(st.sampled_from([1, 2, 8, 64]), st.data())
    def check(hidden, data):
        x, layout = data.draw(_tokens(hidden))
        norm = cls(hidden, eps=1e-5)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(hidden) * 0.5 + 1)
        weight_dtype = data.draw(st.sampled_from([x.dtype, x.dtype, torch.float32]))
        norm.to(weight_dtype)
        _matches(lambda x: original(norm, x), lambda x: patched(norm, x), x, layouts=[layout])

    check()
    _served_and_fell_back(_counters(isolated_patcher, f"{module.__name__}:{cls_name}.forward"))
