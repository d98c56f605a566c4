"""diffusers' RMS norms on the NPU: ``torch_npu.npu_rms_norm``.

* ``diffusers.models.normalization.RMSNorm``: diffusers itself calls ``npu_rms_norm``
  when it finds torch_npu's distribution -- but 0.35.1 does so even without a weight
  (``elementwise_affine=False``), where the op needs one and fails (fixed in later
  releases), and it finds no distribution under ascend-patch's emulator. The
  replacement takes the op with a weight and diffusers' own formula without one, so
  every diffusers version computes the same on the NPU.
* ``diffusers.models.normalization.MochiRMSNorm`` (same formula, the result cast back to
  the input dtype): never fused by diffusers.

Both follow diffusers' dtype rules: RMSNorm casts the input to a half-precision weight's
dtype; MochiRMSNorm returns the input dtype. Runtime check: NPU input, and for the op a
weight of the input's dtype after that rule, float16/bfloat16/float32, 2 to 8 dims (else
the original runs: a float64 norm keeps its precision).

Importing this module imports neither torch nor diffusers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = ["mochi_rms_norm_forward", "norm_patches", "rms_norm_forward"]

_MODULE = "diffusers.models.normalization"
_HALF = ("torch.float16", "torch.bfloat16")
# What npu_rms_norm takes: float16, bfloat16, float32 inputs of 2 to 8 dims (a float64
# input would lose precision in the float32 kernel on the emulator and fail on an NPU).
_OP_DTYPES = (*_HALF, "torch.float32")


def _op_input(hidden_states: Any, dtype: Any) -> bool:
    return str(dtype) in _OP_DTYPES and 2 <= hidden_states.dim() <= 8


def _rms(hidden_states: Any, eps: float) -> Any:
    import torch

    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return hidden_states * torch.rsqrt(variance + eps)


def rms_norm_forward(self: Any, hidden_states: Any) -> Any:
    """``RMSNorm.forward`` with ``npu_rms_norm`` (diffusers' formula when there is no weight)."""
    weight = self.weight
    if weight is None:  # the op needs a gamma: diffusers' own formula
        return _rms(hidden_states, self.eps).to(hidden_states.dtype)
    import torch_npu

    if str(weight.dtype) in _HALF:
        hidden_states = hidden_states.to(weight.dtype)
    hidden_states = torch_npu.npu_rms_norm(hidden_states, weight, epsilon=self.eps)[0]
    if self.bias is not None:
        hidden_states = hidden_states + self.bias
    return hidden_states


def _rms_norm_check(self: Any, hidden_states: Any) -> bool:
    if not getattr(hidden_states, "is_npu", False):
        return False
    weight = self.weight
    if weight is None:
        return True  # diffusers' own formula, no op
    dtype = weight.dtype if str(weight.dtype) in _HALF else hidden_states.dtype
    return weight.dtype == dtype and _op_input(hidden_states, dtype)


def mochi_rms_norm_forward(self: Any, hidden_states: Any) -> Any:
    """``MochiRMSNorm.forward`` with ``npu_rms_norm`` (weight given, same dtype)."""
    import torch
    import torch_npu

    out = torch_npu.npu_rms_norm(hidden_states.to(torch.float32), self.weight.float(), self.eps)[0]
    return out.to(hidden_states.dtype)


def _mochi_check(self: Any, hidden_states: Any) -> bool:
    return bool(
        getattr(hidden_states, "is_npu", False)
        and self.weight is not None
        and _op_input(hidden_states, hidden_states.dtype)
    )


def norm_patches(options: Any = None) -> Iterator[AtomicPatch]:
    note = "torch_npu.npu_rms_norm"
    yield AtomicPatch(
        f"{_MODULE}.RMSNorm.forward", rms_norm_forward, runtime_check=_rms_norm_check, note=note
    )
    yield AtomicPatch(
        f"{_MODULE}.MochiRMSNorm.forward",
        mochi_rms_norm_forward,
        runtime_check=_mochi_check,
        note=note,
    )
