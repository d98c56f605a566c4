"""``npu_add_relu`` and ``npu_max_pool2d``.

``npu_add_relu(x, y)`` is ``relu(x + y)``; its backward passes the output gradient
where the output is positive, to both inputs (autograd sums it over broadcast
dimensions). ``npu_max_pool2d(x, kernel_size, stride, padding)`` is a 2-d max pool
(floor mode, no dilation) with no backward, as in the wheel (its Function defines
none: backward through it raises), and refuses, as the wheel's C++ entry does,
anything but kernel 3 / stride 2 / padding 1 on a 4-D float32 or float16 input of at
most 1024 channels, a multiple of 8 (float32) or 16 (float16). The wheel runs the fused op on Ascend910B/910C
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


#: What the wheel's C++ entry of npu_max_pool2d accepts (mx-driving 26.2): the one pool
#: its kernel hard-codes, 4-D float32/float16 input, at most 1024 channels, a multiple
#: of 8 (float32) or 16 (float16).
_POOL = (3, 2, 1)
_CHANNEL_MULTIPLE = {torch.float32: 8, torch.float16: 16}
_MAX_CHANNELS = 1024


def _check_pool(x: Any, kernel_size: Any, stride: Any, padding: Any) -> None:
    if (kernel_size, stride, padding) != _POOL:
        raise RuntimeError(
            "npu_max_pool2d: only kernel_size=3, stride=2, padding=1 are supported, got "
            f"{kernel_size}, {stride}, {padding}"
        )
    multiple = _CHANNEL_MULTIPLE.get(x.dtype)
    if multiple is None or x.dim() != 4:
        raise RuntimeError(
            f"npu_max_pool2d: x must be 4-D float32 or float16, got {x.dim()}-D {x.dtype}"
        )
    channels = x.shape[1]
    if channels > _MAX_CHANNELS or channels % multiple:
        raise RuntimeError(
            f"npu_max_pool2d: {channels} channels; at most {_MAX_CHANNELS}, a multiple of {multiple}"
        )


@public("npu_max_pool2d")
def npu_max_pool2d(x: Any, kernel_size: Any, stride: Any, padding: Any) -> Any:
    _check_pool(x, kernel_size, stride, padding)
    return raw_apply(MaxPool2d, x, kernel_size, stride, padding)


PUBLIC = {
    "npu_add_relu": applier("npu_add_relu", AddReluFunction),
    "npu_max_pool2d": npu_max_pool2d,
}
