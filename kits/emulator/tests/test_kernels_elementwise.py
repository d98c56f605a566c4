"""Norms, activations and rotary embedding against explicit float64 formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
SETTINGS = settings(max_examples=30, deadline=None)


def _tensor(shape, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 6), min_size=2, max_size=4),
    normalized=st.integers(1, 2),
    dtype=DTYPES,
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_rms_norm(emulated, assert_close, shape, normalized, dtype, eps, seed):
    import torch_npu

    x = _tensor(shape, dtype, seed)
    gamma = _tensor(shape[-normalized:], dtype, seed + 1)
    y, rstd = torch_npu.npu_rms_norm(x, gamma, epsilon=eps)
    dims = tuple(range(len(shape) - normalized, len(shape)))
    x64 = x.double()
    ref_rstd = 1 / torch.sqrt((x64 * x64).mean(dims, keepdim=True) + eps)
    assert y.dtype == dtype and rstd.dtype == torch.float32
    assert rstd.shape == tuple(shape[: len(shape) - normalized]) + (1,) * normalized
    assert_close(y, x64 * ref_rstd * gamma.double())
    assert_close(rstd, ref_rstd, dtype=torch.float32)


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_add_rms_norm(emulated, assert_close, shape, dtype, seed):
    import torch_npu

    x1, x2 = _tensor(shape, dtype, seed), _tensor(shape, dtype, seed + 1)
    gamma = _tensor(shape[-1:], dtype, seed + 2)
    y, rstd, total = torch_npu.npu_add_rms_norm(x1, x2, gamma)
    s = x1.double() + x2.double()
    ref_rstd = 1 / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6)
    assert_close(total, s)
    assert_close(y, s * ref_rstd * gamma.double())
    assert_close(rstd, ref_rstd, dtype=torch.float32)


def _silu(v):
    return v / (1 + torch.exp(-v))


def _gelu(v, tanh):
    if tanh:
        return 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    return 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_swiglu_and_geglu(emulated, assert_close, shape, dtype, seed, data):
    import torch_npu

    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    shape[dim] *= 2
    x = _tensor(shape, dtype, seed)
    a, b = x.double().chunk(2, dim)
    assert_close(torch_npu.npu_swiglu(x, dim=dim), _silu(a) * b)
    approximate = data.draw(st.sampled_from([0, 1]), label="approximate")
    left = data.draw(st.booleans(), label="activate_left")
    out, gelu = torch_npu.npu_geglu(x, dim, approximate, left)
    gated = _gelu(a if left else b, tanh=approximate == 1)
    assert_close(gelu, gated)
    assert_close(out, gated * (b if left else a))


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), max_size=3), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_plain_activations(emulated, assert_close, shape, dtype, seed):
    import torch_npu

    x = _tensor(shape, dtype, seed) * 3
    v = x.double()
    assert_close(torch_npu.fast_gelu(x), v / (1 + torch.exp(-1.702 * v)))
    assert_close(torch_npu.npu_fast_gelu(x), v / (1 + torch.exp(-1.702 * v)))
    assert_close(torch_npu.npu_gelu(x), _gelu(v, tanh=False))
    assert_close(torch_npu.npu_gelu(x, approximate="tanh"), _gelu(v, tanh=True))
    assert_close(torch_npu.npu_silu(x), _silu(v))
    assert_close(torch_npu.npu_mish(x), v * torch.tanh(torch.log1p(torch.exp(v))))


def _rotate_half(v):
    half = v.shape[-1] // 2
    return torch.cat([-v[..., half:], v[..., :half]], -1)


def _rotate_interleave(v):
    out = torch.empty_like(v)
    out[..., 0::2] = -v[..., 1::2]
    out[..., 1::2] = v[..., 0::2]
    return out


@SETTINGS
@given(
    b=st.integers(1, 3),
    s=st.integers(1, 5),
    n=st.integers(1, 3),
    half_d=st.integers(1, 4),
    broadcast=st.sampled_from(["11SD", "B1SD", "BNSD"]),
    mode=st.sampled_from(["half", "interleave"]),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_rotary_mul(emulated, assert_close, b, s, n, half_d, broadcast, mode, dtype, seed):
    import torch_npu

    d = 2 * half_d
    x = _tensor((b, n, s, d), dtype, seed)
    angle_shape = {"11SD": (1, 1, s, d), "B1SD": (b, 1, s, d), "BNSD": (b, n, s, d)}[broadcast]
    angles = _tensor(angle_shape, torch.float64, seed + 1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    rotate = _rotate_half if mode == "half" else _rotate_interleave
    expected = x.double() * cos.double() + rotate(x.double()) * sin.double()
    assert_close(torch_npu.npu_rotary_mul(x, cos, sin, rotary_mode=mode), expected)
    # HF's apply_rotary_pos_emb is literally this formula.
    if mode == "half":
        assert_close(torch_npu.npu_rotary_mul(x, cos, sin), expected)


def test_rotary_mul_with_a_rotation_matrix(emulated, assert_close):
    import torch_npu

    x = _tensor((1, 2, 3, 4), torch.float32, 0)
    cos, sin = torch.rand(1, 1, 3, 4), torch.rand(1, 1, 3, 4)
    matrix = _tensor((4, 4), torch.float32, 1)
    expected = x.double() * cos.double() + (x.double() @ matrix.double()) * sin.double()
    assert_close(torch_npu.npu_rotary_mul(x, cos, sin, rotate=matrix), expected)
    with pytest.raises(RuntimeError, match="rotary_mode"):
        torch_npu.npu_rotary_mul(x, cos, sin, rotary_mode="quarter")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda t, x: t.npu_rms_norm(x, torch.linspace(0.5, 1.5, 4, dtype=x.dtype))[0],
            id="rms_norm",
        ),
        pytest.param(lambda t, x: t.npu_swiglu(x), id="swiglu"),
        pytest.param(lambda t, x: t.npu_geglu(x, -1, 0, True)[0], id="geglu"),
        pytest.param(lambda t, x: t.fast_gelu(x), id="fast_gelu"),
        pytest.param(lambda t, x: t.npu_gelu(x, approximate="tanh"), id="gelu"),
        pytest.param(lambda t, x: t.npu_silu(x), id="silu"),
        pytest.param(lambda t, x: t.npu_mish(x), id="mish"),
        pytest.param(
            lambda t, x: t.npu_rotary_mul(
                x.view(1, 1, 3, 4), x.view(1, 1, 3, 4).cos(), x.view(1, 1, 3, 4).sin()
            ),
            id="rotary_mul",
        ),
    ],
)
def test_gradients_are_the_derivative_of_the_formula(emulated, call):
    import torch_npu

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: call(torch_npu, v), (x,))


def test_gradients_reach_gamma_and_the_angles(emulated):
    import torch_npu

    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    gamma = torch.rand(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, g: torch_npu.npu_rms_norm(a, g)[0], (x, gamma))
    r1 = torch.randn(1, 1, 2, 4, dtype=torch.float64, requires_grad=True)
    r2 = torch.randn(1, 1, 2, 4, dtype=torch.float64, requires_grad=True)
    x4 = torch.randn(1, 2, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c, s: torch_npu.npu_rotary_mul(a, c, s), (x4, r1, r2))
