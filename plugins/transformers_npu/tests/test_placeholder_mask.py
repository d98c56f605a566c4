"""PlaceholderMaskCount: get_placeholder_mask counts the mask instead of gathering the embeddings.

Every installed modeling module whose ``get_placeholder_mask`` gathers
(``inputs_embeds[mask].numel()``) is checked against its original with the same inputs:
the masks it returns (values, shapes, dtypes) and the ``ValueError`` it raises (text and
condition) are the same, for matching and mismatching feature counts, through
``input_ids`` and through ``inputs_embeds``; and the rewrite runs no gather (no
``index``/``nonzero`` op). A method that counts already (5.x's vision-language models)
gets a ``skipped`` record saying so; so does one whose file was edited after import.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from hf_stacks import require_module
from hf_stacks import transformers_version


transformers = require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import PlaceholderMaskCount  # noqa: E402
from ascend_patch_transformers.placeholder_mask import counting_twin  # noqa: E402
from ascend_patch_transformers.placeholder_mask import placeholder_mask_hook  # noqa: E402
from ascend_patch_transformers.placeholder_mask import selected_numel  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ascend_patch_core import SkipPatch  # noqa: E402


HIDDEN = 8
IMAGE, VIDEO, AUDIO = 5, 6, 7


def _gathering_modules():
    """Installed modeling modules with a ``get_placeholder_mask`` and a ``[...].numel()`` in them."""
    models = Path(transformers.__file__).parent / "models"
    names = []
    for path in sorted(models.glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        if "def get_placeholder_mask" in text and "].numel()" in text:
            names.append(f"transformers.models.{path.parent.name}.{path.stem}")
    return names


def _served(module):
    """``{class name: patch}`` for the classes whose method the hook rewrites."""
    return {
        p.target.rpartition(":")[2].partition(".")[0]: p
        for p in placeholder_mask_hook(module)
        if p.precheck is None
    }


def _model_stub():
    """What the methods read from ``self``: the token ids and the input embeddings."""
    torch.manual_seed(0)
    embeddings = torch.nn.Embedding(16, HIDDEN)
    config = SimpleNamespace(image_token_id=IMAGE, video_token_id=VIDEO, audio_token_id=AUDIO)
    return SimpleNamespace(
        config=config,
        get_input_embeddings=lambda: embeddings,
        vocabulary_mapping=SimpleNamespace(image_token_id=IMAGE),
    )


def _outcome(function, *args, **kwargs):
    try:
        return "returned", function(*args, **kwargs)
    except Exception as exc:  # the same exception, with the same text, is what is compared
        return type(exc).__name__, str(exc)


def _assert_same(expected, got, where):
    assert expected[0] == got[0], (where, expected, got)
    if expected[0] != "returned":
        assert expected[1] == got[1], where  # the same error text
        return
    flat_expected = expected[1] if isinstance(expected[1], tuple) else (expected[1],)
    flat_got = got[1] if isinstance(got[1], tuple) else (got[1],)
    assert len(flat_expected) == len(flat_got), where
    for e, g in zip(flat_expected, flat_got, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype and g.stride() == e.stride(), where
        assert torch.equal(g, e), where


def _cases(function, stub):
    """Calls covering both paths (ids, embeddings) and matching and mismatching counts."""
    ids = torch.tensor([[1, IMAGE, IMAGE, VIDEO, 2, IMAGE], [AUDIO, IMAGE, VIDEO, 3, 4, 1]])
    parameters = inspect.signature(function).parameters
    features = [p for p in parameters if p.endswith("features")]
    for through_ids, counts in itertools.product(
        (True, False), itertools.product((None, 1, 2, 4, 5), repeat=len(features))
    ):
        embeds = stub.get_input_embeddings()(ids).detach()
        kwargs = {"inputs_embeds": embeds}
        if "token_id" in parameters:  # 5.x's one-modality-per-call form
            kwargs["token_id"] = IMAGE
        for name, count in zip(features, counts, strict=True):
            kwargs[name] = None if count is None else torch.randn(count, HIDDEN)
        yield (ids if through_ids else None), kwargs


@pytest.mark.parametrize("module_name", _gathering_modules())
def test_rewrite_returns_and_raises_as_the_original(module_name):
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # a model's optional dependency missing here
        pytest.skip(f"{module_name}: {exc}")
    served = _served(module)
    stub = _model_stub()
    for class_name, patch in served.items():
        original = getattr(module, class_name).get_placeholder_mask
        returned = refused = 0
        for input_ids, kwargs in _cases(original, stub):
            expected = _outcome(original, stub, input_ids, **kwargs)
            got = _outcome(patch.replacement, stub, input_ids, **kwargs)
            _assert_same(expected, got, (class_name, input_ids is None, kwargs.keys()))
            returned += expected[0] == "returned"
            refused += expected[0] == "ValueError"
        assert returned, f"{class_name}: no call returned; the stub does not fit this model"
        assert refused, f"{class_name}: no mismatch was refused"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(transformers_version() < (4, 57), reason="no get_placeholder_mask before 4.52")
def test_the_rewrite_gathers_nothing():
    module = importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")
    found = _served(module)
    if transformers_version() >= (5,):
        assert found == {}  # 5.x counts already
        return
    patch = found["Qwen2VLModel"]
    stub = _model_stub()
    ids = torch.tensor([[1, IMAGE, IMAGE, 2]])
    embeds = stub.get_input_embeddings()(ids).detach()
    features = torch.randn(2, HIDDEN)
    for function, gathers in (
        (module.Qwen2VLModel.get_placeholder_mask, True),
        (patch.replacement, False),
    ):
        with _Ops() as ops:
            function(stub, ids, inputs_embeds=embeds, image_features=features)
        assert any(op in ("aten.index", "aten.nonzero") for op in ops.seen) is gathers, ops.seen


def test_selected_numel_is_the_gathered_numel():
    values = torch.randn(2, 3, 4)
    token_mask = torch.tensor([[True, False, True], [False, False, True]])
    for mask in (
        token_mask.unsqueeze(-1).expand_as(values),  # expanded: one column counted
        torch.rand(2, 3, 4) > 0.5,  # a full boolean mask
        token_mask,  # a mask of fewer dims: the gather itself
        torch.zeros(2, 3, 4, dtype=torch.bool),
    ):
        assert selected_numel(values, mask) == values[mask].numel()
    with pytest.raises(IndexError):
        selected_numel(values, torch.ones(3, 3, dtype=torch.bool))  # as the gather does


def _record(patcher, target):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record


@pytest.mark.skipif(transformers_version() < (4, 57), reason="no get_placeholder_mask before 4.52")
def test_group_serves_npu_calls_or_says_why_not(npu_emulator, isolated_patcher):
    module = importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")
    target = "transformers.models.qwen2_vl.modeling_qwen2_vl:Qwen2VLModel.get_placeholder_mask"
    original = module.Qwen2VLModel.get_placeholder_mask
    isolated_patcher.add(PlaceholderMaskCount).apply()
    record = _record(isolated_patcher, target)
    if transformers_version() >= (5,):
        assert record.status.value == "skipped"
        assert "no boolean-index gather" in record.reason
        assert module.Qwen2VLModel.get_placeholder_mask is original
        return
    assert record.status.value == "applied"
    stub = _model_stub()
    ids = torch.tensor([[1, IMAGE, IMAGE, 2]])
    embeds = stub.get_input_embeddings()(ids).detach()
    image_mask, _ = module.Qwen2VLModel.get_placeholder_mask(
        stub, ids, inputs_embeds=embeds, image_features=torch.randn(2, HIDDEN)
    )
    assert image_mask.shape == embeds.shape and int(image_mask.sum()) == 2 * HIDDEN
    with pytest.raises(ValueError, match="tokens: 2, features 3"):
        module.Qwen2VLModel.get_placeholder_mask(
            stub, ids, inputs_embeds=embeds, image_features=torch.randn(3, HIDDEN)
        )
    assert (record.counters.replacement_calls, record.counters.fallback_calls) == (2, 0)
    isolated_patcher.revert()
    assert module.Qwen2VLModel.get_placeholder_mask is original


@pytest.mark.skipif(
    transformers_version() >= (5,) or transformers_version() < (4, 57), reason="4.57"
)
def test_runtime_check_sends_cpu_tensors_to_the_original():
    # Outside the emulator a CPU tensor is not an NPU tensor.
    module = importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")
    patch = _served(module)["Qwen2VLModel"]
    embeds = torch.zeros(1, 4, HIDDEN)
    assert patch.runtime_check(None, None, inputs_embeds=embeds) is False
    assert patch.runtime_check(None, None, embeds) is False


@pytest.mark.skipif(transformers_version() >= (4, 52), reason="4.51 only")
def test_451_has_no_placeholder_mask_method():
    # 4.51's models check the counts inside forward; nothing for this group there.
    module = importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")
    assert list(placeholder_mask_hook(module)) == []


_SYNTHETIC = """
    import torch


    class TinyModel:
        def forward(self, input_ids):  # modeling modules are read where they have a forward
            return input_ids

        def get_placeholder_mask(self, input_ids, inputs_embeds, image_features):
            \"\"\"Docstring
                with an indented line.\"\"\"
            mask = (input_ids == 5).unsqueeze(-1).expand_as(inputs_embeds)
            if inputs_embeds[mask].numel() != image_features.numel():
                raise ValueError(f"tokens {int(mask.sum())} for {TinyModel.__name__}")
            return mask
"""


def test_a_source_edited_after_import_is_skipped(tmp_path, monkeypatch):
    # The method is recompiled from its file only when the unchanged file compiles to the
    # loaded code: a file edited after import (a reinstall under a running process) is not.
    name = "apx_tiny_placeholder_model"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(_SYNTHETIC))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # removed again at teardown
    original = module.TinyModel.__dict__["get_placeholder_mask"]
    twin, parameter = counting_twin(original)
    ids = torch.tensor([[1, 5, 5]])
    embeds = torch.zeros(1, 3, HIDDEN)
    for features in (torch.zeros(2, HIDDEN), torch.zeros(3, HIDDEN)):
        _assert_same(
            _outcome(original, None, ids, embeds, features),
            _outcome(twin, None, ids, embeds, features),
            features.shape,
        )
    assert parameter == "inputs_embeds" and twin.__doc__ == original.__doc__
    path.write_text(path.read_text().replace("tokens {", "image tokens {"))
    reason = counting_twin(original)
    assert isinstance(reason, str) and "does not match the loaded code" in reason
    (patch,) = placeholder_mask_hook(module)
    with pytest.raises(SkipPatch, match="does not match the loaded code"):
        patch.precheck()
