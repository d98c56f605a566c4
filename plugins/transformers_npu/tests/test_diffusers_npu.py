"""diffusers on the NPU: AttnProcessor2_0 on npu_fusion_attention, RMS norms on npu_rms_norm.

Tiny random-weight models built from configs (no downloads). The reference is the
unpatched model, run before the groups are applied (diffusers finds no torch_npu
distribution under the emulator, so it takes its portable paths); the patched one must
match it -- outputs and gradients -- and the counters show the NPU ops served the calls.
Results are emulated (CPU reference kernels of the real torch_npu schemas).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from ascend_patch_transformers.groups import DiffusersAttention
from ascend_patch_transformers.groups import DiffusersRMSNorm
from hf_stacks import require_module


diffusers = require_module("diffusers")

import torch  # noqa: E402
from diffusers.models.attention_processor import Attention  # noqa: E402
from diffusers.models.attention_processor import AttnProcessor2_0  # noqa: E402
from diffusers.models.normalization import MochiRMSNorm  # noqa: E402
from diffusers.models.normalization import RMSNorm  # noqa: E402


ATTENTION = "diffusers.models.attention_processor.AttnProcessor2_0.__call__"
RMS = "diffusers.models.normalization.RMSNorm.forward"
MOCHI = "diffusers.models.normalization.MochiRMSNorm.forward"


def _run(model: torch.nn.Module, call: Callable[[], torch.Tensor]) -> tuple[Any, list[Any]]:
    """The output and every parameter's gradient of ``call()`` (a fixed cotangent)."""
    model.zero_grad(set_to_none=True)
    out = call()
    torch.manual_seed(123)
    out.backward(torch.randn_like(out))
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _assert_same(expected: tuple[Any, list[Any]], got: tuple[Any, list[Any]], tol: float) -> None:
    torch.testing.assert_close(got[0], expected[0], atol=tol, rtol=tol)
    assert len(got[1]) == len(expected[1])
    for want, have in zip(expected[1], got[1], strict=True):
        torch.testing.assert_close(have, want, atol=tol, rtol=tol)


def _counters(patcher: Any, name: str) -> tuple[int, int]:
    counters = patcher.report.get(name).counters
    return counters.replacement_calls, counters.fallback_calls


def test_a_tiny_unet_matches_the_unpatched_one(npu_emulator, isolated_patcher) -> None:
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    assert all(isinstance(p, AttnProcessor2_0) for p in unet.attn_processors.values())
    sample = torch.randn(2, 4, 8, 8, device="npu")
    text = torch.randn(2, 5, 32, device="npu")

    def call() -> torch.Tensor:
        return unet(sample, 10, encoder_hidden_states=text).sample

    expected = _run(unet, call)
    isolated_patcher.add(DiffusersAttention).apply()
    got = _run(unet, call)
    _assert_same(expected, got, 1e-4)
    # Self- and cross-attention of both attention blocks, each one call.
    assert _counters(isolated_patcher, ATTENTION) == (len(unet.attn_processors), 0)


def test_qk_rms_norm_and_a_boolean_mask(npu_emulator, isolated_patcher) -> None:
    """Attention with qk-norm (diffusers' RMSNorm) and a padding mask over the context."""
    torch.manual_seed(0)
    attn = Attention(32, cross_attention_dim=16, heads=4, dim_head=8, qk_norm="rms_norm")
    attn.norm_q.weight.data.uniform_(0.5, 1.5)  # not all ones: the weight must count
    hidden = torch.randn(2, 6, 32, device="npu")
    context = torch.randn(2, 5, 16, device="npu")
    keep = torch.tensor([[True] * 5, [True, True, True, False, False]], device="npu")

    def call() -> torch.Tensor:
        return attn(hidden, encoder_hidden_states=context, attention_mask=keep[:, None, :])

    expected = _run(attn, call)
    isolated_patcher.add(DiffusersAttention, DiffusersRMSNorm).apply()
    _assert_same(expected, _run(attn, call), 1e-5)
    assert _counters(isolated_patcher, ATTENTION) == (1, 0)
    assert _counters(isolated_patcher, RMS) == (2, 0)  # norm_q and norm_k


def test_an_additive_float_mask_takes_the_original(npu_emulator, isolated_patcher) -> None:
    torch.manual_seed(0)
    attn = Attention(32, heads=4, dim_head=8)
    hidden = torch.randn(2, 6, 32, device="npu")
    bias = torch.randn(2, 1, 6, device="npu")  # any additive bias, not only 0 / masked
    expected = attn(hidden, attention_mask=bias)
    isolated_patcher.add(DiffusersAttention).apply()
    torch.testing.assert_close(attn(hidden, attention_mask=bias), expected)
    assert _counters(isolated_patcher, ATTENTION) == (0, 1)


@pytest.mark.parametrize(
    ("affine", "dtype", "weight_dtype", "tol"),
    [
        (True, torch.float32, torch.float32, 1e-5),
        (True, torch.float32, torch.bfloat16, 2e-2),  # diffusers casts the input to bf16
        (True, torch.bfloat16, torch.float32, 2e-2),  # dtypes differ: the original runs
        (False, torch.float32, None, 1e-5),  # no weight: the op needs one
    ],
)
def test_rms_norm(npu_emulator, isolated_patcher, affine, dtype, weight_dtype, tol) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6, elementwise_affine=affine, bias=affine)
    if affine:
        norm.weight.data.uniform_(0.5, 1.5)
        norm.bias.data.uniform_(-0.1, 0.1)
        norm.to(weight_dtype)
    x = torch.randn(3, 5, 16, device="npu", dtype=dtype, requires_grad=True)
    expected = norm(x)
    isolated_patcher.add(DiffusersRMSNorm).apply()
    got = norm(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    fused = affine and (weight_dtype is not torch.float32 or dtype is torch.float32)
    calls = _counters(isolated_patcher, RMS)
    assert calls == ((1, 0) if fused or not affine else (0, 1))
    if affine and dtype is weight_dtype:  # gradients through the op
        (gx,) = torch.autograd.grad(got.sum(), x)
        (ex,) = torch.autograd.grad(expected.sum(), x)
        torch.testing.assert_close(gx, ex, atol=tol, rtol=tol)


def test_mochi_rms_norm(npu_emulator, isolated_patcher) -> None:
    torch.manual_seed(0)
    norm = MochiRMSNorm(16, eps=1e-6)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(3, 16, device="npu", dtype=torch.bfloat16)
    expected = norm(x)
    isolated_patcher.add(DiffusersRMSNorm).apply()
    got = norm(x)
    assert got.dtype is torch.bfloat16
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)
    assert _counters(isolated_patcher, MOCHI) == (1, 0)


def test_float64_runs_the_originals(npu_emulator, isolated_patcher) -> None:
    """npu_fusion_attention and npu_rms_norm take float16/bfloat16/float32 only: a float64
    model keeps its own computation (and precision), counted as fallbacks."""
    torch.manual_seed(0)
    attn = Attention(16, heads=2, dim_head=8, processor=AttnProcessor2_0()).double()
    norm = RMSNorm(16, eps=1e-6).double()
    mochi = MochiRMSNorm(16, eps=1e-6).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, device="npu")
    expected = [attn(x), norm(x), mochi(x)]
    isolated_patcher.add(DiffusersAttention, DiffusersRMSNorm).apply()
    got = [attn(x), norm(x), mochi(x)]
    for have, want in zip(got, expected, strict=True):
        assert have.dtype == torch.float64
        torch.testing.assert_close(have, want, atol=0, rtol=0)
    assert _counters(isolated_patcher, ATTENTION) == (0, 1)
    assert _counters(isolated_patcher, RMS) == (0, 1)
    assert _counters(isolated_patcher, MOCHI) == (0, 1)
