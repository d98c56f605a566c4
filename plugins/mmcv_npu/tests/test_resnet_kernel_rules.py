"""When the ResNet groups call mx_driving's kernels, and when they leave the work to mmdet's ops.

Torch only (no mmdet): the rules are functions of the module and the tensors. The
kernels are the test double of :mod:`resnet_doubles` (same signatures and checks as
mx-driving 26.2), so a rule that let through a call the real kernel refuses fails here.
"""

from __future__ import annotations

import sys

import pytest
from mmcv_stacks import require_module
from resnet_doubles import mx_driving_double


torch = require_module("torch")

from ascend_patch_mmcv import resnet  # noqa: E402  (after the torch check)


@pytest.fixture
def double(monkeypatch):
    module = mx_driving_double()
    monkeypatch.setitem(sys.modules, "mx_driving", module)
    return module


def pool(**kwargs):
    return torch.nn.MaxPool2d(**{"kernel_size": 3, "stride": 2, "padding": 1, **kwargs})


def test_mmdets_pool_and_a_plain_input_go_to_the_kernel():
    x = torch.randn(2, 64, 9, 10)
    assert resnet.kernel_pool_refusal(pool(), x) is None
    assert resnet.kernel_pool_refusal(torch.nn.MaxPool2d((3, 3), (2, 2), (1, 1)), x) is None
    assert resnet.kernel_pool_refusal(pool(), x.half()) is None


def as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


class OwnPool(torch.nn.MaxPool2d):
    pass


@pytest.mark.parametrize(
    ("module", "why"),
    [
        (pool(kernel_size=2), "kernel_size=2"),
        (pool(stride=1), "stride=1"),
        (torch.nn.MaxPool2d(3), "stride=3"),  # stride defaults to the kernel size
        (pool(padding=0), "padding=0"),
        (pool(dilation=2), "dilation=2"),
        (pool(ceil_mode=True), "ceil_mode"),
        (pool(return_indices=True), "return_indices"),
        (OwnPool(3, 2, 1), "OwnPool, not nn.MaxPool2d"),
        (torch.nn.AvgPool2d(3, 2, 1), "AvgPool2d, not nn.MaxPool2d"),
    ],
)
def test_other_pools_are_left_to_the_module(module, why, double):
    x = torch.randn(1, 64, 8, 8)
    refusal = resnet.kernel_pool_refusal(module, x)
    assert refusal is not None and why in refusal
    out, expected = resnet.mx_driving_max_pool(module, x), module(x)
    assert double.calls["npu_max_pool2d"] == 0
    assert all(map(torch.equal, as_tuple(out), as_tuple(expected)))


@pytest.mark.parametrize(
    ("x", "why"),
    [
        (torch.randn(1, 64, 8, 8, dtype=torch.float64), "float64"),
        (torch.randn(1, 64, 8, 8, dtype=torch.bfloat16), "bfloat16"),
        (torch.randn(64, 8, 8), "3-D"),
        (torch.randn(1, 60, 8, 8), "60 channels"),
        (torch.randn(1, 24, 8, 8, dtype=torch.float16), "24 channels"),  # fp16: 16X
        (torch.randn(1, 1032, 4, 4), "1032 channels"),
        (torch.randn(1, 8, 1, 8), "1x8 input"),
        (torch.randn(1, 8, 8, 8, requires_grad=True), "needs a gradient"),
    ],
)
def test_inputs_the_kernel_refuses_are_left_to_the_module(x, why, double):
    refusal = resnet.kernel_pool_refusal(pool(), x)
    assert refusal is not None and why in refusal
    assert torch.equal(resnet.mx_driving_max_pool(pool(), x), pool()(x))
    assert double.calls["npu_max_pool2d"] == 0


def test_an_input_needing_no_gradient_goes_to_the_kernel(double):
    x = torch.randn(1, 8, 8, 8, requires_grad=True)
    with torch.no_grad():
        out = resnet.mx_driving_max_pool(pool(), x)
    assert double.calls["npu_max_pool2d"] == 1
    assert torch.equal(out, pool()(x.detach()))


def test_a_chip_without_the_kernel_gets_the_module(double, monkeypatch):
    def refuses(*args):
        raise NotImplementedError("The npu_max_pool2d currently only supports Ascend910B ...")

    monkeypatch.setattr(double, "npu_max_pool2d", refuses)
    x = torch.randn(1, 8, 8, 8)
    assert torch.equal(resnet.mx_driving_max_pool(pool(), x), pool()(x))


class Block(torch.nn.Module):
    def __init__(self, relu):
        super().__init__()
        self.relu = relu


@pytest.mark.parametrize(
    ("relu", "identity_shape", "identity_dtype", "kernel"),
    [
        (torch.nn.ReLU(inplace=True), (2, 8, 4, 4), torch.float32, True),
        (torch.nn.ReLU(), (2, 8, 4, 4), torch.float32, True),
        (torch.nn.LeakyReLU(inplace=True), (2, 8, 4, 4), torch.float32, False),
        (torch.nn.ReLU(inplace=True), (1, 8, 1, 1), torch.float32, False),  # broadcast
        (torch.nn.ReLU(inplace=True), (2, 8, 4, 4), torch.float16, False),  # promoted
    ],
)
def test_add_relu_uses_the_kernel_only_where_its_backward_is_right(
    relu, identity_shape, identity_dtype, kernel, double
):
    block = Block(relu)
    out = torch.randn(2, 8, 4, 4, requires_grad=True)
    identity = torch.randn(identity_shape, dtype=identity_dtype, requires_grad=True)
    got = resnet.mx_driving_add_relu(block, out.clone(), identity)
    got.backward(torch.ones_like(got))
    grads = out.grad, identity.grad
    out.grad = identity.grad = None
    want = resnet.portable_add_relu(block, out.clone(), identity)
    want.backward(torch.ones_like(want))
    assert double.calls["npu_add_relu"] == int(kernel)
    assert torch.equal(got, want)
    assert torch.equal(grads[0], out.grad) and torch.equal(grads[1], identity.grad)


def test_portable_add_relu_is_mmdets_residual():
    block = Block(torch.nn.ReLU(inplace=True))
    out, identity = torch.randn(2, 8, 4, 4), torch.randn(2, 8, 4, 4)
    expected = torch.relu(out + identity)
    assert torch.equal(resnet.portable_add_relu(block, out, identity), expected)
