"""Layout and data-movement ops: ``npu_confusion_transpose``, ``npu_format_cast``
(+ ``get_npu_format``), ``npu_scatter_nd_update``.

``npu_format_cast`` changes only the NPU's private storage layout, so on the CPU it
is an identity that remembers the requested format for ``get_npu_format``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import kernel


@kernel("npu_confusion_transpose", differentiable=True)
def confusion_transpose(
    self: Any, perm: Sequence[int], shape: Sequence[int], transpose_first: bool
) -> Any:
    """``permute(perm)`` then ``view(shape)``, or ``view(shape)`` then ``permute(perm)``."""
    if transpose_first:
        return self.permute(*perm).reshape(*shape).clone(memory_format=torch.contiguous_format)
    return self.reshape(*shape).permute(*perm).clone(memory_format=torch.contiguous_format)


#: The ACL format each emulated tensor was cast to (``torch_npu.Format`` ids).
_formats: Any = WeakIdKeyDictionary()
_ND, _NCHW = 2, 0


def _remember(tensor: Any, acl_format: int) -> Any:
    _formats[tensor] = int(acl_format)
    return tensor


@kernel("npu_format_cast", differentiable=True)
def format_cast(
    self: Any, acl_format: int, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    return _remember(self.clone(), acl_format)


@kernel("npu_format_cast.Tensor", differentiable=True)
def format_cast_like(
    self: Any, dst: Any, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    return _remember(self.clone(), get_npu_format(dst))


@kernel("npu_format_cast_")
def format_cast_inplace_like(
    self: Any, src: Any, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    return _remember(self, get_npu_format(src))


@kernel("npu_format_cast_.acl_format")
def format_cast_inplace(
    self: Any, acl_format: int, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    return _remember(self, acl_format)


@kernel("get_npu_format")
def get_npu_format(self: Any) -> int:
    """The format a cast gave the tensor; else NCHW for 4-D tensors and ND otherwise."""
    found = _formats.get(self)
    if found is not None:
        return int(found)
    return _NCHW if self.dim() == 4 else _ND


def _scatter_nd(target: Any, indices: Any, updates: Any) -> Any:
    if indices.dim() < 2:
        raise RuntimeError(
            f"npu_scatter_nd_update: indices must be at least 2-D, got {tuple(indices.shape)}"
        )
    if indices.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(
            f"npu_scatter_nd_update: indices must be int32/int64, got {indices.dtype}"
        )
    depth = indices.shape[-1]
    expected = (*indices.shape[:-1], *target.shape[depth:])
    if tuple(updates.shape) != expected:
        raise RuntimeError(
            f"npu_scatter_nd_update: updates shape {tuple(updates.shape)} must be "
            f"indices.shape[:-1] + self.shape[{depth}:] = {expected}"
        )
    flat = indices.reshape(-1, depth).long()
    bounds = torch.tensor(target.shape[:depth])
    if bool(((flat < 0) | (flat >= bounds)).any()):
        raise RuntimeError("npu_scatter_nd_update: an index is out of bounds")
    target[tuple(flat.T)] = updates.reshape(-1, *target.shape[depth:]).to(target.dtype)
    return target


@kernel("npu_scatter_nd_update")
def scatter_nd_update(self: Any, indices: Any, updates: Any) -> Any:
    """TF ScatterNdUpdate: ``out[indices[i]] = updates[i]`` on a copy of ``self``."""
    return _scatter_nd(self.clone(), indices, updates)


@kernel("npu_scatter_nd_update_")
def scatter_nd_update_(self: Any, indices: Any, updates: Any) -> Any:
    return _scatter_nd(self, indices, updates)
