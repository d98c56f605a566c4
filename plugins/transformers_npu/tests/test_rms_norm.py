"""TransformersRMSNorm: RMSNorm classes found by formula, served by npu_rms_norm, same numbers.

Under the NPU emulator every CPU tensor is an NPU tensor, so each original result is
computed with the patch reverted (``assert_parity`` gets the saved original forward).
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
from hf_stacks import require_module


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import TransformersRMSNorm  # noqa: E402
from ascend_patch_transformers.rms_norm import excluded_rms_norms  # noqa: E402
from ascend_patch_transformers.rms_norm import rms_norm_hook  # noqa: E402
from ascend_patch_transformers.rms_norm import rms_norm_patched_classes  # noqa: E402
from transformers.models.gemma import modeling_gemma  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402


def _record(patcher, target):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record


def _norm(cls, dtype, hidden=64):
    torch.manual_seed(1)
    norm = cls(hidden, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden) * 0.5 + (0 if "Gemma" in cls.__name__ else 1))
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 64), (2, 7, 64), (2, 3, 4, 64)])
def test_llama_rms_norm_matches_the_original(
    npu_emulator, isolated_patcher, assert_parity, dtype, shape
):
    norm = _norm(modeling_llama.LlamaRMSNorm, dtype)
    original = modeling_llama.LlamaRMSNorm.forward
    isolated_patcher.add(TransformersRMSNorm).apply()
    patched = modeling_llama.LlamaRMSNorm.forward
    assert patched is not original
    x = torch.randn(shape, dtype=dtype) * 3
    # Values, and gradients of the input and of the weight (a parameter of the module).
    assert_parity(lambda x: original(norm, x), lambda x: patched(norm, x), x)
    counters = _record(
        isolated_patcher, "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward"
    ).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


def test_weight_gradient_matches(npu_emulator, isolated_patcher):
    norm = _norm(modeling_llama.LlamaRMSNorm, torch.float32)
    x = torch.randn(3, 5, 64)
    norm(x).pow(2).sum().backward()
    expected = norm.weight.grad.clone()
    norm.weight.grad = None
    isolated_patcher.add(TransformersRMSNorm).apply()
    norm(x).pow(2).sum().backward()
    torch.testing.assert_close(norm.weight.grad, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_one_plus_weight_matches_the_original(
    npu_emulator, isolated_patcher, assert_parity, dtype
):
    norm = _norm(modeling_gemma.GemmaRMSNorm, dtype)
    original = modeling_gemma.GemmaRMSNorm.forward
    isolated_patcher.add(TransformersRMSNorm).apply()
    patched = modeling_gemma.GemmaRMSNorm.forward
    assert patched is not original
    x = torch.randn(2, 7, 64, dtype=dtype)
    assert_parity(lambda x: original(norm, x), lambda x: patched(norm, x), x)
    counters = _record(
        isolated_patcher, "transformers.models.gemma.modeling_gemma:GemmaRMSNorm.forward"
    ).counters
    assert counters.replacement_calls == 1
    # The formula is (1 + weight): a zero weight is the identity scale, not zero.
    with torch.no_grad():
        norm.weight.zero_()
    assert patched(norm, x).abs().sum() > 0


def test_unsupported_inputs_run_the_original(npu_emulator, isolated_patcher):
    norm = _norm(modeling_llama.LlamaRMSNorm, torch.float32)
    isolated_patcher.add(TransformersRMSNorm).apply()
    counters = _record(
        isolated_patcher, "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward"
    ).counters
    norm(torch.randn(64))  # 1-D: npu_rms_norm takes 2 to 8 dims
    norm(torch.randn(2, 64, dtype=torch.float64))  # float64
    norm(torch.randn(2, 64, dtype=torch.bfloat16))  # weight float32: the original promotes to it
    norm(torch.randn(*[1] * 8, 64))  # 9 dims
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 4)
    assert norm(torch.randn(2, 64, dtype=torch.bfloat16)).dtype == torch.float32


def test_gemma_subclass_with_its_own_norm_runs_the_original(npu_emulator, isolated_patcher):
    class HalfGemmaNorm(modeling_gemma.GemmaRMSNorm):
        def _norm(self, x):
            return super()._norm(x) * 0.5

    norm = HalfGemmaNorm(64)
    x = torch.randn(2, 64)
    expected = norm(x)
    isolated_patcher.add(TransformersRMSNorm).apply()
    torch.testing.assert_close(norm(x), expected)
    counters = _record(
        isolated_patcher, "transformers.models.gemma.modeling_gemma:GemmaRMSNorm.forward"
    ).counters
    assert counters.fallback_calls == 1


def test_without_an_npu_runtime_the_group_is_skipped(isolated_patcher):
    # Without torch_npu (or the emulator) the group's torch-npu requirement is unmet.
    original = modeling_llama.LlamaRMSNorm.forward
    isolated_patcher.add(TransformersRMSNorm).apply()
    assert modeling_llama.LlamaRMSNorm.forward is original
    (group,) = [r for r in isolated_patcher.report.records if r.name == "TransformersRMSNorm"]
    assert group.status == "skipped" and "torch-npu" in group.reason


_SOURCE = '''
import torch
from torch import nn


class Base(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.eps = eps


class PlainNorm(Base):
    """No RMSNorm in the name: found by its formula all the same."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.variance_epsilon)
        return self.weight * x.to(dtype)


class RoundsLateRMSNorm(Base):
    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class OffsetRMSNorm(Base):
    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (0.5 + self.weight.float())
        return output.type_as(x)


class InheritsRMSNorm(PlainNorm):
    pass
'''


@pytest.fixture
def synthetic_modeling(tmp_path: Path, monkeypatch):
    """A modeling module written to disk (the hook reads sources), imported under a test name."""
    (tmp_path / "apx_modeling_synthetic.py").write_text(textwrap.dedent(_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("apx_modeling_synthetic")
    yield module
    sys.modules.pop("apx_modeling_synthetic", None)


def test_classes_are_recognised_by_formula_not_by_name(synthetic_modeling):
    targets = [p.target for p in rms_norm_hook(synthetic_modeling)]
    assert targets == ["apx_modeling_synthetic:PlainNorm.forward"]
    excluded = excluded_rms_norms()
    # A different rounding order and a different offset are other formulas; a subclass
    # without a forward of its own inherits its parent's patch (or lack of one).
    assert "neither" in excluded["apx_modeling_synthetic.RoundsLateRMSNorm"]
    assert "neither" in excluded["apx_modeling_synthetic.OffsetRMSNorm"]
    assert "no forward" in excluded["apx_modeling_synthetic.InheritsRMSNorm"]


_MODELS = ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "gemma", "gemma2", "phi3", "olmo2"]


def test_every_patched_class_computes_its_original_formula(npu_emulator, isolated_patcher):
    """Behaviour, not source: each class the hook took gives its original's numbers."""
    modules = [importlib.import_module(f"transformers.models.{m}.modeling_{m}") for m in _MODELS]
    originals = {}
    for module in modules:
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                originals[f"{module.__name__}.{name}"] = value.__dict__.get("forward")
    isolated_patcher.add(TransformersRMSNorm).apply()
    patched = rms_norm_patched_classes()
    names = {name.rpartition(".")[2] for name in patched}
    # The reference's Qwen3 set and the models of the parity tests.
    assert {"Qwen3RMSNorm", "Qwen3MoeRMSNorm", "LlamaRMSNorm", "MistralRMSNorm"} <= names
    assert patched["transformers.models.gemma.modeling_gemma.GemmaRMSNorm"].startswith("gemma")
    checked = 0
    for where, original in originals.items():
        if where not in patched:
            continue
        module_name, _, name = where.rpartition(".")
        cls = getattr(sys.modules[module_name], name)
        norm = _norm(cls, torch.float32)
        x = torch.randn(3, 64)
        torch.testing.assert_close(cls.forward(norm, x), original(norm, x), rtol=1e-5, atol=1e-6)
        checked += 1
    assert checked == len([w for w in patched if w in originals]) >= len(_MODELS) - 1
    # Olmo2's norm rounds after the weight from 4.57 on (another formula, excluded and
    # listed as such); in 4.51 it is the standard one. Either way it is accounted for.
    olmo2 = "transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm"
    assert (olmo2 in patched) != (olmo2 in excluded_rms_norms())


def test_revert_restores_every_class(npu_emulator, isolated_patcher):
    originals = (modeling_llama.LlamaRMSNorm.forward, modeling_gemma.GemmaRMSNorm.forward)
    isolated_patcher.add(TransformersRMSNorm).apply()
    assert modeling_llama.LlamaRMSNorm.forward is not originals[0]
    assert modeling_gemma.GemmaRMSNorm.forward is not originals[1]
    isolated_patcher.revert()
    assert (modeling_llama.LlamaRMSNorm.forward, modeling_gemma.GemmaRMSNorm.forward) == originals
