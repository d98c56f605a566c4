"""VisionPatchify: the processors' 9/10-dim patchify permutes, done in passes of <= 8 dims.

The results must be bit-identical to the originals (pixel values and grids): the
change moves data in another order of passes, it computes nothing. What the emulator
cannot show is the point of the change, an NPU transpose of more than 8 dims.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from hf_stacks import require_module
from hf_stacks import transformers_version
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


require_module("transformers")

import torch  # noqa: E402
from ascend_patch_transformers.groups import VisionPatchify  # noqa: E402
from ascend_patch_transformers.image_processing import narrow_permute_rewrite  # noqa: E402
from ascend_patch_transformers.image_processing import on_npu  # noqa: E402
from ascend_patch_transformers.image_processing import vision_patchify_hook  # noqa: E402
from ascend_patch_transformers.image_processing import wide_permute_methods  # noqa: E402
from ascend_patch_transformers.narrow_permute import permute_narrow  # noqa: E402
from ascend_patch_transformers.narrow_permute import plan_narrow_permute  # noqa: E402

from ascend_patch_core import SkipPatch  # noqa: E402


# -- the permute itself -------------------------------------------------------------


@st.composite
def _permutations(draw):
    n = draw(st.integers(1, 12))
    shape = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    dims = draw(st.permutations(range(n)))
    return shape, dims, draw(st.integers(4, 8))


@settings(max_examples=300, deadline=None)
@given(_permutations(), st.sampled_from(["contiguous", "permuted view", "strided"]))
def test_permute_narrow_is_permute(case, layout):
    shape, dims, max_dims = case
    x = torch.arange(math.prod(shape)).reshape(shape)
    if layout == "permuted view":  # the same shape over memory in another order
        x = x.flip(0).reshape(shape[::-1]).permute(*reversed(range(len(shape))))
    elif layout == "strided":  # not a permutation of contiguous memory
        x = torch.arange(2 * math.prod(shape)).reshape(*shape[:-1], 2 * shape[-1])[..., ::2]
    y = permute_narrow(x, dims, max_dims)
    assert torch.equal(y, x.permute(dims)) and y.is_contiguous()
    assert all(len(p) <= max_dims for _, p in plan_narrow_permute(shape, dims, max_dims))


def _patchify_10(x, b, t, tp, c, gh, gw, m, p, permute):
    # transformers 4.57's Qwen2-VL patchify: view to 10 dims, permute them all, flatten.
    patches = x.view(b, t, tp, c, gh // m, m, p, gw // m, m, p)
    patches = permute(patches, (0, 1, 4, 7, 5, 8, 3, 2, 6, 9))
    return patches.reshape(b, t * gh * gw, c * tp * p * p)


@st.composite
def _patchify_sizes(draw):
    m = draw(st.integers(1, 3))
    return dict(
        b=draw(st.integers(1, 3)),
        t=draw(st.integers(1, 3)),
        tp=draw(st.integers(1, 3)),
        c=draw(st.integers(1, 4)),
        gh=m * draw(st.integers(1, 3)),
        gw=m * draw(st.integers(1, 3)),
        m=m,
        p=draw(st.integers(1, 5)),
    )


@settings(max_examples=200, deadline=None)
@given(_patchify_sizes(), st.sampled_from([torch.float32, torch.bfloat16, torch.uint8]))
def test_patchify_is_bit_identical(sizes, dtype):
    s = sizes
    numel = s["b"] * s["t"] * s["tp"] * s["c"] * s["gh"] * s["p"] * s["gw"] * s["p"]
    x = (torch.rand(numel) * 255).to(dtype)
    original = _patchify_10(x, **s, permute=lambda t, d: t.permute(d))
    narrow = _patchify_10(x, **s, permute=permute_narrow)
    assert narrow.dtype == original.dtype and torch.equal(narrow, original)
    # Qwen2-VL's shape takes two passes, of 8 and 4 dims at most.
    view = [s["b"], s["t"], s["tp"], s["c"], s["gh"] // s["m"], s["m"], s["p"]]
    view += [s["gw"] // s["m"], s["m"], s["p"]]
    passes = plan_narrow_permute(view, (0, 1, 4, 7, 5, 8, 3, 2, 6, 9))
    assert len(passes) <= 2 and all(len(p) <= 8 for _, p in passes)


def test_permute_narrow_keeps_gradients_and_empty_tensors():
    x = torch.randn(2, 1, 2, 3, 2, 2, 3, 1, 2, 3, requires_grad=True)
    dims = (0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    grad = torch.randn(x.permute(dims).shape)
    (reference,) = torch.autograd.grad(x.permute(dims), x, grad)
    (narrow,) = torch.autograd.grad(permute_narrow(x, dims), x, grad)
    assert torch.equal(reference, narrow)
    empty = torch.zeros(0, 2, 3)
    assert permute_narrow(empty, (2, 0, 1)).shape == (3, 0, 2)
    with pytest.raises(ValueError, match="not a permutation"):
        permute_narrow(x, (0, 1, 2))


# -- the rewrite, on synthetic modules --------------------------------------------------


def _module(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # removed again at teardown
    return module


_SYNTHETIC = """
    import torch

    class Processor:
        def __init__(self):
            self.__scale = 1

        def patchify(self, x):
            '''Docstring
                with an indented line.'''
            y = x.view(1, 1, 1, 2, 1, 2, 1, 2, 1, 2)
            y = y.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9) * self.__scale
            return torch.flatten(y), Processor

        def narrow(self, x):
            return x.permute(1, 0)

        def with_super(self, x):
            super().__init__()
            return x.permute(0, 1, 2, 3, 4, 5, 6, 7, 8)
"""


def test_rewrite_of_a_synthetic_processor(tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, "apx_synthetic_processor", _SYNTHETIC)
    assert sorted(wide_permute_methods(module)) == [
        ("Processor", "patchify"),
        ("Processor", "with_super"),
    ]
    original = module.Processor.__dict__["patchify"]
    rewritten = narrow_permute_rewrite(original)
    x = torch.arange(16.0)
    processor = module.Processor()
    (want, cls), (got, cls2) = original(processor, x), rewritten(processor, x)
    assert torch.equal(want, got) and cls is cls2 is module.Processor
    assert rewritten.__doc__ == original.__doc__ and rewritten.__qualname__ == "Processor.patchify"
    # The call site is gone; the rest is the method's own code, on its own lines.
    assert "permute" not in rewritten.__code__.co_names
    assert rewritten.__code__.co_firstlineno == original.__code__.co_firstlineno
    with pytest.raises(SkipPatch, match="closure"):
        narrow_permute_rewrite(module.Processor.__dict__["with_super"])
    with pytest.raises(SkipPatch, match="not needed"):
        narrow_permute_rewrite(module.Processor.__dict__["narrow"])


def test_a_source_that_is_not_the_loaded_code_is_skipped(tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, "apx_edited_processor", _SYNTHETIC)
    # The file changes after import: what would be compiled is not what runs.
    path = tmp_path / "apx_edited_processor.py"
    path.write_text(path.read_text().replace("* self.__scale", "* 2"))
    with pytest.raises(SkipPatch, match="does not match the loaded code"):
        narrow_permute_rewrite(module.Processor.__dict__["patchify"])


def test_runtime_check():
    processor = object()
    assert on_npu(processor, device="npu:0") and on_npu(processor, [], "npu")
    assert not on_npu(processor, "cpu", device=torch.device("cpu"))
    assert not on_npu(processor, [1, 2], device=None)


def test_runtime_check_sees_npu_tensors(npu_emulator):
    assert on_npu(object(), [torch.zeros(1)]) and on_npu(object(), videos=torch.zeros(1))


# -- the real processors -----------------------------------------------------------------


def _counters(patcher, target):
    (record,) = [r for r in patcher.report.records if r.name == target]
    return record.counters


def _video_call(processor, videos):
    # Arguments for 4.57.6's and 5.24.0's signatures; no resize, no normalize (torchvision).
    return processor._preprocess(
        videos,
        do_convert_rgb=False,
        do_resize=False,
        size=None,
        resample=None,
        interpolation=None,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=False,
        image_mean=None,
        image_std=None,
        patch_size=processor.patch_size,
        temporal_patch_size=processor.temporal_patch_size,
        merge_size=processor.merge_size,
        cap_pixels_per_frame=False,
        return_tensors=None,
    )


_VIDEO_PROCESSORS = [
    ("qwen3_vl", "Qwen3VLVideoProcessor"),
    ("glm4v", "Glm4vVideoProcessor"),
]


@pytest.mark.skipif(transformers_version() < (4, 57), reason="no such video processors in 4.51")
@pytest.mark.parametrize(("model", "class_name"), _VIDEO_PROCESSORS)
def test_video_processors_give_the_same_patches(npu_emulator, isolated_patcher, model, class_name):
    module = importlib.import_module(f"transformers.models.{model}.video_processing_{model}")
    processor = getattr(module, class_name)()
    torch.manual_seed(0)
    # Two shapes (two groups), an odd frame count (temporal padding).
    side = processor.patch_size * processor.merge_size  # 28 (GLM-4V) or 32 (Qwen3-VL)
    videos = [
        torch.randint(0, 256, (3, 3, 2 * side, 3 * side), dtype=torch.uint8),
        torch.randint(0, 256, (4, 3, side, 2 * side), dtype=torch.uint8),
        torch.randint(0, 256, (3, 3, 2 * side, 3 * side), dtype=torch.uint8),
    ]
    want = _video_call(processor, videos)
    # 4.57.6: the permute sits in _preprocess; 5.24.0: in patchify.
    method = "_preprocess" if transformers_version() < (5,) else "patchify"
    processor_class = getattr(module, class_name)
    before = vars(processor_class)[method]
    isolated_patcher.add(VisionPatchify).apply()
    got = _video_call(processor, videos)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    target = f"{module.__name__}:{class_name}.{method}"
    counters = _counters(isolated_patcher, target)
    assert counters.replacement_calls >= 1 and counters.fallback_calls == 0
    assert vars(processor_class)[method] is not before
    isolated_patcher.revert()
    assert vars(processor_class)[method] is before


@pytest.mark.skipif(
    transformers_version() >= (4, 52), reason="importable without torchvision: 4.51"
)
def test_qwen2_vl_fast_image_processor_gives_the_same_patches(npu_emulator, isolated_patcher):
    module = importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl_fast")
    processor = module.Qwen2VLImageProcessorFast()
    torch.manual_seed(0)
    images = [torch.randint(0, 256, (3, 56, 84), dtype=torch.uint8) for _ in range(3)]

    def call():
        return processor._preprocess(
            images,
            do_resize=False,
            size=processor.size,
            interpolation=None,
            do_rescale=True,
            rescale_factor=1 / 255,
            do_normalize=False,
            image_mean=None,
            image_std=None,
            patch_size=14,
            temporal_patch_size=2,
            merge_size=2,
            do_convert_rgb=False,
            input_data_format=None,
            device="npu",  # how a user sends a processor to the NPU
        )

    want = call()
    isolated_patcher.add(VisionPatchify).apply()
    got = call()
    assert torch.equal(want[0], got[0]) and want[1] == got[1]
    target = f"{module.__name__}:Qwen2VLImageProcessorFast._preprocess"
    assert _counters(isolated_patcher, target).replacement_calls == 1


def test_what_the_hook_finds():
    version = transformers_version()
    found = {}
    for name in [
        "transformers.models.qwen2_vl.image_processing_qwen2_vl_fast",
        "transformers.models.qwen3_vl.video_processing_qwen3_vl",
        "transformers.models.glm4v.video_processing_glm4v",
    ]:
        try:
            module = importlib.import_module(name)
        except ImportError:  # absent in this version, or needs torchvision
            continue
        found[name.rpartition(".")[2]] = [
            p.target.rpartition(":")[2] for p in vision_patchify_hook(module)
        ]
    if version < (4, 52):
        assert found == {
            "image_processing_qwen2_vl_fast": ["Qwen2VLImageProcessorFast._preprocess"]
        }
    elif version < (5,):
        assert found == {
            "video_processing_qwen3_vl": ["Qwen3VLVideoProcessor._preprocess"],
            "video_processing_glm4v": ["Glm4vVideoProcessor._preprocess"],
        }
    else:
        assert found == {
            "video_processing_qwen3_vl": ["Qwen3VLVideoProcessor.patchify"],
            "video_processing_glm4v": ["Glm4vVideoProcessor.patchify"],
        }


# 4.57.6's Qwen2-VL and GLM-4V fast image processors, and the Qwen2-VL video processor
# (and most 5.x video processors), import torchvision's functional module at load; this
# CPU build has no torchvision. In a child
# process a stand-in module lets them load; the calls below (no resize, no normalize)
# never reach it, and the rest of each method is transformers' own code.
_STAND_IN_PROGRAM = """
import importlib, json, sys, types
import transformers, transformers.utils.import_utils  # decides "no torchvision" before the stand-in exists
for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2"):
    sys.modules[name] = types.ModuleType(name)
functional = types.ModuleType("torchvision.transforms.v2.functional")
sys.modules["torchvision.transforms.v2"].functional = functional
sys.modules["torchvision.transforms.v2.functional"] = functional

from ascend_patch_emulator import activate
activate()
import torch
from ascend_patch_core import Patcher
from ascend_patch_transformers.groups import VisionPatchify

common = dict(do_resize=False, size=None, interpolation=None, do_rescale=True,
              rescale_factor=1 / 255, do_normalize=False, image_mean=None, image_std=None,
              patch_size=14, temporal_patch_size=2, merge_size=2, return_tensors=None)
torch.manual_seed(0)
images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in
          [(56, 84), (28, 56), (56, 84)]]
videos = [torch.randint(0, 256, (t, 3, 56, 28), dtype=torch.uint8) for t in (3, 4)]
video_call = lambda p: p._preprocess(
    videos, do_convert_rgb=False, resample=None, cap_pixels_per_frame=False, **common)
if transformers.__version__.startswith("4."):
    cases = {
        "qwen2_vl.image_processing_qwen2_vl_fast:Qwen2VLImageProcessorFast._preprocess":
            lambda p: p._preprocess(images, disable_grouping=None, **common),
        "glm4v.image_processing_glm4v_fast:Glm4vImageProcessorFast._preprocess":
            lambda p: p._preprocess(images, disable_grouping=None, **common),
        "qwen2_vl.video_processing_qwen2_vl:Qwen2VLVideoProcessor._preprocess": video_call,
    }
else:  # 5.x: the image processors permute 8 dims; the video processors' patchify 10
    cases = {
        "qwen2_vl.video_processing_qwen2_vl:Qwen2VLVideoProcessor.patchify": video_call,
        "glm46v.video_processing_glm46v:Glm46VVideoProcessor.patchify": video_call,
        "video_llama_3.video_processing_video_llama_3:VideoLlama3VideoProcessor.patchify":
            video_call,
    }
processors, expected = {}, {}
for key, call in cases.items():
    module, _, name = key.partition(":")
    module = importlib.import_module("transformers.models." + module)
    processors[key] = getattr(module, name.partition(".")[0])()
    expected[key] = call(processors[key])
patcher = Patcher(autoload=False, strict=True).add(VisionPatchify)
patcher.apply()
result = {}
for key, call in cases.items():
    got = call(processors[key])
    same = got.keys() == expected[key].keys() and all(
        torch.equal(got[k], expected[key][k]) for k in got)
    (record,) = [r for r in patcher.report.records if r.name == "transformers.models." + key]
    result[key] = [same, record.status.value, record.counters.replacement_calls]
print(json.dumps(result))
"""


@pytest.mark.skipif(transformers_version() < (4, 57), reason="4.51: importable without torchvision")
def test_processors_that_import_torchvision(tmp_path):
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _STAND_IN_PROGRAM],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result) == 3
    for key, (same, status, calls) in result.items():
        # _preprocess once per call; 5.x's patchify once per group of equal frame shapes.
        assert (same, status) == (True, "applied") and calls >= 1, key
