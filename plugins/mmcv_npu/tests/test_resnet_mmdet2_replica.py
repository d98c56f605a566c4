"""The mmdet groups on the mmdet 2.x line, through an on-disk REPLICA of mmdet 2.28.2.

No mmdet 2.x installs beside this machine's torch (it needs mmcv-full 1.x, whose
compiled ops do not build against torch 2.13), so these tests write a minimal package
``mmdet`` 2.28.2 with the 2.x module layout the groups patch --
``mmdet.models.backbones.resnet`` (BasicBlock, Bottleneck, ResNet with mmdet 2.x's
forwards and attribute names) and ``mmdet.core.bbox.samplers`` (2.x ``PseudoSampler``
and ``SamplingResult``) -- with its ``dist-info``, and run a user's program in a fresh
interpreter: emulator on, the original model run, ``ascend_patch_core.apply()``, the
patched model run on "npu", both compared. What they show: the 2.x targets and
version ranges are the right ones and the replacements compute what 2.x's code does;
the real mmdet 2.x is not run.

Needs torch and the emulator only, so it runs in every session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mmcv_stacks import require_module
from resnet_doubles import write_mx_driving_double


require_module("torch")
require_module("ascend_patch_emulator")

RESNET_2X = """
import torch.nn as nn
import torch.utils.checkpoint as cp


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, with_cp=False):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.norm1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.with_cp = with_cp

    def forward(self, x):
        def _inner_forward(x):
            identity = x
            out = self.conv1(x)
            out = self.norm1(out)
            out = self.relu(out)
            out = self.conv2(out)
            out = self.norm2(out)
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return out

        if self.with_cp and x.requires_grad:
            out = cp.checkpoint(_inner_forward, x)
        else:
            out = _inner_forward(x)
        out = self.relu(out)
        return out


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, with_cp=False):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.norm1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.norm3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.with_cp = with_cp
        self.with_plugins = False
        self.after_conv1_plugin_names = []
        self.after_conv2_plugin_names = []
        self.after_conv3_plugin_names = []

    def forward_plugin(self, x, plugin_names):
        out = x
        for name in plugin_names:
            out = getattr(self, name)(out)
        return out

    def forward(self, x):
        def _inner_forward(x):
            identity = x
            out = self.conv1(x)
            out = self.norm1(out)
            out = self.relu(out)
            if self.with_plugins:
                out = self.forward_plugin(out, self.after_conv1_plugin_names)
            out = self.conv2(out)
            out = self.norm2(out)
            out = self.relu(out)
            if self.with_plugins:
                out = self.forward_plugin(out, self.after_conv2_plugin_names)
            out = self.conv3(out)
            out = self.norm3(out)
            if self.with_plugins:
                out = self.forward_plugin(out, self.after_conv3_plugin_names)
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return out

        if self.with_cp and x.requires_grad:
            out = cp.checkpoint(_inner_forward, x)
        else:
            out = _inner_forward(x)
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    arch_settings = {18: (BasicBlock, (2, 2, 2, 2)), 50: (Bottleneck, (3, 4, 6, 3))}

    def __init__(self, depth, out_indices=(0, 1, 2, 3), with_cp=False):
        super().__init__()
        block, stage_blocks = self.arch_settings[depth]
        self.deep_stem = False
        self.out_indices = out_indices
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.norm1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.res_layers = []
        inplanes = 64
        for i, num_blocks in enumerate(stage_blocks):
            planes, stride = 64 * 2**i, 1 if i == 0 else 2
            layers = []
            for j in range(num_blocks):
                downsample = None
                if j == 0 and (stride != 1 or inplanes != planes * block.expansion):
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes * block.expansion, 1, stride, bias=False),
                        nn.BatchNorm2d(planes * block.expansion))
                layers.append(block(inplanes, planes, stride if j == 0 else 1, downsample,
                                    with_cp))
                inplanes = planes * block.expansion
            name = f'layer{i + 1}'
            self.add_module(name, nn.Sequential(*layers))
            self.res_layers.append(name)

    def forward(self, x):
        if self.deep_stem:
            x = self.stem(x)
        else:
            x = self.conv1(x)
            x = self.norm1(x)
            x = self.relu(x)
        x = self.maxpool(x)
        outs = []
        for i, layer_name in enumerate(self.res_layers):
            res_layer = getattr(self, layer_name)
            x = res_layer(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
"""

SAMPLING_RESULT_2X = """
import torch


class SamplingResult:
    def __init__(self, pos_inds, neg_inds, bboxes, gt_bboxes, assign_result, gt_flags):
        self.pos_inds = pos_inds
        self.neg_inds = neg_inds
        self.pos_bboxes = bboxes[pos_inds]
        self.neg_bboxes = bboxes[neg_inds]
        self.pos_is_gt = gt_flags[pos_inds]
        self.num_gts = gt_bboxes.shape[0]
        self.pos_assigned_gt_inds = assign_result.gt_inds[pos_inds] - 1
        if gt_bboxes.numel() == 0:
            self.pos_gt_bboxes = torch.empty_like(gt_bboxes).view(-1, 4)
        else:
            self.pos_gt_bboxes = gt_bboxes.view(-1, 4)[self.pos_assigned_gt_inds.long(), :]
        if assign_result.labels is not None:
            self.pos_gt_labels = assign_result.labels[pos_inds]
        else:
            self.pos_gt_labels = None
"""

PSEUDO_SAMPLER_2X = """
import torch

from .sampling_result import SamplingResult


class PseudoSampler:
    def __init__(self, **kwargs):
        pass

    def sample(self, assign_result, bboxes, gt_bboxes, *args, **kwargs):
        pos_inds = torch.nonzero(
            assign_result.gt_inds > 0, as_tuple=False).squeeze(-1).unique()
        neg_inds = torch.nonzero(
            assign_result.gt_inds == 0, as_tuple=False).squeeze(-1).unique()
        gt_flags = bboxes.new_zeros(bboxes.shape[0], dtype=torch.uint8)
        sampling_result = SamplingResult(pos_inds, neg_inds, bboxes, gt_bboxes,
                                         assign_result, gt_flags)
        return sampling_result
"""

FILES = {
    "mmdet/__init__.py": "__version__ = '2.28.2'\n",
    "mmdet/models/__init__.py": "from . import backbones\n",
    "mmdet/models/backbones/__init__.py": "from .resnet import ResNet\n",
    "mmdet/models/backbones/resnet.py": RESNET_2X,
    "mmdet/core/__init__.py": "from . import bbox\n",
    "mmdet/core/bbox/__init__.py": "from .samplers import PseudoSampler, SamplingResult\n",
    "mmdet/core/bbox/samplers/__init__.py": (
        "from .pseudo_sampler import PseudoSampler\nfrom .sampling_result import SamplingResult\n"
    ),
    "mmdet/core/bbox/samplers/pseudo_sampler.py": PSEUDO_SAMPLER_2X,
    "mmdet/core/bbox/samplers/sampling_result.py": SAMPLING_RESULT_2X,
    "mmdet-2.28.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: mmdet\nVersion: 2.28.2\n",
}

# The user's program: the original 2.x model, then apply() and the same model on "npu".
PROGRAM = r"""
import copy, functools, importlib.util, json, os, sys, types
import ascend_patch_emulator
ascend_patch_emulator.activate()
import torch

KERNEL_CALLS = {"npu_add_relu": 0, "npu_max_pool2d": 0}
if os.environ.get("MX_DRIVING_DOUBLE"):  # the test double instead of the emulated module
    spec = importlib.util.spec_from_file_location("mx_driving", os.environ["MX_DRIVING_DOUBLE"])
    sys.modules["mx_driving"] = double = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(double)
    KERNEL_CALLS = double.calls
elif "mx_driving" in sys.modules:  # the emulated one: count its calls
    def counting(name, kernel):
        @functools.wraps(kernel)
        def call(*args, **kwargs):
            KERNEL_CALLS[name] += 1
            return kernel(*args, **kwargs)
        return call
    for name in KERNEL_CALLS:
        setattr(sys.modules["mx_driving"], name, counting(name, getattr(sys.modules["mx_driving"], name)))
from mmdet.models.backbones.resnet import ResNet
from mmdet.core.bbox.samplers import PseudoSampler

FP16 = sys.argv[1] == "fp16"

def run(model, x, autocast):
    x = x.clone().requires_grad_(True)
    if autocast:  # the original under the autocast ResNetFP16 puts around the call
        with torch.autocast(x.device.type, torch.float16):
            outs = tuple(o.float() for o in model(x))
    else:
        outs = model(x)
    torch.manual_seed(1)
    sum(o.mul(torch.randn_like(o)).sum() for o in outs).backward()
    return outs, [x.grad], [p.grad for p in model.parameters()]

def max_diff(a, b):
    return max(float((u.double() - v.double()).abs().max()) for u, v in zip(a, b, strict=True))

torch.manual_seed(0)
models = {depth: ResNet(depth, with_cp=(depth == 50)) for depth in (18, 50)}
inputs = {depth: torch.randn(2, 3, 32, 32) for depth in (18, 50)}
originals = {d: run(copy.deepcopy(models[d]), inputs[d], FP16) for d in models}
samplers = []
for n in (0, 1, 50):
    assign = types.SimpleNamespace(
        gt_inds=torch.randint(-1, 4, (n,)), labels=torch.randint(0, 7, (n,)), num_gts=3
    )
    bboxes, gt_bboxes = torch.rand(n, 4), torch.rand(3, 4)
    samplers.append((assign, bboxes, gt_bboxes, PseudoSampler().sample(assign, bboxes, gt_bboxes)))

import ascend_patch_core
report = ascend_patch_core.apply()
out = {"diffs": {}, "sampler_fields_equal": True}
for depth, model in models.items():
    patched = run(copy.deepcopy(model).to("npu"), inputs[depth].to("npu"), False)
    out["diffs"][depth] = [max_diff(o, p) for o, p in zip(originals[depth], patched)]
with torch.no_grad():
    models[18].eval()(torch.randn(1, 3, 32, 32, device="npu"))
for assign, bboxes, gt_bboxes, expected in samplers:
    got = PseudoSampler().sample(assign, bboxes, gt_bboxes)
    for name, value in vars(expected).items():
        other = getattr(got, name)
        if isinstance(value, torch.Tensor):
            same = value.dtype == other.dtype and torch.equal(value, other)
        else:
            same = value == other
        out["sampler_fields_equal"] &= bool(same)
out["records"] = {
    record.name: {
        "status": str(record.status),
        "reason": record.reason,
        "note": getattr(record, "note", None),
        "calls": None
        if record.counters is None
        else [record.counters.replacement_calls, record.counters.fallback_calls],
    }
    for record in report.records
    if hasattr(record, "counters")
}
out["kernel_calls"] = dict(KERNEL_CALLS)
print("RESULT" + json.dumps(out))
"""


def run_program(paths: list[Path], env: dict[str, str], mode: str = "fp32") -> dict:
    """Run :data:`PROGRAM` with ``paths`` first on ``sys.path``; its JSON result."""
    full_env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("ASCEND_PATCH_MMCV_KERNELS", "ASCEND_PATCH_ENABLE", "MX_DRIVING_DOUBLE")
    }
    full_env.update(
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        ASCEND_PATCH_CACHE="0",
        PYTHONPATH=os.pathsep.join(
            [*map(str, paths), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mmdet2_replica")
    for relative, text in FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


RESNET_TARGETS = (
    "mmdet.models.backbones.resnet:BasicBlock.forward",
    "mmdet.models.backbones.resnet:Bottleneck.forward",
    "mmdet.models.backbones.resnet:ResNet.forward",
)
MMDET2_SAMPLER = "mmdet.core.bbox.samplers.pseudo_sampler:PseudoSampler.sample"
MMDET3_SAMPLER = "mmdet.models.task_modules.samplers.pseudo_sampler:PseudoSampler.sample"


def check_records(result: dict, kernel: str) -> None:
    records = result["records"]
    for target in RESNET_TARGETS:
        record = records[target]
        assert record["status"] == "applied", record
        assert record["note"] == f"kernel: {kernel}"
        replaced, fell_back = record["calls"]
        assert replaced > 0 and fell_back == 0, (target, record)
    # mmdet 2.x: its sampler is patched; the 3.x one is reported, not silently dropped.
    assert records[MMDET2_SAMPLER]["status"] == "applied"
    assert records[MMDET2_SAMPLER]["calls"] == [3, 0]
    assert records[MMDET3_SAMPLER]["status"] == "skipped"
    assert "mmdet" in records[MMDET3_SAMPLER]["reason"]
    assert result["sampler_fields_equal"]


def check_parity(result: dict, tolerance: float) -> None:
    for depth, (outputs, input_grad, param_grads) in result["diffs"].items():
        assert max(outputs, input_grad, param_grads) <= tolerance, (depth, result["diffs"])


@pytest.mark.slow
def test_mmdet2_resnet_and_sampler_portable(replica: Path) -> None:
    env = {"ASCEND_PATCH_MMCV_KERNELS": "portable", "ASCEND_PATCH_ENABLE": "PseudoSampler"}
    result = run_program([replica], env)
    check_records(result, "portable")
    # float32, the same ops in the same order as mmdet's code: equal to the last bit.
    check_parity(result, 0.0)


@pytest.mark.slow
def test_mmdet2_resnet_with_mx_driving_double(replica: Path, tmp_path: Path) -> None:
    """mx_driving's kernels (the test double, with the wheel's argument checks): add-relu
    in every block, the max pool only in the no-grad run (training needs its gradient)."""
    double = write_mx_driving_double(tmp_path) / "__init__.py"
    env = {"ASCEND_PATCH_ENABLE": "PseudoSampler", "MX_DRIVING_DOUBLE": str(double)}
    result = run_program([replica], env)
    check_records(result, "mx_driving")
    calls = result["kernel_calls"]
    assert calls["npu_add_relu"] > 0 and calls["npu_max_pool2d"] == 1, calls
    # The double computes relu(x + y) out of place: the same float32 values.
    check_parity(result, 0.0)


@pytest.mark.slow
def test_mmdet2_resnet_fp16_with_the_emulated_mx_driving(replica: Path) -> None:
    """ResNetFP16 with ResNetAddRelu and ResNetMaxPool on the emulator's mx_driving: the
    outputs and gradients are those of mmdet's code under the same float16 autocast."""
    result = run_program([replica], {"ASCEND_PATCH_ENABLE": "PseudoSampler,ResNetFP16"}, "fp16")
    if result["records"][RESNET_TARGETS[0]]["note"] == "kernel: portable":
        pytest.skip("this emulator serves no mx_driving")
    check_records(result, "mx_driving")
    fp16 = result["records"]["mmdet.models.backbones.resnet:ResNet.__call__"]
    assert fp16["status"] == "applied" and fp16["calls"] == [3, 0]
    calls = result["kernel_calls"]
    assert calls["npu_add_relu"] > 0 and calls["npu_max_pool2d"] == 1, calls
    # float16 compared in float64: the same autocast dtype choices on both sides.
    check_parity(result, 1e-2)
