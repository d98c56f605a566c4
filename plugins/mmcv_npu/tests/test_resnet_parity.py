"""ResNetAddRelu, ResNetMaxPool and ResNetFP16 on the real mmdet 3.3.0 ResNet.

The original model runs first (mmdet's code), then a copy runs with the groups
applied on "npu" under the NPU emulator; outputs, the input's gradient and every
parameter's gradient are compared, and the report's counters must show that the
replacements ran. Kernels: ``portable`` (mmdet's own ops), the ``mx_driving`` test
double of :mod:`resnet_doubles` (the wheel's signatures and argument checks) and,
where the emulator serves it, the emulated ``mx_driving``. Results under the emulator
are emulated: they show the code paths and the numbers, not NPU speed.

mmdet.models imports mmcv.ops: these need mmcv built with its ops (nox session
``openmmlab_cpu_ops``) and skip elsewhere.
"""

from __future__ import annotations

import copy
import functools
import sys

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack
from mmcv_stacks import required


require_stack("mmcv-ops")
require_stack("mmdet")

import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.groups import ResNetAddRelu  # noqa: E402
from ascend_patch_mmcv.groups import ResNetFP16  # noqa: E402
from ascend_patch_mmcv.groups import ResNetMaxPool  # noqa: E402
from resnet_doubles import mx_driving_double  # noqa: E402


resnet = require_module("mmdet.models.backbones.resnet", "mmdet")

BASIC = "mmdet.models.backbones.resnet:BasicBlock.forward"
BOTTLENECK = "mmdet.models.backbones.resnet:Bottleneck.forward"
FORWARD = "mmdet.models.backbones.resnet:ResNet.forward"
CALL = "mmdet.models.backbones.resnet:ResNet.__call__"
KERNELS = ("npu_add_relu", "npu_max_pool2d")


class Kernels:
    """The kernel source of a test and the calls its mx_driving kernels got."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.calls = dict.fromkeys(KERNELS, 0)


def count_calls(module, calls, monkeypatch):
    for name in KERNELS:
        kernel = getattr(module, name)

        @functools.wraps(kernel)
        def counted(*args, _kernel=kernel, _name=name, **kwargs):
            calls[_name] += 1
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


PORTABLE, DOUBLE, EMULATED = "portable", "mx_driving double", "emulated mx_driving"
ALL_SOURCES = (PORTABLE, DOUBLE, EMULATED)


@pytest.fixture(params=ALL_SOURCES)
def kernels(request, npu_emulator, monkeypatch):
    """The kernel source, chosen the user's way (ASCEND_PATCH_MMCV_KERNELS) at group build."""
    chosen = Kernels("portable" if request.param == "portable" else "mx_driving")
    monkeypatch.setenv(_kernel_source.VARIABLE, chosen.source)
    if request.param == "mx_driving double":
        monkeypatch.setitem(sys.modules, "mx_driving", mx_driving_double())
    elif request.param == "emulated mx_driving":
        module = sys.modules.get("mx_driving")
        if module is None or not getattr(module, "__emulated__", False):
            # The session with mmcv's ops promises the emulator's mx_driving.
            (pytest.fail if required("mmcv-ops") else pytest.skip)(
                "the emulator serves no mx_driving"
            )
    if chosen.source == "mx_driving":
        count_calls(sys.modules["mx_driving"], chosen.calls, monkeypatch)
    _kernel_source.forget_choices()
    yield chosen
    _kernel_source.forget_choices()


def run(model, x, *, input_grad=True, backward=True, autocast=False):
    """Outputs, the input's gradient and the parameters' gradients (seeded cotangents)."""
    x = x.clone().requires_grad_(input_grad)
    if autocast:
        with torch.autocast(x.device.type, torch.float16):
            outs = tuple(o.float() for o in model(x))
    else:
        outs = model(x)
    if not backward:
        return outs, [], []
    generator = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=generator) for o in outs]
    sum((o * c).sum() for o, c in zip(outs, cotangents, strict=True)).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    return outs, [x.grad] if input_grad else [], grads


def assert_close(original, patched, rtol, atol):
    names = ("outputs", "input grad", "param grads")[: len(original)]
    for name, expected, got in zip(names, original, patched, strict=True):
        assert len(expected) == len(got), name
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            assert e.dtype == g.dtype, (name, i)
            torch.testing.assert_close(
                g, e, rtol=rtol, atol=atol, msg=lambda m, n=name, i=i: f"{n}[{i}]: {m}"
            )


CONTEXT_BLOCK = [
    dict(
        cfg=dict(type="ContextBlock", ratio=1.0 / 16),
        stages=(False, True, True, True),
        position="after_conv3",
    )
]
MODELS = {
    "resnet18": lambda: resnet.ResNet(depth=18),
    # Bottlenecks with a plugin after conv3, and checkpointing (the re-computed forward).
    "resnet50-cp-plugins": lambda: resnet.ResNet(depth=50, with_cp=True, plugins=CONTEXT_BLOCK),
    # The deep stem (ResNetV1d inherits ResNet.forward).
    "resnetv1d18": lambda: resnet.ResNetV1d(depth=18),
}


def build(name, train=True):
    model = MODELS[name]()
    model.train(train)  # mmdet's ResNet.train returns None
    return model


def counters(patcher, target):
    record = patcher.report.get(target)
    return record.counters.replacement_calls, record.counters.fallback_calls


@pytest.mark.parametrize(
    ("name", "kernels"),
    [(name, source) for name in MODELS for source in (PORTABLE, EMULATED)] + [("resnet18", DOUBLE)],
    indirect=["kernels"],
)
def test_training_step_matches_mmdet(name, kernels, isolated_patcher):
    torch.manual_seed(0)
    model = build(name)
    x = torch.randn(2, 3, 32, 32)
    original = run(copy.deepcopy(model), x)

    isolated_patcher.add(ResNetAddRelu, ResNetMaxPool).apply()
    patched = run(copy.deepcopy(model).to("npu"), x.to("npu"))

    # float32; the mx_driving kernels compute relu(x + y) out of place, the same values.
    assert_close(original, patched, rtol=1e-6, atol=1e-6)
    block = BASIC if "18" in name else BOTTLENECK
    assert counters(isolated_patcher, block)[0] > 0
    assert counters(isolated_patcher, FORWARD) == (1, 0)
    assert isolated_patcher.report.get(FORWARD).note == f"kernel: {kernels.source}"
    if kernels.source == "mx_driving":
        assert kernels.calls["npu_add_relu"] > 0
        # The stem's output needs its gradient here: the pool kernel has no backward.
        assert kernels.calls["npu_max_pool2d"] == 0


def test_inference_uses_the_pool_kernel(kernels, isolated_patcher):
    torch.manual_seed(0)
    model = build("resnet18", train=False)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        original = run(copy.deepcopy(model), x, input_grad=False, backward=False)
        isolated_patcher.add(ResNetAddRelu, ResNetMaxPool).apply()
        patched = run(copy.deepcopy(model).to("npu"), x.to("npu"), input_grad=False, backward=False)
    assert_close(original, patched, rtol=0, atol=0)
    assert counters(isolated_patcher, FORWARD) == (1, 0)
    assert kernels.calls["npu_max_pool2d"] == (1 if kernels.source == "mx_driving" else 0)


def test_a_frozen_stem_trains_with_the_pool_kernel(kernels, isolated_patcher):
    """frozen_stages=0: the stem needs no gradient, so the kernel serves training too."""
    torch.manual_seed(0)
    model = resnet.ResNet(depth=18, frozen_stages=0)
    model.train()
    x = torch.randn(2, 3, 32, 32)
    original = run(copy.deepcopy(model), x, input_grad=False)
    isolated_patcher.add(ResNetAddRelu, ResNetMaxPool).apply()
    patched = run(copy.deepcopy(model).to("npu"), x.to("npu"), input_grad=False)
    assert_close(original, patched, rtol=1e-6, atol=1e-6)
    assert kernels.calls["npu_max_pool2d"] == (1 if kernels.source == "mx_driving" else 0)


@pytest.mark.parametrize(
    "pool",
    [
        torch.nn.MaxPool2d(kernel_size=2, stride=2),
        torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1, ceil_mode=True),
        torch.nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
    ],
    ids=["k2s2", "ceil", "stride1"],
)
# The double has the wheel's argument checks: a pool passed to the kernel would raise.
@pytest.mark.parametrize("kernels", [DOUBLE], indirect=True)
def test_another_pool_runs_as_the_module_says(pool, kernels, isolated_patcher):
    """Not hard-coded to k3/s2/p1: another pool is computed by the module itself."""
    torch.manual_seed(0)
    model = build("resnet18", train=False)
    model.maxpool = pool
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        original = run(copy.deepcopy(model), x, input_grad=False, backward=False)
        isolated_patcher.add(ResNetMaxPool).apply()
        patched = run(copy.deepcopy(model).to("npu"), x.to("npu"), input_grad=False, backward=False)
    assert_close(original, patched, rtol=0, atol=0)
    assert counters(isolated_patcher, FORWARD) == (1, 0)
    assert kernels.calls["npu_max_pool2d"] == 0


@pytest.mark.parametrize(
    ("name", "kernels"),
    [("resnet18", source) for source in ALL_SOURCES]
    + [pytest.param("resnet50-cp-plugins", EMULATED, marks=pytest.mark.slow)],
    indirect=["kernels"],
)
def test_fp16_runs_the_call_under_autocast_and_composes(name, kernels, isolated_patcher):
    torch.manual_seed(0)
    model = build(name)
    x = torch.randn(2, 3, 32, 32)
    full = run(copy.deepcopy(model), x)
    under_autocast = run(copy.deepcopy(model), x, autocast=True)

    isolated_patcher.add(ResNetAddRelu, ResNetMaxPool, ResNetFP16).apply()
    patched = run(copy.deepcopy(model).to("npu"), x.to("npu"))

    assert all(o.dtype is torch.float32 for o in patched[0])
    # mmdet's code under the same autocast: the same float16 ops, rounded alike.
    assert_close(under_autocast, patched, rtol=1e-3, atol=1e-3)
    # Against float32: what float16 costs (BatchNorm renormalises every stage).
    assert_close(full[:1], patched[:1], rtol=5e-2, atol=5e-2)
    assert counters(isolated_patcher, CALL) == (1, 0)
    assert counters(isolated_patcher, FORWARD) == (1, 0)


def test_cpu_tensors_keep_mmdets_code(isolated_patcher):
    """Without the emulator, tensors are not NPU tensors: every call falls back."""
    torch.manual_seed(0)
    model = build("resnet18")
    x = torch.randn(2, 3, 32, 32)
    original = run(copy.deepcopy(model), x)
    isolated_patcher.add(ResNetAddRelu, ResNetMaxPool, ResNetFP16).apply()
    patched = run(copy.deepcopy(model), x)
    assert_close(original, patched, rtol=0, atol=0)
    assert counters(isolated_patcher, CALL) == (0, 1)
    assert counters(isolated_patcher, FORWARD) == (0, 1)
    assert counters(isolated_patcher, BASIC) == (0, 8)
