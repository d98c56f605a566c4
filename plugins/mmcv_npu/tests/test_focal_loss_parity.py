"""SigmoidFocalLoss: mmcv's ``sigmoid_focal_loss`` on NPU tensors, values and gradients.

Runs in the nox session ``openmmlab_cpu_ops``. mmcv 2.1.0 compiled for the CPU has no
kernel for this loss (only its CUDA, MLU and NPU builds do), so the reference is mmcv's
formula written out: mmdet 3.3.0's pure-PyTorch ``py_sigmoid_focal_loss`` on one-hot
targets (a target equal to the class count is background: a zero row), each row scaled
by ``weight[target]`` where mmcv's kernel does that, and mmcv's reductions (``mean``:
the sum over all elements divided by the number of rows). The patched call runs on
emulated NPU tensors through the emulator's ``mx_driving.sigmoid_focal_loss``
(emulated: the numbers, not NPU speed). Tolerance: float32 against a float64
reference, 1e-5 absolute and 1e-4 relative.
"""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack
from mmcv_stacks import required


require_stack("mmcv-ops")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.groups import SigmoidFocalLoss  # noqa: E402


focal_loss = require_module("mmdet.models.losses.focal_loss", "mmdet")
TOL = {"atol": 1e-5, "rtol": 1e-4}
FUNCTION = "mmcv.ops.focal_loss:sigmoid_focal_loss"
APPLY = "mmcv.ops.focal_loss:SigmoidFocalLossFunction.apply"


@pytest.fixture
def mx_driving(npu_emulator, monkeypatch):
    if importlib.util.find_spec("mx_driving") is None:
        # The session with mmcv's ops promises the emulator's mx_driving.
        (pytest.fail if required("mmcv-ops") else pytest.skip)("the emulator serves no mx_driving")
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    yield
    _kernel_source.forget_choices()


def _inputs(rows=24, classes=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, classes, generator=generator) * 2
    target = torch.randint(0, classes + 1, (rows,), generator=generator)  # classes: background
    weight = torch.rand(classes, generator=generator) + 0.5
    return logits, target, weight


def _reference(logits, target, weight, gamma, alpha, reduction):
    leaf = logits.detach().double().requires_grad_(True)
    one_hot = F.one_hot(target, logits.shape[1] + 1)[:, :-1]
    loss = focal_loss.py_sigmoid_focal_loss(leaf, one_hot, None, gamma, alpha, reduction="none")
    if weight is not None:
        scale = torch.ones(len(target), dtype=torch.double)
        known = target < logits.shape[1]
        scale[known] = weight.double()[target[known]]
        loss = loss * scale.view(-1, 1)
    if reduction == "mean":
        loss = loss.sum() / logits.shape[0]
    elif reduction == "sum":
        loss = loss.sum()
    return leaf, loss


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weight"])
@pytest.mark.parametrize("gamma,alpha", [(2.0, 0.25), (1.5, 0.5)])
def test_sigmoid_focal_loss_matches_mmcvs_formula(
    mx_driving, isolated_patcher, reduction, weighted, gamma, alpha
):
    from mmcv.ops import focal_loss as ops

    logits, target, weight = _inputs()
    weight = weight if weighted else None
    leaf, expected = _reference(logits, target, weight, gamma, alpha, reduction)
    isolated_patcher.add(SigmoidFocalLoss).apply()
    npu_logits = logits.to("npu").requires_grad_(True)
    npu_weight = None if weight is None else weight.to("npu")
    # mmdet's FocalLoss calls the module-level name; BEVFormer-era code calls the Function.
    by_name = ops.sigmoid_focal_loss(
        npu_logits, target.to("npu"), gamma, alpha, npu_weight, reduction
    )
    by_apply = ops.SigmoidFocalLossFunction.apply(
        npu_logits, target.to("npu"), gamma, alpha, npu_weight, reduction
    )
    for actual in (by_name, by_apply):
        assert actual.shape == expected.shape and actual.dtype == logits.dtype
        torch.testing.assert_close(actual.cpu().double(), expected.detach(), **TOL)
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    (expected_grad,) = torch.autograd.grad(expected, leaf, cotangent.double())
    (actual_grad,) = torch.autograd.grad(by_name, npu_logits, cotangent.to("npu"))
    torch.testing.assert_close(actual_grad.cpu().double(), expected_grad, **TOL)
    report = isolated_patcher.report
    assert report.get(FUNCTION).note == "kernel: mx_driving"
    assert report.get(FUNCTION).counters.replacement_calls == 1
    assert report.get(APPLY).counters.replacement_calls == 1


def test_no_rows_go_to_mmcv(mx_driving, isolated_patcher):
    from mmcv.ops import focal_loss as ops

    isolated_patcher.add(SigmoidFocalLoss).apply()
    empty = torch.zeros(0, 5).to("npu")
    # mmcv's own code answers (on this CPU build: its "no kernel" error); not the replacement.
    with contextlib.suppress(Exception):
        ops.sigmoid_focal_loss(empty, torch.zeros(0, dtype=torch.long).to("npu"))
    counters = isolated_patcher.report.get(FUNCTION).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 1)
