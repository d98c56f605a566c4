"""``npu_add_relu`` and ``npu_max_pool2d``.

``npu_add_relu(x, y)`` is ``relu(x + y)``; its backward passes the output gradient
where the output is positive, to both inputs (autograd sums it over broadcast
dimensions). ``npu_max_pool2d(x, kernel_size, stride, padding)`` is a 2-d max pool
(floor mode, no dilation) with no backward, as in the wheel (its Function defines
none: backward through it raises). The wheel runs the fused op on Ascend910B/910C
and plain ``max_pool2d`` on Ascend950, and raises on other chips; the emulator
computes the pool on every emulated device.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import MxFunction
from . import applier
from . import public
from . import raw_apply


__all__ = ["PUBLIC", "AddReluFunction", "MaxPool2d"]


class AddReluFunction(MxFunction):
    """The Function behind ``mx_driving.npu_add_relu``."""

    @staticmethod
    def forward(ctx: Any, x: Any, y: Any) -> Any:
        out = torch.relu(x + y)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> tuple[Any, Any]:
        (out,) = ctx.saved_tensors
        grad = grad_output * (out > 0)
        return grad, grad


class MaxPool2d(MxFunction):
    """The Function behind ``mx_driving.npu_max_pool2d`` (forward only)."""

    @staticmethod
    def forward(ctx: Any, x: Any, kernel_size: Any, stride: Any, padding: Any) -> Any:
        return F.max_pool2d(x, kernel_size, stride, padding)


@public("npu_max_pool2d")
def npu_max_pool2d(x: Any, kernel_size: Any, stride: Any, padding: Any) -> Any:
    return raw_apply(MaxPool2d, x, kernel_size, stride, padding)


PUBLIC = {
    "npu_add_relu": applier("npu_add_relu", AddReluFunction),
    "npu_max_pool2d": npu_max_pool2d,
}
