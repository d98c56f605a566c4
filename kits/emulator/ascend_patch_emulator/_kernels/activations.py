"""Activations: gated (``npu_swiglu``, ``npu_geglu``) and plain (``fast_gelu``,
``npu_gelu``, ``npu_silu``, ``npu_mish``), and the in-place ``npu_silu_``.

All compute in float32 (float64 for float64 inputs) and return the input dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import compute_dtype
from . import kernel


def _wide(x: Any) -> Any:
    return x.to(compute_dtype(x))


def _halves(x: Any, dim: int) -> tuple[Any, Any]:
    if x.dim() == 0 or x.shape[dim] % 2:
        raise RuntimeError(
            f"the input's size along dim {dim} must be even, got shape {tuple(x.shape)}"
        )
    left, right = _wide(x).chunk(2, dim)
    return left, right


@kernel("npu_swiglu", differentiable=True)
def swiglu(self: Any, dim: int = -1) -> Any:
    """``a, b = x.chunk(2, dim)``; ``silu(a) * b``."""
    a, b = _halves(self, dim)
    return (F.silu(a) * b).to(self.dtype)


_GELU_APPROXIMATION = {0: "none", 1: "tanh"}


@kernel("npu_geglu", differentiable=True, grad_outputs=(0,), nondifferentiable=(1,))
def geglu(
    self: Any, dim: int = -1, approximate: int = 1, activate_left: bool = False
) -> tuple[Any, Any]:
    """Returns ``(out, gelu)``: ``l * gelu(r)``, or ``gelu(l) * r`` with ``activate_left``."""
    if approximate not in _GELU_APPROXIMATION:
        raise RuntimeError(
            f"npu_geglu: approximate must be 0 (none) or 1 (tanh), got {approximate}"
        )
    left, right = _halves(self, dim)
    gated, other = (left, right) if activate_left else (right, left)
    gelu = F.gelu(gated, approximate=_GELU_APPROXIMATION[approximate])
    return (gelu * other).to(self.dtype), gelu.to(self.dtype)


@kernel("fast_gelu", "npu_fast_gelu", differentiable=True)
def fast_gelu(self: Any) -> Any:
    """``x * sigmoid(1.702 * x)`` (the Atlas A2/A3 formula)."""
    x = _wide(self)
    return (x * torch.sigmoid(1.702 * x)).to(self.dtype)


@kernel("npu_gelu", differentiable=True)
def gelu(self: Any, approximate: str = "none") -> Any:
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"npu_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return F.gelu(_wide(self), approximate=approximate).to(self.dtype)


@kernel("npu_silu", differentiable=True)
def silu(self: Any) -> Any:
    return F.silu(_wide(self)).to(self.dtype)


@kernel("npu_silu_")
def silu_(self: Any) -> Any:
    """In place: writes silu into ``self`` and returns ``self`` itself, as torch_npu does."""
    return self.copy_(silu(self))


@kernel("npu_mish", differentiable=True)
def mish(self: Any) -> Any:
    """``x * tanh(softplus(x))``."""
    return F.mish(_wide(self)).to(self.dtype)
