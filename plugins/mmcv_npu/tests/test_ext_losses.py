"""``mmcv._ext`` focal losses against references (mmcv has NO CPU kernel for them).

mmcv 2.1.0 compiled for the CPU raises for ``sigmoid_focal_loss_forward`` and the
others (only its CUDA, MLU and NPU builds have kernels), so the references are:

* sigmoid: mmdet 3.3.0's pure-PyTorch ``py_sigmoid_focal_loss`` (reduction ``none``,
  one-hot targets with the background column dropped) for the loss, and autograd of
  it for the backward (each element depends on its own logit only, so the gradient of
  the summed loss is the element-wise derivative mmcv's backward writes);
* softmax: the explicit formula ``-alpha (1 - p_t)^gamma log p_t`` on ``softmax(x)``
  and its autograd gradient by the logits ``x`` (what mmcv's backward writes from the
  probabilities).

The functions are called as mmcv's ``focal_loss.py`` calls them (keywords, the
preallocated outputs). Tolerances: float32 1e-5 absolute, 1e-4 relative against the
float64 references (mmcv's formula takes ``log(1 - sigmoid(x))`` in float32, which
loses digits for large logits; the references use the stable forms); float16 inputs
1e-3 (computed in float32, rounded once).
"""

from __future__ import annotations

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import losses  # noqa: E402


focal_loss = require_module("mmdet.models.losses.focal_loss", "mmdet")
F32 = {"atol": 1e-5, "rtol": 1e-4}


def _inputs(rows=40, classes=7, seed=0, background=True):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, classes, generator=generator) * 2
    target = torch.randint(0, classes + int(background), (rows,), generator=generator)
    return logits, target


def _sigmoid_ext(logits, target, weight, gamma, alpha):
    weight = logits.new_empty(0) if weight is None else weight
    output = logits.new_zeros(logits.shape)
    losses.sigmoid_focal_loss_forward(logits, target, weight, output, gamma=gamma, alpha=alpha)
    grad = logits.new_zeros(logits.shape)
    losses.sigmoid_focal_loss_backward(logits, target, weight, grad, gamma=gamma, alpha=alpha)
    return output, grad


def _sigmoid_reference(logits, target, weight, gamma, alpha):
    leaf = logits.detach().double().requires_grad_(True)
    one_hot = F.one_hot(target, logits.shape[1] + 1)[:, :-1]
    loss = focal_loss.py_sigmoid_focal_loss(leaf, one_hot, None, gamma, alpha, reduction="none")
    if weight is not None:
        scale = torch.ones(len(target), dtype=torch.double)
        known = target < logits.shape[1]
        scale[known] = weight.double()[target[known]]
        loss = loss * scale.view(-1, 1)
    (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return loss.detach(), grad


@pytest.mark.parametrize("gamma,alpha", [(2.0, 0.25), (1.5, 0.5), (0.0, 0.75)])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weight"])
def test_sigmoid_focal_loss_matches_mmdets_pytorch_formula(gamma, alpha, weighted):
    logits, target = _inputs()
    weight = torch.rand(logits.shape[1]) + 0.5 if weighted else None
    output, grad = _sigmoid_ext(logits, target, weight, gamma, alpha)
    expected, expected_grad = _sigmoid_reference(logits, target, weight, gamma, alpha)
    torch.testing.assert_close(output, expected.float(), **F32)
    torch.testing.assert_close(grad, expected_grad.float(), **F32)


def test_sigmoid_focal_loss_edges():
    # Saturated logits (log clamped at FLT_MIN as mmcv does), one row, no rows.
    logits = torch.tensor([[-100.0, 100.0, 0.0], [30.0, -30.0, 1e-3]])
    target = torch.tensor([0, 3])
    output, grad = _sigmoid_ext(logits, target, None, 2.0, 0.25)
    assert torch.isfinite(output).all() and torch.isfinite(grad).all()
    expected, expected_grad = _sigmoid_reference(logits, target, None, 2.0, 0.25)
    # BCE-with-logits does not clamp: away from the clamp they agree.
    torch.testing.assert_close(output[:, 2], expected[:, 2].float(), **F32)
    torch.testing.assert_close(grad, expected_grad.float(), atol=1e-5, rtol=1e-4)
    one, one_grad = _sigmoid_ext(*_inputs(rows=1), None, 2.0, 0.25)
    assert one.shape == one_grad.shape == (1, 7)
    empty, empty_grad = _sigmoid_ext(
        torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), None, 2, 0.25
    )
    assert empty.shape == empty_grad.shape == (0, 4)


def test_sigmoid_focal_loss_half_and_non_contiguous():
    logits, target = _inputs(seed=1)
    output, grad = _sigmoid_ext(logits.half(), target, None, 2.0, 0.25)
    assert output.dtype == grad.dtype == torch.half
    expected, expected_grad = _sigmoid_reference(logits.half().float(), target, None, 2.0, 0.25)
    torch.testing.assert_close(output.float(), expected.float(), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(grad.float(), expected_grad.float(), atol=1e-3, rtol=1e-3)
    strided = logits.t().contiguous().t()
    assert not strided.is_contiguous()
    torch.testing.assert_close(
        _sigmoid_ext(strided, target, None, 2.0, 0.25)[0],
        _sigmoid_ext(logits, target, None, 2.0, 0.25)[0],
    )


def test_sigmoid_focal_loss_through_mmcvs_function_semantics():
    # mmcv's SigmoidFocalLossFunction: mean = sum / N, backward scaled the same way.
    logits, target = _inputs(seed=2)
    output, grad = _sigmoid_ext(logits, target, None, 2.0, 0.25)
    leaf = logits.double().requires_grad_(True)
    reference = focal_loss.py_sigmoid_focal_loss(
        leaf, F.one_hot(target, 8)[:, :-1], None, 2.0, 0.25, reduction="mean"
    )
    # mmdet's mean averages over N * C elements; mmcv's over N rows.
    torch.testing.assert_close(output.sum() / len(target), reference.float() * 7, **F32)
    (reference_grad,) = torch.autograd.grad(reference * 7, leaf)
    torch.testing.assert_close(grad / len(target), reference_grad.float(), **F32)


def _softmax_ext(logits, target, weight, gamma, alpha):
    probabilities = torch.softmax(logits, 1)
    weight = logits.new_empty(0) if weight is None else weight
    output = logits.new_zeros(len(target))
    losses.softmax_focal_loss_forward(
        probabilities, target, weight, output, gamma=gamma, alpha=alpha
    )
    buff = logits.new_zeros(len(target))
    grad = logits.new_zeros(logits.shape)
    losses.softmax_focal_loss_backward(
        probabilities, target, weight, buff, grad, gamma=gamma, alpha=alpha
    )
    return output, buff, grad


def _softmax_reference(logits, target, weight, gamma, alpha):
    leaf = logits.detach().double().requires_grad_(True)
    pred = torch.softmax(leaf, 1).gather(1, target.view(-1, 1)).squeeze(1)
    loss = -alpha * (1 - pred).pow(gamma) * pred.log()
    if weight is not None:
        loss = loss * weight.double()[target]
    (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return loss.detach(), grad


@pytest.mark.parametrize("gamma,alpha", [(2.0, 0.25), (1.5, 0.5), (1.0, 1.0)])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weight"])
def test_softmax_focal_loss_matches_the_explicit_formula(gamma, alpha, weighted):
    logits, target = _inputs(background=False, seed=3)
    weight = torch.rand(logits.shape[1]) + 0.5 if weighted else None
    output, buff, grad = _softmax_ext(logits, target, weight, gamma, alpha)
    expected, expected_grad = _softmax_reference(logits, target, weight, gamma, alpha)
    torch.testing.assert_close(output, expected.float(), **F32)
    torch.testing.assert_close(grad, expected_grad.float(), **F32)
    # buff is d loss / d log p_t (mmcv's intermediate): grad at the target = buff * (1 - p_t).
    p_t = torch.softmax(logits, 1).gather(1, target.view(-1, 1)).squeeze(1)
    torch.testing.assert_close(
        grad.gather(1, target.view(-1, 1)).squeeze(1), buff * (1 - p_t), **F32
    )


def test_softmax_focal_loss_targets_outside_the_classes_give_zero():
    logits, _ = _inputs(rows=4, classes=3)
    target = torch.tensor([-1, 3, 0, 2])
    output, buff, grad = _softmax_ext(logits, target, torch.ones(3), 2.0, 0.25)
    assert output[:2].eq(0).all() and buff[:2].eq(0).all() and grad[:2].eq(0).all()
    expected, expected_grad = _softmax_reference(logits[2:], target[2:], None, 2.0, 0.25)
    torch.testing.assert_close(output[2:], expected.float(), **F32)
    torch.testing.assert_close(grad[2:], expected_grad.float(), **F32)


def test_sigmoid_focal_loss_on_npu_tensors(npu_emulator, monkeypatch):
    """Emulated NPU tensors: the mx_driving kernel when chosen, else portable; same numbers."""
    import importlib.util

    logits, target = _inputs(seed=4)
    weight = torch.rand(7) + 0.5
    expected = _sigmoid_ext(logits, target, weight, 2.0, 0.25)
    sources = ["portable"] + (["mx_driving"] if importlib.util.find_spec("mx_driving") else [])
    for source in sources:
        monkeypatch.setenv(_kernel_source.VARIABLE, f"sigmoid_focal_loss={source}")
        _kernel_source.forget_choices()
        try:
            found = _sigmoid_ext(logits.to("npu"), target.to("npu"), weight.to("npu"), 2.0, 0.25)
        finally:
            _kernel_source.forget_choices()
        for a, e in zip(found, expected, strict=True):
            torch.testing.assert_close(a.cpu(), e, **F32)


def test_through_mmcvs_focal_loss_functions(monkeypatch):
    """mmcv's own sigmoid/softmax focal loss Functions (reductions, buffers) on these."""
    import types

    from mmcv.ops import focal_loss as mmcv_focal_loss

    names = [n for n in losses.__all__]
    monkeypatch.setattr(
        mmcv_focal_loss,
        "ext_module",
        types.SimpleNamespace(**{n: getattr(losses, n) for n in names}),
    )
    logits, target = _inputs(seed=6)
    for reduction in ("mean", "sum", "none"):
        leaf = logits.clone().requires_grad_(True)
        loss = mmcv_focal_loss.sigmoid_focal_loss(leaf, target, 2.0, 0.25, None, reduction)
        loss.sum().backward()
        expected, expected_grad = _sigmoid_reference(logits, target, None, 2.0, 0.25)
        factor = {"mean": 1 / len(target), "sum": 1.0, "none": 1.0}[reduction]
        reduced = expected if reduction == "none" else expected.sum() * factor
        torch.testing.assert_close(loss.detach(), reduced.float(), **F32)
        torch.testing.assert_close(leaf.grad, (expected_grad * factor).float(), **F32)
    target = target.clamp(max=6)
    leaf = logits.clone().requires_grad_(True)
    loss = mmcv_focal_loss.softmax_focal_loss(leaf, target, 2.0, 0.25, None, "sum")
    loss.backward()
    expected, expected_grad = _softmax_reference(logits, target, None, 2.0, 0.25)
    torch.testing.assert_close(loss.detach(), expected.sum().float(), **F32)
    torch.testing.assert_close(leaf.grad, expected_grad.float(), **F32)
