"""A tiny random-weight Qwen3-VL (text and vision) with the NPU paths: same logits, loss, gradients, tokens.

The reference's Qwen3-VL items: the text RMSNorm (``Qwen3VLTextRMSNorm``, the standard
formula: TransformersRMSNorm), the vision rotary (``apply_rotary_pos_emb_vision``:
TransformersRotary, with the text ``apply_rotary_pos_emb``) and
``Qwen3VLModel.get_placeholder_mask`` (PlaceholderMaskCount; in 5.x it counts already
and its record says so). The model is built from a config (no download): the text
model of the other parity tests (vocab 128, hidden 64, 2 layers, 4 heads, 2 key/value
heads, head dim 16) and a 2-block vision tower (hidden 32, 2 heads, patch 4, spatial
merge 2, temporal patch 2). One 16x16 image (a 4x4 patch grid, ``image_grid_thw``
``[1, 4, 4]``) becomes 16 patch rows of 3*2*4*4 values and 16 / 2**2 = 4 merged
features, so the prompt holds 4 image tokens between vision start and end tokens.

Run unpatched first (under the emulator every CPU tensor is an NPU tensor), then with
the groups applied. Tolerances as the text models' (float32): logits and loss rtol 1e-5 /
atol 1e-5, parameter gradients rtol 1e-4 / atol 1e-5; greedy tokens exactly.
Qwen3-VL does not exist in transformers 4.51: the module is skipped there.
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace

import pytest
from hf_stacks import require_module
from hf_stacks import run_emulated
from hf_stacks import transformers_version


require_module("transformers")
pytest.importorskip(
    "transformers.models.qwen3_vl.modeling_qwen3_vl", reason="Qwen3-VL is absent (4.51)"
)

import torch  # noqa: E402
from ascend_patch_transformers.groups import NORMS_GROUPS as NORM_GROUPS  # noqa: E402
from ascend_patch_transformers.groups import PlaceholderMaskCount  # noqa: E402
from test_model_parity import _TINY  # noqa: E402
from transformers import Qwen3VLConfig  # noqa: E402
from transformers import Qwen3VLForConditionalGeneration  # noqa: E402


MODULE = "transformers.models.qwen3_vl.modeling_qwen3_vl"
IMAGE, VIDEO, VISION_START, VISION_END = 120, 121, 122, 123
GRID = ((1, 4, 4),)  # one image: 1 frame of 4 x 4 patches
PATCH_VALUES = 3 * 2 * 4 * 4  # channels x temporal patch x patch x patch
IMAGE_TOKENS = 4  # 16 patches merged 2 x 2


def _config():
    rope = {"rope_type": "default", "mrope_section": [4, 2, 2]}  # sums to head_dim / 2
    text = {**_TINY, "head_dim": 16, "max_position_embeddings": 256}
    if transformers_version() >= (5,):
        text["rope_parameters"] = {**rope, "rope_theta": 10000.0}
    else:
        text["rope_scaling"] = rope
        text["rope_theta"] = 10000.0
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": _TINY["hidden_size"],
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0],
    }
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )


def _build(attn):
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration._from_config(_config(), attn_implementation=attn)
    model = model.float()
    model.generation_config.pad_token_id = 0
    return model


def _inputs(model, text_only=False):
    torch.manual_seed(1)
    image = [VISION_START, *[IMAGE] * IMAGE_TOKENS, VISION_END]
    ids = torch.tensor([[1, 2, *([] if text_only else image), 5, 6, 7, 9]])
    if text_only:
        return {"input_ids": ids}
    inputs = {
        "input_ids": ids,
        "pixel_values": torch.randn(16, PATCH_VALUES),
        "image_grid_thw": torch.tensor(GRID),
    }
    if "mm_token_type_ids" in inspect.signature(model.model.forward).parameters:
        # 5.x: the processor's per-token modality (1 image, 2 video) for the 3-D rope.
        inputs["mm_token_type_ids"] = (ids == IMAGE).int() + 2 * (ids == VIDEO).int()
    return inputs


def _step(model, inputs):
    model.zero_grad()
    out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def _generate(model, inputs):
    return model.generate(**inputs, max_new_tokens=4, do_sample=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("family", "cls_name"),
    [("qwen3_vl", "Qwen3VLTextRMSNorm"), ("qwen3_vl_moe", "Qwen3VLMoeTextRMSNorm")],
)
def test_text_rms_norm_is_served_with_the_original_numbers(
    npu_emulator, isolated_patcher, assert_parity, family, cls_name, dtype
):
    """The reference's Qwen3VLTextRMSNorm item: the standard formula, found by TransformersRMSNorm."""
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = getattr(module, cls_name)
    torch.manual_seed(1)
    norm = cls(64, eps=1e-6).to(dtype)
    assert norm.variance_epsilon == 1e-6
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.5 + 1)
    original = cls.forward
    isolated_patcher.add(*NORM_GROUPS).apply()
    assert cls.forward is not original
    for shape in ((5, 64), (2, 7, 64)):
        x = torch.randn(shape, dtype=dtype) * 3
        # Values, and gradients of the input and (float32) of the weight. A bfloat16
        # weight's gradient is a sum over rows that the eager code rounds in bfloat16 at
        # each step and the kernel once: one ulp apart, the original's own error.
        weight = norm.weight.detach()
        if dtype == torch.float32:
            assert_parity(
                lambda x, w: original(SimpleNamespace(weight=w, variance_epsilon=1e-6), x),
                lambda x, w: cls.forward(SimpleNamespace(weight=w, variance_epsilon=1e-6), x),
                x,
                weight,
            )
        else:
            assert_parity(lambda x: original(norm, x), lambda x: cls.forward(norm, x), x)
    (record,) = [
        r for r in isolated_patcher.report.records if r.name.endswith(cls_name + ".forward")
    ]
    assert (record.counters.replacement_calls, record.counters.fallback_calls) == (2, 0)


def _record(report, target):
    (record,) = [r for r in report.records if r.name == f"{MODULE}:{target}"]
    return record


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tiny_qwen3_vl_parity(npu_emulator, isolated_patcher, attn):
    model = _build(attn)
    inputs = _inputs(model)
    text_inputs = _inputs(model, text_only=True)
    expected = _step(model, inputs)
    expected_tokens = _generate(model, inputs)
    expected_text_tokens = _generate(model, text_inputs)

    for group in (*NORM_GROUPS, PlaceholderMaskCount):
        isolated_patcher.add(group)
    isolated_patcher.apply()
    logits, loss, grads = _step(model, inputs)
    tokens = _generate(model, inputs)
    text_tokens = _generate(model, text_inputs)

    torch.testing.assert_close(logits, expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, expected[1], rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected[2].keys()
    assert any(name.startswith("model.visual.") for name in grads)  # the tower learns too
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[2][name], rtol=1e-4, atol=1e-5, msg=name)
    assert torch.equal(tokens, expected_tokens)
    assert torch.equal(text_tokens, expected_text_tokens)

    report = isolated_patcher.report
    for target in (
        "apply_rotary_pos_emb_vision",  # the vision tower: one per block
        "apply_rotary_pos_emb",  # the text model: one per layer
        "Qwen3VLTextRMSNorm.forward",
        "Qwen3VLTextMLP.forward",
    ):
        counters = _record(report, target).counters
        assert counters.replacement_calls > 0 and counters.fallback_calls == 0, target
    mask = _record(report, "Qwen3VLModel.get_placeholder_mask")
    if transformers_version() >= (5,):
        # 5.x counts the mask itself: nothing to do, and the record says why.
        assert mask.status.value == "skipped"
        assert "no boolean-index gather" in mask.reason
    else:
        # One call per forward with pixels: the training step and generate's prefill.
        assert mask.counters.replacement_calls >= 2 and mask.counters.fallback_calls == 0


def test_vision_rotary_calls_per_forward(npu_emulator, isolated_patcher):
    """Each vision block rotates once, each text layer once: counted exactly."""
    model = _build("sdpa")
    inputs = _inputs(model)
    isolated_patcher.add(*NORM_GROUPS).apply()
    with torch.no_grad():
        model(**inputs)
    report = isolated_patcher.report
    vision = _record(report, "apply_rotary_pos_emb_vision").counters
    text = _record(report, "apply_rotary_pos_emb").counters
    norms = _record(report, "Qwen3VLTextRMSNorm.forward").counters
    assert (vision.replacement_calls, vision.fallback_calls) == (2, 0)
    assert (text.replacement_calls, text.fallback_calls) == (2, 0)
    # 2 per layer, q_norm and k_norm per layer, and the final norm.
    assert (norms.replacement_calls, norms.fallback_calls) == (9, 0)


def test_placeholder_mismatch_raises_as_the_original(npu_emulator, isolated_patcher):
    """Too few image tokens for the features: the original's ValueError, from the rewrite."""
    model = _build("eager")
    inputs = _inputs(model)
    ids = inputs["input_ids"].clone()
    ids[0, 3] = 2  # one image token fewer than the 4 features
    inputs["input_ids"] = ids
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = (ids == IMAGE).int()
    with pytest.raises(ValueError) as expected, torch.no_grad():
        model(**inputs)
    isolated_patcher.add(PlaceholderMaskCount).apply()
    with pytest.raises(ValueError) as got, torch.no_grad():
        model(**inputs)
    assert str(got.value) == str(expected.value)
    mask = _record(isolated_patcher.report, "Qwen3VLModel.get_placeholder_mask")
    if transformers_version() < (5,):
        assert mask.counters.replacement_calls == 1


_PROGRAM = """
import inspect
import torch
import transformers
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

rope = {"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 10000.0}
text = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
)
if int(transformers.__version__.split(".")[0]) >= 5:
    text["rope_parameters"] = rope
else:
    text["rope_theta"] = rope.pop("rope_theta")
    text["rope_scaling"] = rope
vision = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
    num_position_embeddings=16, deepstack_visual_indexes=[0],
)
config = Qwen3VLConfig(
    text_config=text, vision_config=vision, image_token_id=120, video_token_id=121,
    vision_start_token_id=122, vision_end_token_id=123,
)
model = Qwen3VLForConditionalGeneration._from_config(config).to("npu")
ids = torch.tensor([[1, 2, 122, 120, 120, 120, 120, 123, 5, 6]], device="npu")
inputs = dict(
    input_ids=ids,
    pixel_values=torch.randn(16, 96, device="npu"),
    image_grid_thw=torch.tensor([[1, 4, 4]], device="npu"),
)
if "mm_token_type_ids" in inspect.signature(model.model.forward).parameters:
    inputs["mm_token_type_ids"] = (ids == 120).int()
model(**inputs, labels=ids).loss.backward()
"""


@pytest.mark.slow
def test_cli_qwen3_vl_takes_the_npu_paths(tmp_path):
    """The way a user runs it: ``ascend-patch run --emulate-npu --enable ...`` on a script."""
    records = run_emulated(
        tmp_path,
        "tiny_qwen3_vl.py",
        _PROGRAM,
        "--enable",
        "TransformersRMSNorm,TransformersRotary",
    )
    for target, calls in (
        ("apply_rotary_pos_emb_vision", 2),  # one per vision block
        ("apply_rotary_pos_emb", 2),  # one per text layer
        ("Qwen3VLTextRMSNorm.forward", 9),
    ):
        counters = records[f"{MODULE}:{target}"]["counters"]
        assert counters == {"replacement_calls": calls, "fallback_calls": 0}, target
    # PlaceholderMaskCount is a default group: no --enable needed.
    mask = records[f"{MODULE}:Qwen3VLModel.get_placeholder_mask"]
    if transformers_version() >= (5,):
        assert mask["status"] == "skipped" and "no boolean-index gather" in mask["reason"]
    else:
        assert mask["status"] == "applied"
        assert mask["counters"] == {"replacement_calls": 1, "fallback_calls": 0}
