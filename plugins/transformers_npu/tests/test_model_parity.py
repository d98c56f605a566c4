"""Tiny random models with the norms-family groups: same logits, loss, gradients and tokens.

Models are built from configs (no download): vocab 128, hidden 64, 2 layers, 4 heads,
2 key/value heads. Each is run unpatched first (under the emulator every CPU tensor is
an NPU tensor, so the reference must come before ``apply()``), then with
TransformersRMSNorm, TransformersRotary and TransformersSwiGLU applied, and the report's
counters must show that each family's NPU op served the calls where it applies.

Tolerances (float32 weights and activations): logits and loss rtol 1e-5 / atol 1e-5,
parameter gradients rtol 1e-4 / atol 1e-5 -- the kernels compute the same formulas in
another association order, so only the last bits may move; greedy tokens exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hf_stacks import require_module
from hf_stacks import transformers_version


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups_norms import GROUPS  # noqa: E402
from transformers import AutoConfig  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


_TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
_EXTRA = {
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    "gemma": {"head_dim": 16},
    # Phi-3 with half of each head rotated: the partial rotary path (pad id inside the vocab).
    "phi3": {"partial_rotary_factor": 0.5, "pad_token_id": 0},
}


def _swiglu_applies(arch):
    # Gemma's MLP is a GeGLU (tanh GELU): it runs the original. Qwen3-MoE's experts are
    # Qwen3MoeMLP modules in 4.x (their forward is served) and one stacked-weights module
    # in 5.x (Qwen3MoeExperts; its grouped_mm path's _apply_gate is served).
    return arch != "gemma"


def _swiglu_target(arch):
    """The SwiGLU target a model's MLPs go through (checked by name in the parity test)."""
    if arch == "qwen3_moe" and transformers_version() >= (5,):
        return "Qwen3MoeExperts._apply_gate"
    return None


def _build(arch, attn):
    config = AutoConfig.for_model(arch, **_TINY, **_EXTRA.get(arch, {}))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).float()
    model.generation_config.pad_token_id = 0
    return model


def _step(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def _family_calls(report, arch):
    """``{family: (replacement calls, fallback calls)}`` for this model's modeling module."""
    module = f"transformers.models.{arch}.modeling_{arch}:"
    calls = {}
    for record in report.records:
        if not record.name.startswith(module) or record.counters is None:
            continue
        family = (
            "rotary"
            if record.name.endswith("apply_rotary_pos_emb")
            else "rms_norm"
            if "RMSNorm" in record.name
            else "swiglu"
        )
        served, fell = calls.get(family, (0, 0))
        calls[family] = (
            served + record.counters.replacement_calls,
            fell + record.counters.fallback_calls,
        )
    return calls


def _counters(report, arch, target):
    (record,) = [
        r
        for r in report.records
        if r.name == f"transformers.models.{arch}.modeling_{arch}:{target}"
    ]
    return record.counters


_CASES = [
    pytest.param(arch, attn, marks=() if arch == "qwen3" else pytest.mark.slow)
    for arch in ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "gemma", "phi3")
    for attn in ("eager", "sdpa")
]


@pytest.mark.parametrize(("arch", "attn"), _CASES)
def test_tiny_model_parity(npu_emulator, isolated_patcher, arch, attn):
    model = _build(arch, attn)
    torch.manual_seed(1)
    ids = torch.randint(1, 128, (2, 9))
    prompt = ids[:1, :5]
    expected = _step(model, ids)
    expected_tokens = model.generate(prompt, max_new_tokens=4, do_sample=False)

    for group in GROUPS:
        isolated_patcher.add(group)
    isolated_patcher.apply()
    logits, loss, grads = _step(model, ids)
    tokens = model.generate(prompt, max_new_tokens=4, do_sample=False)

    torch.testing.assert_close(logits, expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, expected[1], rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected[2].keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[2][name], rtol=1e-4, atol=1e-5, msg=name)
    assert torch.equal(tokens, expected_tokens)

    calls = _family_calls(isolated_patcher.report, arch)
    # RMSNorm: Gemma's too (its 1 + weight formula). Rotary: every one of these models.
    assert calls["rms_norm"][0] > 0 and calls["rms_norm"][1] == 0
    assert calls["rotary"][0] > 0 and calls["rotary"][1] == 0
    if _swiglu_applies(arch):
        assert calls["swiglu"][0] > 0 and calls["swiglu"][1] == 0
    else:
        assert calls.get("swiglu", (0, 0))[0] == 0
    target = _swiglu_target(arch)
    if target is not None:
        counters = _counters(isolated_patcher.report, arch, target)
        assert counters.replacement_calls > 0 and counters.fallback_calls == 0


_SCRIPT = shutil.which("ascend-patch", path=str(Path(sys.executable).parent))
_CLI = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "ascend_patch_core._cli"]

_PROGRAM = """
import torch
from transformers import AutoConfig, AutoModelForCausalLM

config = AutoConfig.for_model(
    "qwen3", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
)
model = AutoModelForCausalLM.from_config(config).to("npu")
ids = torch.randint(0, 128, (1, 6), device="npu")
model(input_ids=ids, labels=ids).loss.backward()
"""


def _run(tmp_path: Path, *options: str) -> dict[str, dict]:
    (tmp_path / "tiny_qwen3.py").write_text(textwrap.dedent(_PROGRAM))
    report = tmp_path / "report.json"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("ASCEND_PATCH_ENABLE", None)
    done = subprocess.run(
        [
            *_CLI,
            "run",
            "--emulate-npu",
            *options,
            "--report",
            str(report),
            str(tmp_path / "tiny_qwen3.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (process,) = json.loads(report.read_text())["processes"]
    return {r["name"]: r for r in process["report"]["records"]}


@pytest.mark.slow
def test_cli_qwen3_takes_the_npu_paths_when_enabled(tmp_path):
    """The reference's Qwen3 items, the way a user runs them: ``ascend-patch run --enable``."""
    records = _run(
        tmp_path, "--enable", "TransformersRMSNorm,TransformersRotary,TransformersSwiGLU"
    )
    module = "transformers.models.qwen3.modeling_qwen3:"
    # Per forward of a 2-layer Qwen3: 9 RMSNorms (2 per layer, q_norm and k_norm, the final
    # norm), one rotary and one MLP per layer.
    for target, calls in (
        ("Qwen3RMSNorm.forward", 9),
        ("apply_rotary_pos_emb", 2),
        ("Qwen3MLP.forward", 2),
    ):
        counters = records[module + target]["counters"]
        assert counters == {"replacement_calls": calls, "fallback_calls": 0}, target


@pytest.mark.slow
def test_cli_groups_are_opt_in(tmp_path):
    records = _run(tmp_path)
    for group in ("TransformersRMSNorm", "TransformersRotary", "TransformersSwiGLU"):
        assert records[group]["status"] == "skipped"
        assert records[group]["reason"].startswith("opt-in")
    assert not any(name.startswith("transformers.models.qwen3") for name in records)


def test_apply_imports_neither_transformers_nor_torch():
    script = (
        "import sys, ascend_patch_core; ascend_patch_core.apply(enable='TransformersRMSNorm,"
        "TransformersRotary,TransformersSwiGLU'); print('transformers' in sys.modules, "
        "'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert done.stdout.split() == ["False", "False"], done.stderr
