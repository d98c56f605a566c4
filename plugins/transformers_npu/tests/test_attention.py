"""attn_implementation="npu": tiny random models equal their sdpa and eager twins under the emulator.

Each test builds the unpatched reference first (under the emulator every tensor counts as
an NPU tensor, so the reference must run before ``apply()``), then the same weights with
``attn_implementation="npu"``, and compares logits at the real tokens (a padded row's own
output is undefined in every implementation), the loss, every parameter's gradient, and
greedy ``generate()``. The report's counters prove npu_fusion_attention served the calls.
"""

from __future__ import annotations

import pytest
from hf_stacks import require_module


transformers = require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.attention_kernels import IMPLEMENTATION  # noqa: E402
from ascend_patch_transformers.groups import NpuAttention  # noqa: E402
from ascend_patch_transformers.groups import import_rules  # noqa: E402


FUSED = "ascend_patch_transformers.attention_kernels:npu_attention_forward"


@pytest.fixture(autouse=True)
def _rules(npu_emulator, isolated_patcher):
    """The plugin's import rules from the start, as under ``ascend-patch run``.

    (transformers 4.51 without einops imports no model module on an NPU without them.)
    """
    isolated_patcher.add(*import_rules())


LAYERS = 2

CONFIGS = {
    "llama": {},
    "qwen3": {"head_dim": 16},
    "mistral": {},
    # a window shorter than the sequences: the masks carry it
    "mistral-window": {"sliding_window": 4},
}


def _config(name):
    return transformers.AutoConfig.for_model(
        name.split("-")[0],
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: two query heads per key/value head
        **CONFIGS[name],
    )


def _model(cfg, implementation, state=None):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation)
    if state is not None:
        model.load_state_dict(state)
    return model


def _batch(side="right"):
    """Three sequences of different lengths, padded on ``side``.

    Training pads on the right; generation on the left, where a padded row attends to no
    token at all and its output differs between implementations (eager averages, the
    fused kernels give 0): no real token reads it, and no label is predicted from it.
    """
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    for row, pad in ((1, 4), (2, 2)):
        if side == "right":
            mask[row, ids.shape[1] - pad :] = 0
        else:
            mask[row, :pad] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def _run(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach()[mask.bool()], out.loss.detach(), grads


def _generate(model, ids, mask):
    with torch.no_grad():
        return model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
        )


def _counters(patcher):
    counters = patcher.report.get(FUSED).counters
    return counters.replacement_calls, counters.fallback_calls


@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("baseline", ["sdpa", "eager"])
def test_npu_attention_matches_the_baseline(arch, baseline, npu_emulator, isolated_patcher):
    cfg = _config(arch)
    ids, mask, labels = _batch()
    reference = _model(cfg, baseline)
    ref_logits, ref_loss, ref_grads = _run(reference, ids, mask, labels)
    prompts, prompt_mask, _ = _batch("left")
    ref_tokens = _generate(reference, prompts, prompt_mask)

    isolated_patcher.add(NpuAttention).apply()
    model = _model(cfg, IMPLEMENTATION, reference.state_dict())
    logits, loss, grads = _run(model, ids, mask, labels)

    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(loss, ref_loss, atol=2e-6, rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=2e-5, rtol=1e-4, msg=name)
    assert _counters(isolated_patcher) == (LAYERS, 0)

    tokens = _generate(model, prompts, prompt_mask)
    assert torch.equal(tokens, ref_tokens)
    fused, fallback = _counters(isolated_patcher)
    assert fused >= LAYERS * 5 and fallback == 0  # prefill and 4 decoding steps, every layer


def test_causal_without_padding_uses_the_compressed_mask(npu_emulator, isolated_patcher):
    """No padding: transformers passes no mask and the op runs top-left causal (sparse_mode 2)."""
    cfg = _config("llama")
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(3))
    reference = _model(cfg, "eager")
    with torch.no_grad():
        expected = reference(input_ids=ids).logits

    isolated_patcher.add(NpuAttention).apply()
    model = _model(cfg, IMPLEMENTATION, reference.state_dict())
    with torch.no_grad():
        logits = model(input_ids=ids).logits

    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-4)
    assert _counters(isolated_patcher) == (LAYERS, 0)


def test_attention_weights_fall_back_to_eager(npu_emulator, isolated_patcher):
    """output_attentions=True: the op returns no weights, so the layers run eager attention."""
    cfg = _config("llama")
    ids, mask, _ = _batch("left")
    reference = _model(cfg, "eager")
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, output_attentions=True)

    isolated_patcher.add(NpuAttention).apply()
    model = _model(cfg, IMPLEMENTATION, reference.state_dict())
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)

    valid = mask.bool()
    torch.testing.assert_close(out.logits[valid], expected.logits[valid], atol=2e-5, rtol=1e-4)
    assert len(out.attentions) == LAYERS
    rows = valid[:, None, :, None]  # the weights of real query tokens
    for got, want in zip(out.attentions, expected.attentions, strict=True):
        torch.testing.assert_close(got * rows, want * rows, atol=2e-6, rtol=1e-4)
    assert _counters(isolated_patcher) == (0, LAYERS)
