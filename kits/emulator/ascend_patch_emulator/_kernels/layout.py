"""Layout and data-movement ops: ``npu_confusion_transpose``, ``npu_format_cast``
(+ ``get_npu_format``), ``npu_scatter_nd_update``.

An NPU keeps a tensor's ACL storage format in its *storage* descriptor (torch_npu's
``NPUStorageDesc``), so views, ``detach()`` and in-place ops share it. The emulator
keeps the same record per storage (a weak map keyed on the untyped storage, so a
freed storage takes its record with it and new memory never inherits one); the data
stays in torch's own layout, since only the NPU's private layout would change.

The rules are torch_npu's ``FormatCastKernelNpu.cpp`` (aclop path): a cast to the
current format returns the input itself; a cast between base formats (ND, NCHW,
NHWC, NCDHW) relabels the input's storage in place and returns the input; any other
cast makes a new tensor whose format ``InferFormat::GuessStorageFormat`` fixes from
the storage's base sizes (NZ needs at least 2 dims, NCHW exactly 4, ...).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import torch

from . import kernel


__all__ = ["copy_format", "get_npu_format", "weak_ref_tensor"]


@kernel("npu_confusion_transpose", differentiable=True)
def confusion_transpose(
    self: Any, perm: Sequence[int], shape: Sequence[int], transpose_first: bool
) -> Any:
    """``permute(perm)`` then ``view(shape)``, or ``view(shape)`` then ``permute(perm)``."""
    if transpose_first:
        return self.permute(*perm).reshape(*shape).clone(memory_format=torch.contiguous_format)
    return self.reshape(*shape).permute(*perm).clone(memory_format=torch.contiguous_format)


_NCHW, _NHWC, _ND, _NZ, _NCDHW = 0, 1, 2, 29, 30
#: torch_npu's FormatHelper table: format -> its base format. Other ids (-1, 12, 16,
#: 35, 47) are ``torch_npu.Format`` members that torch_npu cannot cast to.
_BASE_OF = {
    3: _NCHW,  # NC1HWC0
    _ND: _ND,
    _NCHW: _NCHW,
    _NHWC: _NHWC,
    _NZ: _ND,
    4: _NCHW,  # FRACTAL_Z
    27: _NCDHW,  # NDHWC
    _NCDHW: _NCDHW,
    32: _NCDHW,  # NDC1HWC0
    33: _NCDHW,  # FRACTAL_Z_3D
    50: _ND,  # FRACTAL_NZ_C0_16 ... _C0_8
    51: _ND,
    52: _ND,
    53: _ND,
    54: _ND,
}


class _Desc(NamedTuple):
    """What the emulator keeps of an ``NPUStorageDesc``: the format and the base sizes."""

    npu_format: int
    base_sizes: tuple[int, ...]


#: untyped storage -> its descriptor; storages never cast have none (see _desc).
_descs: weakref.WeakKeyDictionary[Any, _Desc] = weakref.WeakKeyDictionary()


def _storage(tensor: Any) -> Any:
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage (sparse, some subclasses)
        return None


def _spans_storage(tensor: Any) -> bool:
    storage = _storage(tensor)
    return (
        storage is not None
        and tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.numel() * tensor.element_size() == storage.nbytes()
    )


def _guess_base_format(sizes: Sequence[int]) -> int:
    """``InferFormat::GuessBaseFormat``: what a new NPU tensor of ``sizes`` gets."""
    return {5: _NCDHW, 4: _NCHW}.get(len(sizes), _ND)


def _desc(tensor: Any) -> _Desc:
    """The tensor's storage descriptor; for a storage never cast, as torch_npu creates it.

    The storage's creation sizes are not recorded: those of the tensor a view was taken
    from (``_base``), else the tensor's own, stand in for them.
    """
    storage = _storage(tensor)
    found = _descs.get(storage) if storage is not None else None
    if found is not None:
        return found
    base = getattr(tensor, "_base", None)
    sizes = tuple((tensor if base is None else base).shape)
    return _Desc(_guess_base_format(sizes), sizes)


def _set_desc(tensor: Any, desc: _Desc) -> None:
    storage = _storage(tensor)
    if storage is not None:
        _descs[storage] = desc


def _base_of(acl_format: int) -> int:
    base = _BASE_OF.get(acl_format)
    if base is None:
        raise RuntimeError(f"unknown format type:{acl_format}")
    return base


_warned_nz_rank = False


def _storage_format(base_sizes: Sequence[int], acl_format: int) -> int:
    """``GuessStorageFormat`` then ``GuessFormatUnit``: the format a new tensor really gets."""
    global _warned_nz_rank
    dim = len(base_sizes)
    base = _base_of(acl_format)
    if acl_format == _NZ and dim < 2:
        if not _warned_nz_rank:
            _warned_nz_rank = True
            warnings.warn(
                "Cannot create tensor with NZ format while dim < 2, "
                "tensor will be created with ND format.",
                stacklevel=4,
            )
        fixed = _ND
    elif base == acl_format == _NCDHW:
        fixed = {4: _NCHW, 5: _NCDHW}.get(dim, _ND)
    elif (acl_format == _NCHW and dim != 4) or (
        # scalars and shape [1] stay ND: operators treat them as scalars
        dim == 0 or (dim == 1 and base_sizes[0] == 1 and base == _ND)
    ):
        fixed = _ND
    else:
        fixed = acl_format
    if dim == 4 and (fixed == _ND or _BASE_OF[fixed] == _NCDHW):
        return _NCHW  # GuessFormatUnit: "4 dim tensor must be NCHW"
    return fixed


def _cast(self: Any, acl_format: int) -> Any:
    """``npu_format_cast``: ``self`` itself when no data moves, else a new tensor."""
    target = int(acl_format)
    desc = _desc(self)
    if target == _NZ and desc.npu_format == _ND and len(desc.base_sizes) < 2:
        # torch_npu 2.x: rank-0/1 storages cannot be NZ; the cast is a no-op.
        target = _ND
    if desc.npu_format == target:
        return self
    if _base_of(desc.npu_format) == desc.npu_format and _base_of(target) == target:
        # format_cast_as_base_format: relabel the storage in place, return self.
        _set_desc(self, desc._replace(npu_format=target))
        return self
    out = self.clone(memory_format=torch.contiguous_format)
    _set_desc(out, _Desc(_storage_format(desc.base_sizes, target), desc.base_sizes))
    return out


@kernel("npu_format_cast", differentiable=True)
def format_cast(
    self: Any, acl_format: int, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    return _cast(self, acl_format)


@kernel("npu_format_cast.Tensor", differentiable=True)
def format_cast_like(
    self: Any, dst: Any, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    return _cast(self, get_npu_format(dst))


@kernel("npu_format_cast_")
def format_cast_inplace_like(
    self: Any, src: Any, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    """``src``'s values written into ``self``, which keeps its own format (torch_npu's)."""
    return self.copy_(src)


@kernel("npu_format_cast_.acl_format")
def format_cast_inplace(
    self: Any, acl_format: int, customize_dtype: int | None = None, input_dtype: int | None = None
) -> Any:
    target = int(acl_format)
    desc = _desc(self)
    if desc.npu_format == target:
        return self
    if _base_of(desc.npu_format) == desc.npu_format and _base_of(target) == target:
        _set_desc(self, desc._replace(npu_format=target))
        return self
    fixed = _storage_format(desc.base_sizes, target)
    # torch_npu moves self onto a new storage in the new format; other views of the
    # old storage keep the old one.
    storage = self.untyped_storage().clone()
    self.set_(storage, self.storage_offset(), self.shape, self.stride())
    _set_desc(self, _Desc(fixed, desc.base_sizes))
    return self


@kernel("get_npu_format")
def get_npu_format(self: Any) -> int:
    """The ACL format of the tensor's storage (torch_npu's ``npu_desc_.npu_format_``)."""
    return _desc(self).npu_format


def copy_format(source: Any, target: Any) -> None:
    """Give storage ``target`` the format record of storage ``source`` (if it has one)."""
    found = _descs.get(source)
    if found is not None:
        _descs[target] = found


def weak_ref_tensor(tensor: Any) -> Any:
    """``torch_npu._C._weak_ref_tensor``: the same memory, sizes, strides and offset, not owned.

    As torch_npu's, the result's storage is a new, non-owning storage over the same
    bytes, carrying a copy of the source storage's format record; it does not keep
    the memory alive (reading it after the source is freed reads freed memory).
    """
    storage = tensor.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), tensor.device, storage.nbytes()
    )
    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    out.set_(alias, tensor.storage_offset(), tensor.shape, tensor.stride())
    found = _descs.get(storage)
    if found is not None:
        _descs[out.untyped_storage()] = found
    return out


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
