"""Test double of DrivingSDK's ``mx_driving`` for the mmdet ResNet groups' tests.

NOT the real library and not the emulator's: the two kernels the ResNet groups call,
with the Python signatures of the mx-driving 26.2 wheel (``npu_add_relu(x, y)``,
``npu_max_pool2d(x, kernel_size, stride, padding)``), the argument checks of its C++
entry points, its autograd (add-relu: ReLU's gradient to both inputs; max pool: no
backward at all), computed by torch, and a call counter per kernel. It lets the tests
take the ``mx_driving`` branch of the replacements wherever torch is installed.
"""

from __future__ import annotations

import types
from pathlib import Path


__all__ = ["MX_DRIVING_DOUBLE", "mx_driving_double", "write_mx_driving_double"]

MX_DRIVING_DOUBLE = '''
"""Test double of mx_driving (ascend-patch tests): npu_add_relu and npu_max_pool2d."""
import torch
import torch.nn.functional as F

TEST_DOUBLE = True
calls = {"npu_add_relu": 0, "npu_max_pool2d": 0}


class AddReluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        out = F.relu(x + y)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (out,) = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad_output, out, 0)
        return grad, grad


def npu_add_relu(x, y):
    calls["npu_add_relu"] += 1
    return AddReluFunction.apply(x, y)


class MaxPool2d(torch.autograd.Function):
    # Forward only, as mx_driving's: a backward through it raises.
    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding):
        return F.max_pool2d(x, kernel_size, stride, padding)


def npu_max_pool2d(x, kernel_size, stride, padding):
    if x.dtype not in (torch.float32, torch.float16):
        raise RuntimeError(f"x: float32 or float16 tensor expected but got {x.dtype}")
    if x.dim() != 4:
        raise RuntimeError(f"x_trans.dim() must be 4, but got: {x.dim()}")
    for name, value, wanted in (("kernel_size", kernel_size, 3), ("stride", stride, 2),
                                ("padding", padding, 1)):
        if value != wanted:
            raise RuntimeError(f"{name}: expected {wanted} but got: {value}")
    channels = x.shape[1]
    if channels > 1024:
        raise RuntimeError(f"channel must less or equal than 1024 expected but got channel: {channels}")
    if channels % (8 if x.dtype == torch.float32 else 16):
        raise RuntimeError(f"channel: expected 8X/16X but got: {channels}")
    calls["npu_max_pool2d"] += 1
    return MaxPool2d.apply(x, kernel_size, stride, padding)
'''


def mx_driving_double() -> types.ModuleType:
    """A fresh double module (put it in ``sys.modules["mx_driving"]`` with monkeypatch)."""
    module = types.ModuleType("mx_driving", "test double of mx_driving")
    exec(compile(MX_DRIVING_DOUBLE, "<mx_driving test double>", "exec"), module.__dict__)
    return module


def write_mx_driving_double(directory: Path) -> Path:
    """The double as an on-disk package ``mx_driving`` under ``directory`` (for subprocesses)."""
    package = directory / "mx_driving"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(MX_DRIVING_DOUBLE)
    return package
