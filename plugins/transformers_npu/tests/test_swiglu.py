"""TransformersSwiGLU: SwiGLU MLPs served by npu_swiglu, same numbers; GeGLU MLPs left alone.

The original forward is saved before the patch is applied: under the emulator every
CPU tensor is an NPU tensor.
"""

from __future__ import annotations

import importlib

import pytest
from hf_stacks import require_module


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups_norms import TransformersSwiGLU  # noqa: E402
from ascend_patch_transformers.swiglu import swiglu_hook  # noqa: E402
from transformers import AutoConfig  # noqa: E402


def _counters(patcher, target):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record.counters


def _mlp(arch, cls_name, dtype, **config):
    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    cfg = AutoConfig.for_model(arch, hidden_size=32, intermediate_size=48, **config)
    torch.manual_seed(0)
    return module, getattr(module, cls_name)(cfg).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("arch", "cls_name"),
    [("llama", "LlamaMLP"), ("qwen2", "Qwen2MLP"), ("mistral", "MistralMLP"), ("phi3", "Phi3MLP")],
)
def test_matches_the_original(npu_emulator, isolated_patcher, assert_parity, dtype, arch, cls_name):
    module, mlp = _mlp(arch, cls_name, dtype)
    cls = type(mlp)
    original = cls.forward
    isolated_patcher.add(TransformersSwiGLU).apply()
    patched = cls.forward
    assert patched is not original
    x = torch.randn(2, 5, 32, dtype=dtype)
    # Values, the input's gradient, and through the projections' weights the same
    # cotangents (checked on the weights' .grad below).
    assert_parity(lambda x: original(mlp, x), lambda x: patched(mlp, x), x)
    counters = _counters(isolated_patcher, f"{module.__name__}:{cls_name}.forward")
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


def test_projection_gradients_match(npu_emulator, isolated_patcher):
    _, mlp = _mlp("llama", "LlamaMLP", torch.float32)
    x = torch.randn(3, 4, 32)
    mlp(x).square().sum().backward()
    expected = {n: p.grad.clone() for n, p in mlp.named_parameters()}
    mlp.zero_grad()
    isolated_patcher.add(TransformersSwiGLU).apply()
    mlp(x).square().sum().backward()
    for name, param in mlp.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_geglu_and_unsupported_inputs_run_the_original(npu_emulator, isolated_patcher):
    # Gemma's MLP has Llama's source but a tanh-GELU: not a SwiGLU.
    gemma, geglu = _mlp("gemma", "GemmaMLP", torch.float32, hidden_act="gelu_pytorch_tanh")
    llama, mlp = _mlp("llama", "LlamaMLP", torch.float32)
    x = torch.randn(2, 32)
    expected = geglu(x)
    isolated_patcher.add(TransformersSwiGLU).apply()
    torch.testing.assert_close(geglu(x), expected)
    assert _counters(isolated_patcher, f"{gemma.__name__}:GemmaMLP.forward").fallback_calls == 1
    llama_counters = _counters(isolated_patcher, f"{llama.__name__}:LlamaMLP.forward")
    mlp.double()(x.double())  # float64
    assert (llama_counters.replacement_calls, llama_counters.fallback_calls) == (0, 1)


def test_gemma_with_silu_is_served(npu_emulator, isolated_patcher, assert_parity):
    # The activation decides, at run time: a Gemma MLP configured with silu is a SwiGLU.
    gemma, mlp = _mlp("gemma", "GemmaMLP", torch.float32, hidden_act="silu")
    original = type(mlp).forward
    isolated_patcher.add(TransformersSwiGLU).apply()
    assert_parity(
        lambda x: original(mlp, x), lambda x: type(mlp).forward(mlp, x), torch.randn(3, 32)
    )
    assert _counters(isolated_patcher, f"{gemma.__name__}:GemmaMLP.forward").replacement_calls == 1


def test_other_mlps_are_not_matched():
    # GPT-2's MLP (one activation, no gate) is not a gated unit.
    gpt2 = importlib.import_module("transformers.models.gpt2.modeling_gpt2")
    assert list(swiglu_hook(gpt2)) == []
