"""TransformersSwiGLU: SwiGLU MLPs served by npu_swiglu, same numbers; GeGLU MLPs left alone.

The original forward is saved before the patch is applied: under the emulator every
CPU tensor is an NPU tensor.
"""

from __future__ import annotations

import functools
import importlib

import pytest
from hf_stacks import require_module
from hf_stacks import transformers_version


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import TransformersSwiGLU  # noqa: E402
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


# transformers 5.x: MoE experts as one module of stacked weights, gated by _apply_gate.

_EXPERTS = [  # (model type, experts class, config keys for a tiny experts module)
    ("qwen3_moe", "Qwen3MoeExperts", {"num_experts": 4, "moe_intermediate_size": 24}),
    ("qwen2_moe", "Qwen2MoeExperts", {"num_experts": 4, "moe_intermediate_size": 24}),
    ("mixtral", "MixtralExperts", {"num_local_experts": 4, "intermediate_size": 24}),
    ("olmoe", "OlmoeExperts", {"num_experts": 4, "intermediate_size": 24}),
    ("deepseek_v3", "DeepseekV3Experts", {"n_routed_experts": 4, "moe_intermediate_size": 24}),
]
_NEW = pytest.mark.skipif(
    transformers_version() < (5,), reason="transformers 4.x has no @use_experts_implementation"
)


def _experts(arch, cls_name, dtype, implementation, **config):
    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    cfg = AutoConfig.for_model(arch, hidden_size=32, **config)
    cfg._experts_implementation = implementation
    torch.manual_seed(0)
    experts = getattr(module, cls_name)(cfg)
    for param in experts.parameters():  # torch.empty at construction
        torch.nn.init.normal_(param, std=0.2)
    return module, experts.to(dtype)


def _routing(tokens=7, experts=4, top_k=2):
    torch.manual_seed(2)
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k).softmax(-1)
    return torch.randn(tokens, 32), index, weights


def _bf16_close(actual, expected, msg=""):
    """bfloat16 through a whole experts module: the op rounds ``silu(gate) * up`` once, the
    original rounds ``silu(gate)`` first, and the projections around it carry that last-bit
    difference into every output and gradient. Measured over 40 draws (Qwen3-MoE and
    Mixtral experts, grouped_mm and batched_mm, 10 seeds, 8 experts, 16 tokens): the
    difference's norm <= 0.0060 of the expected norm, its largest element <= 0.0096 of
    the expected largest. Allowed: two bfloat16 epsilons (2 * 2**-7) in norm, four of the
    largest element elementwise -- a gate with its halves swapped is off by 0.81 in norm
    (measured).
    """
    eps = torch.finfo(torch.bfloat16).eps
    actual, expected = actual.float(), expected.float()
    difference = actual - expected
    assert difference.norm() <= 2 * eps * expected.norm(), msg
    assert difference.abs().max() <= 4 * eps * expected.abs().max(), msg


@_NEW
@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("arch", "cls_name", "config"), _EXPERTS)
def test_fused_experts_match_the_original(
    npu_emulator, isolated_patcher, arch, cls_name, config, dtype, implementation
):
    # Through the experts' own dispatcher, as a model calls them: values, the input's
    # gradient and the stacked weights' gradients.
    module, experts = _experts(arch, cls_name, dtype, implementation, **config)
    x, index, weights = _routing()
    x, weights = x.to(dtype), weights.to(dtype)

    def step():
        experts.zero_grad()
        x_ = x.clone().requires_grad_()
        out = experts(x_, index, weights)
        out.float().square().sum().backward()
        return out.detach(), x_.grad, {n: p.grad.clone() for n, p in experts.named_parameters()}

    expected = step()
    isolated_patcher.add(TransformersSwiGLU).apply()
    actual = step()
    close = _bf16_close if dtype == torch.bfloat16 else torch.testing.assert_close
    close(actual[0], expected[0])
    close(actual[1], expected[1])
    for name, grad in actual[2].items():  # the stacked gate_up_proj and down_proj
        close(grad, expected[2][name], msg=name)
    counters = _counters(isolated_patcher, f"{module.__name__}:{cls_name}._apply_gate")
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


@_NEW
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_gate_matches_the_original(npu_emulator, isolated_patcher, assert_parity, dtype):
    _, experts = _experts("qwen3_moe", "Qwen3MoeExperts", dtype, "grouped_mm", num_experts=4)
    original = type(experts)._apply_gate
    isolated_patcher.add(TransformersSwiGLU).apply()
    patched = type(experts)._apply_gate
    assert patched is not original
    for shape in [(9, 48), (2, 3, 48), (48,)]:
        gate_up = torch.randn(shape, dtype=dtype)
        assert_parity(lambda g: original(experts, g), lambda g: patched(experts, g), gate_up)


@_NEW
def test_experts_outside_the_op_run_the_original(npu_emulator, isolated_patcher):
    module, experts = _experts("qwen3_moe", "Qwen3MoeExperts", torch.float32, "grouped_mm")
    original = type(experts)._apply_gate
    gate_up = torch.randn(5, 96)
    cases = [
        gate_up.double(),  # float64: the op takes fp16/bf16/fp32
        gate_up.t().contiguous().t(),  # not contiguous: the op would need a copy
        gate_up[:, :95],  # an odd width has no halves
    ]
    isolated_patcher.add(TransformersSwiGLU).apply()
    counters = _counters(isolated_patcher, f"{module.__name__}:Qwen3MoeExperts._apply_gate")
    for case in cases[:2]:
        torch.testing.assert_close(experts._apply_gate(case), original(experts, case))
    with pytest.raises(RuntimeError):  # the original's own error
        experts._apply_gate(cases[2])
    experts.act_fn = torch.nn.GELU()  # not a SwiGLU
    torch.testing.assert_close(experts._apply_gate(gate_up), original(experts, gate_up))
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 4)


@_NEW
def test_eager_experts_loop_is_not_served(npu_emulator, isolated_patcher):
    # experts_implementation="eager" runs the class's own loop, whose gate is inline.
    module, experts = _experts("qwen3_moe", "Qwen3MoeExperts", torch.float32, "eager")
    x, index, weights = _routing()
    expected = experts(x, index, weights)
    isolated_patcher.add(TransformersSwiGLU).apply()
    torch.testing.assert_close(experts(x, index, weights), expected, rtol=0, atol=0)
    counters = _counters(isolated_patcher, f"{module.__name__}:Qwen3MoeExperts._apply_gate")
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 0)


@_NEW
def test_experts_without_a_gate_are_not_matched():
    # NemotronH's experts are declared @use_experts_implementation(has_gate=False): the
    # decorator still puts the default _apply_gate on the class, but no path calls it, so
    # a patch there would be reported while never running.
    try:
        nemotron_h = importlib.import_module("transformers.models.nemotron_h.modeling_nemotron_h")
    except ImportError:
        pytest.skip("no NemotronH in this transformers")
    assert "_apply_gate" in vars(nemotron_h.NemotronHExperts)
    assert [p.target for p in swiglu_hook(nemotron_h) if "Experts" in p.target] == []


def test_clamped_gates_are_not_matched():
    # GPT-OSS clamps its gate and adds 1 to up: another formula (4.55 and newer).
    try:
        gpt_oss = importlib.import_module("transformers.models.gpt_oss.modeling_gpt_oss")
    except ImportError:
        pytest.skip("no GPT-OSS in this transformers")
    assert list(swiglu_hook(gpt_oss)) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama4_stacked_experts_match(npu_emulator, isolated_patcher, assert_parity, dtype):
    # Llama-4's experts multiply stacked weights with bmm, in every supported version.
    from transformers import Llama4TextConfig

    module = importlib.import_module("transformers.models.llama4.modeling_llama4")
    cfg = Llama4TextConfig(hidden_size=32, intermediate_size=24, num_local_experts=3)
    torch.manual_seed(0)
    experts = module.Llama4TextExperts(cfg)
    for param in experts.parameters():
        torch.nn.init.normal_(param, std=0.2)
    experts.to(dtype)
    original = type(experts).forward
    isolated_patcher.add(TransformersSwiGLU).apply()
    x = torch.randn(3 * 5, 32, dtype=dtype)  # tokens already sorted per expert
    assert_parity(lambda x: original(experts, x), lambda x: type(experts).forward(experts, x), x)
    counters = _counters(isolated_patcher, f"{module.__name__}:Llama4TextExperts.forward")
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


@pytest.mark.skipif(transformers_version() >= (5,), reason="5.x: MixtralExperts (above)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixtral_4x_experts_match(npu_emulator, isolated_patcher, assert_parity, dtype):
    # 4.x: one module per expert, the projections named w1 (gate), w3 (up), w2 (down).
    module, mlp = _mlp("mixtral", "MixtralBlockSparseTop2MLP", dtype)
    original = type(mlp).forward
    isolated_patcher.add(TransformersSwiGLU).apply()
    x = torch.randn(6, 32, dtype=dtype)
    assert_parity(lambda x: original(mlp, x), lambda x: type(mlp).forward(mlp, x), x)
    counters = _counters(isolated_patcher, f"{module.__name__}:MixtralBlockSparseTop2MLP.forward")
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_projection_outputs_reach_the_op_contiguous(
    npu_emulator, isolated_patcher, assert_parity, dtype
):
    # npu_swiglu takes contiguous inputs only. A LoRA or quantized layer in a projection's
    # place may return a strided tensor, seen only once computed: the fused (Phi-3) and
    # stacked (Llama-4) forwards copy it then, and still match the original.
    from op_envelope import OpEnvelope
    from op_envelope import StridedResults
    from transformers import Llama4TextConfig

    _, phi3 = _mlp("phi3", "Phi3MLP", dtype)
    llama4 = importlib.import_module("transformers.models.llama4.modeling_llama4")
    cfg = Llama4TextConfig(hidden_size=32, intermediate_size=24, num_local_experts=3)
    experts = llama4.Llama4TextExperts(cfg)
    for param in experts.parameters():
        torch.nn.init.normal_(param, std=0.2)
    experts.to(dtype)
    originals = [(phi3, type(phi3).forward), (experts, type(experts).forward)]
    isolated_patcher.add(TransformersSwiGLU).apply()
    for module, original in originals:
        x = torch.randn(3 * 4, 32, dtype=dtype)
        with StridedResults(), OpEnvelope() as envelope:
            assert_parity(functools.partial(original, module), module.forward, x)
        (call,) = envelope.of("npu_swiglu")
        assert call.violations == (), call
