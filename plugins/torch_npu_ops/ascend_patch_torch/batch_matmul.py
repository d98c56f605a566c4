"""BatchMatmul: batched matrix-vector products ``a @ b`` with ``b[..., K, 1]`` as mul + sum.

On the NPU a 4- to 7-d ``matmul`` whose right operand is a column runs on the cube
unit with one useful output column; the same product as an elementwise multiply
and a reduction runs on the vector unit. This is the DrivingSDK patcher's patch (``mx_driving``
``npu_batch_matmul``: fp16/bf16 computed in fp32), with its domain: ranks 4..7,
equal ranks, broadcastable batch dimensions, ``a`` square with ``a[-1] == b[-2]``,
``b[-1] == 1``.

Fixed from the DrivingSDK patcher: a numpy (or any non-tensor) right operand goes to the
original (the DrivingSDK patcher's check crashed on it); ``out=`` goes to the original (the
DrivingSDK patcher's replacement had no ``out``); the result keeps the input dtype.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from .runtime import npu_runtime_importable


__all__ = ["batch_matmul_patches", "batch_matvec", "is_batched_matvec"]

_types: tuple[Any, tuple[Any, ...]] | None = None


def _torch_types() -> tuple[Any, tuple[Any, ...]]:
    global _types
    if _types is None:
        torch = sys.modules["torch"]
        _types = (torch.Tensor, (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    return _types


def is_batched_matvec(a: Any, b: Any, *args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: ``a @ b`` is in the domain the mul + sum form serves."""
    if args or kwargs:  # out=, or an unexpected call form: leave it to torch
        return False
    tensor, floating = _torch_types()
    if type(a) is not tensor or type(b) is not tensor:
        return False
    if a.dtype is not b.dtype or a.dtype not in floating:
        return False
    rank = a.dim()
    if not 4 <= rank <= 7 or b.dim() != rank:
        return False
    sa, sb = a.shape, b.shape
    if not (sa[-2] == sa[-1] == sb[-2] and sb[-1] == 1):
        return False
    return all(x == y or x == 1 or y == 1 for x, y in zip(sa[:-2], sb[:-2], strict=True))


def batch_matvec(a: Any, b: Any) -> Any:
    """``a @ b`` for ``b[..., K, 1]``: ``(a * b^T).sum(-1)``, accumulated in fp32 for fp16/bf16."""
    dtype = a.dtype
    torch = sys.modules["torch"]
    if dtype in (torch.float16, torch.bfloat16):
        return (a.float() * b.float().transpose(-1, -2)).sum(-1, keepdim=True).to(dtype)
    return (a * b.transpose(-1, -2)).sum(-1, keepdim=True)


def batch_matmul_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.BatchMatmul`."""
    for target in ("torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__"):
        yield AtomicPatch(
            target,
            batch_matvec,
            runtime_check=is_batched_matvec,
            precheck=npu_runtime_importable,
        )
