"""What the transformers plugin hands torch_npu's ops, checked against their documented envelopes.

The emulator's kernels compute ``npu_rotary_mul``, ``npu_swiglu`` and ``npu_rms_norm``
for any shape, layout, stride and size; the real ops document narrower ones. Only the
plugin's runtime checks keep calls inside, so these tests record every call a
replacement makes (a ``TorchFunctionMode``: it sees the op's own arguments, strides
included, whatever name the plugin bound the op under) and check each against the
documented envelope:

* ``npu_rotary_mul(x, r1, r2, rotary_mode)``: x 3-D or 4-D, fp16/bf16/fp32 (r1, r2 of
  x's dtype: the documentation names no mixed pair), r1 and r2 of one shape, the last
  dim ``D`` even and below 896, ``rotary_mode`` half or interleave, no ``rotate``
  matrix, and the layouts with their broadcasts: ``11SD|B1SD|BNSD`` (x BNSD),
  ``1S1D|BS1D|BSND`` (BSND), ``S11D|SB1D|SBND`` (SBND), ``T1D|TND`` (TND), B and N
  below 1000. No contiguity rule is documented (recorded, not checked); nor are r1/r2's
  values checked against the documented [-1, 1] (the plugin does not check them, see
  its docs).
* ``npu_swiglu(x, dim)``: 1-8 dims, the size along ``dim`` even, fp32/fp16/bf16,
  contiguous.
* ``npu_rms_norm(x, gamma, epsilon)``: 2-8 dims, gamma's shape the trailing dims of x,
  (x, gamma) dtypes one of (fp16, fp32), (bf16, fp32), (fp16, fp16), (bf16, bf16),
  (fp32, fp32) (Atlas A2/A3).

The emulator itself is left permissive on purpose: it cannot know what a device
refuses beyond the documentation, and other plugins' tests rely on its kernels as
formulas.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode


__all__ = [
    "LAYOUTS",
    "OpCall",
    "OpEnvelope",
    "StridedResults",
    "op_envelope",
    "restride",
    "rms_norm_violations",
    "rotary_mul_violations",
    "swiglu_violations",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_LIMIT = 1000  # B and N of npu_rotary_mul's layouts


def _rotary_layouts(x: Any, r: tuple[int, ...]) -> list[str]:
    """The documented layouts of a 4-D (or 3-D) ``x`` whose broadcast form ``r`` is; B, N < 1000."""
    if x.dim() == 3:
        t, n, d = x.shape
        return ["TND"] if r in ((t, 1, d), (t, n, d)) and n < _LIMIT else []
    a, b, c, d = x.shape
    forms = {  # layout: ((B, N), broadcast forms)
        "BNSD": ((a, b), ((1, 1, c, d), (a, 1, c, d), (a, b, c, d))),
        "BSND": ((a, c), ((1, b, 1, d), (a, b, 1, d), (a, b, c, d))),
        "SBND": ((b, c), ((a, 1, 1, d), (a, b, 1, d), (a, b, c, d))),
    }
    return [
        name
        for name, ((batch, heads), shapes) in forms.items()
        if r in shapes and batch < _LIMIT and heads < _LIMIT
    ]


def rotary_mul_violations(
    x: Any, r1: Any, r2: Any, rotary_mode: str = "half", rotate: Any = None
) -> list[str]:
    """Why a call of ``npu_rotary_mul`` lies outside its documented envelope (empty: inside)."""
    problems = []
    if x.dim() not in (3, 4):
        return [f"x is {x.dim()}-D, not 3-D or 4-D"]
    if x.dtype not in _FLOATS or r1.dtype != x.dtype or r2.dtype != x.dtype:
        problems.append(f"dtypes x {x.dtype}, r1 {r1.dtype}, r2 {r2.dtype}")
    if r1.shape != r2.shape:
        problems.append(f"r1 {tuple(r1.shape)} and r2 {tuple(r2.shape)} differ")
    width = x.shape[-1]
    if width % 2 or not 0 < width < 896:
        problems.append(f"D = {width}: not even, or not in 1..895")
    if rotary_mode not in ("half", "interleave") or rotate is not None:
        problems.append(f"rotary_mode {rotary_mode!r} with rotate {rotate is not None}")
    if r1.dim() != x.dim() or not _rotary_layouts(x, tuple(r1.shape)):
        problems.append(
            f"x {tuple(x.shape)} with r1 {tuple(r1.shape)}: no documented layout "
            "(BNSD/BSND/SBND/TND and their broadcasts, B and N below 1000)"
        )
    return problems


def swiglu_violations(x: Any, dim: int = -1) -> list[str]:
    """Why a call of ``npu_swiglu`` lies outside its documented envelope (empty: inside)."""
    if not 1 <= x.dim() <= 8:
        return [f"x is {x.dim()}-D, not 1-8 dims"]
    problems = []
    if x.dtype not in _FLOATS:
        problems.append(f"dtype {x.dtype}")
    if x.shape[dim] % 2:
        problems.append(f"size {x.shape[dim]} along dim {dim} is odd")
    if not x.is_contiguous():
        problems.append(f"not contiguous: shape {tuple(x.shape)}, strides {x.stride()}")
    return problems


_RMS_NORM_DTYPES = {
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
}


def rms_norm_violations(x: Any, gamma: Any, epsilon: float = 1e-6) -> list[str]:
    """Why a call of ``npu_rms_norm`` lies outside its documented envelope (empty: inside)."""
    problems = []
    if not 2 <= x.dim() <= 8:
        problems.append(f"x is {x.dim()}-D, not 2-8 dims")
    trailing = tuple(x.shape[x.dim() - gamma.dim() :]) if 0 < gamma.dim() <= x.dim() else None
    if trailing != tuple(gamma.shape):
        problems.append(f"gamma {tuple(gamma.shape)} is not x's trailing dims {tuple(x.shape)}")
    if (x.dtype, gamma.dtype) not in _RMS_NORM_DTYPES:
        problems.append(f"dtypes x {x.dtype}, gamma {gamma.dtype}")
    return problems


_CHECKS: dict[str, Callable[..., list[str]]] = {
    "npu_rotary_mul": rotary_mul_violations,
    "npu_swiglu": swiglu_violations,
    "npu_rms_norm": rms_norm_violations,
}


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), str(value.dtype).removeprefix("torch."))
    return value


@dataclasses.dataclass(frozen=True)
class OpCall:
    """One recorded call: the op, each argument as (shape, strides, dtype), and what broke."""

    op: str
    arguments: tuple[Any, ...]
    keywords: dict[str, Any]
    violations: tuple[str, ...]


class OpEnvelope(TorchFunctionMode):
    """Records every call of the checked ops made while active (``with OpEnvelope() as calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[OpCall] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        # torch.ops.npu.<op> (and its overloads) print as "npu.<op>[.<overload>]".
        namespace, _, rest = str(func).partition(".")
        name = rest.partition(".")[0]
        check = _CHECKS.get(name) if namespace == "npu" else None
        if check is not None:
            self.calls.append(
                OpCall(
                    name,
                    tuple(_describe(a) for a in args),
                    {k: _describe(v) for k, v in kwargs.items()},
                    tuple(check(*args, **kwargs)),
                )
            )
        return func(*args, **kwargs)

    def of(self, op: str) -> list[OpCall]:
        """The recorded calls of ``op``."""
        return [call for call in self.calls if call.op == op]

    def outside(self) -> list[OpCall]:
        """The recorded calls outside their op's documented envelope."""
        return [call for call in self.calls if call.violations]

    def assert_inside(self) -> None:
        """Fail naming every recorded call outside its envelope."""
        bad = self.outside()
        assert not bad, "calls outside the documented envelopes:\n" + "\n".join(map(str, bad))


#: Memory layouts :func:`restride` gives.
LAYOUTS = ["contiguous", "transposed", "strided"]


def restride(tensor: Any, layout: str) -> Any:
    """The same values (and gradient path) in another memory layout (one of :data:`LAYOUTS`)."""
    if layout == "transposed" and tensor.dim() >= 2:
        return tensor.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "strided":  # every stride doubled: not even dense
        return torch.stack((tensor, tensor), -1)[..., 0]
    return tensor


class StridedResults(TorchFunctionMode):
    """While active, ``F.linear``'s and ``bmm``'s results come back strided, same values.

    What a LoRA or quantized layer in a projection's place may return.
    """

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if func in (torch.nn.functional.linear, torch.bmm) and isinstance(result, torch.Tensor):
            return restride(result, "strided")
        return result


@pytest.fixture
def op_envelope(npu_emulator: Any) -> Iterator[OpEnvelope]:
    """Under the emulator, every checked op call of the test recorded; asserted inside at the end."""
    with OpEnvelope() as envelope:
        yield envelope
    envelope.assert_inside()
