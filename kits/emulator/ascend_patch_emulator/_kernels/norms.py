"""RMSNorm family: ``npu_rms_norm`` and ``npu_add_rms_norm``.

Formula (op docs): ``y = x / sqrt(mean(x², trailing gamma.dim() dims) + eps) * gamma``.
The reduction and the scaling run in float32 (float64 for float64 inputs) and
``y`` is cast back to the input dtype; the real kernel's intermediate precision is
not documented.
"""

from __future__ import annotations

from typing import Any

import torch

from . import compute_dtype
from . import kernel


def _rms(x: Any, gamma: Any, epsilon: float) -> tuple[Any, Any]:
    """(normalized * gamma in float32, rstd float32 with the normalized dims kept as 1)."""
    if gamma.dim() > x.dim() or tuple(x.shape[x.dim() - gamma.dim() :]) != tuple(gamma.shape):
        raise RuntimeError(
            f"gamma's shape {tuple(gamma.shape)} must equal the trailing dims of the input "
            f"{tuple(x.shape)}"
        )
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + epsilon)
    return x * rstd * gamma.to(x.dtype), rstd


@kernel("npu_rms_norm", differentiable=True, grad_outputs=(0,), nondifferentiable=(1,))
def rms_norm(self: Any, gamma: Any, epsilon: float = 1e-6) -> tuple[Any, Any]:
    """Returns ``(y, rstd)``; ``rstd`` does not require grad, as on the NPU."""
    y, rstd = _rms(self.to(compute_dtype(self)), gamma, epsilon)
    return y.to(self.dtype), rstd.float()


@kernel("npu_add_rms_norm")
def add_rms_norm(x1: Any, x2: Any, gamma: Any, epsilon: float = 1e-6) -> tuple[Any, Any, Any]:
    """Returns ``(y, rstd, x1 + x2)``; forward only (the real op has no derivative)."""
    wide = compute_dtype(x1)
    total = x1.to(wide) + x2.to(wide)
    y, rstd = _rms(total, gamma, epsilon)
    return y.to(x1.dtype), rstd.float(), total.to(x1.dtype)
