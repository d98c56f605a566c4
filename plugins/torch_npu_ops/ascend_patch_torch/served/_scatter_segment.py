"""torch_scatter's ``segment_*_coo`` / ``segment_*_csr`` and ``gather_coo`` / ``gather_csr``.

Part of :mod:`ascend_patch_torch.served.torch_scatter`, which re-exports every public
name; import them from there. Each segment reduction is a scatter over the segment
index of every element, so the kernels are those of :mod:`._scatter_ops`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._scatter_ops import _scatter_arg
from ._scatter_ops import broadcast
from ._scatter_ops import scatter_mean
from ._scatter_ops import scatter_sum


__all__ = [
    "gather_coo",
    "gather_csr",
    "segment_add_coo",
    "segment_add_csr",
    "segment_coo",
    "segment_csr",
    "segment_max_coo",
    "segment_max_csr",
    "segment_mean_coo",
    "segment_mean_csr",
    "segment_min_coo",
    "segment_min_csr",
    "segment_sum_coo",
    "segment_sum_csr",
]

# --------------------------------------------------------------------------- segment (coo)


def _coo_index(src: Tensor, index: Tensor) -> tuple[Tensor, int]:
    if src.dim() < index.dim():
        raise ValueError(f"segment_coo: index has {index.dim()} dims, more than src ({src.dim()})")
    dim = index.dim() - 1
    expanded = index.expand(*src.shape[: dim + 1])
    return expanded, dim


def _coo_size(index: Tensor, dim: int, dim_size: int | None) -> int | None:
    if dim_size is not None or index.numel() == 0:
        return dim_size
    return int(index.select(dim, index.size(dim) - 1).max()) + 1


def segment_sum_coo(
    src: Tensor, index: Tensor, out: Tensor | None = None, dim_size: int | None = None
) -> Tensor:
    index, dim = _coo_index(src, index)
    return scatter_sum(src, index, dim, out, _coo_size(index, dim, dim_size))


def segment_add_coo(
    src: Tensor, index: Tensor, out: Tensor | None = None, dim_size: int | None = None
) -> Tensor:
    return segment_sum_coo(src, index, out, dim_size)


def segment_mean_coo(
    src: Tensor, index: Tensor, out: Tensor | None = None, dim_size: int | None = None
) -> Tensor:
    index, dim = _coo_index(src, index)
    return scatter_mean(src, index, dim, out, _coo_size(index, dim, dim_size))


def segment_min_coo(
    src: Tensor, index: Tensor, out: Tensor | None = None, dim_size: int | None = None
) -> tuple[Tensor, Tensor]:
    index, dim = _coo_index(src, index)
    return _scatter_arg(src, index, dim, out, _coo_size(index, dim, dim_size), "amin")


def segment_max_coo(
    src: Tensor, index: Tensor, out: Tensor | None = None, dim_size: int | None = None
) -> tuple[Tensor, Tensor]:
    index, dim = _coo_index(src, index)
    return _scatter_arg(src, index, dim, out, _coo_size(index, dim, dim_size), "amax")


def segment_coo(
    src: Tensor,
    index: Tensor,
    out: Tensor | None = None,
    dim_size: int | None = None,
    reduce: str = "sum",
) -> Tensor:
    if reduce in ("sum", "add"):
        return segment_sum_coo(src, index, out, dim_size)
    if reduce == "mean":
        return segment_mean_coo(src, index, out, dim_size)
    if reduce == "min":
        return segment_min_coo(src, index, out, dim_size)[0]
    if reduce == "max":
        return segment_max_coo(src, index, out, dim_size)[0]
    raise ValueError(
        f"segment_coo: reduce must be 'sum', 'add', 'mean', 'min' or 'max', got {reduce!r}"
    )


def gather_coo(src: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor:
    dim = index.dim() - 1
    index = index.expand(*src.shape[:dim], index.size(dim))
    gathered = src.gather(dim, broadcast(index, _with_size(src, dim, index.size(dim)), dim))
    return gathered if out is None else out.copy_(gathered)


# --------------------------------------------------------------------------- segment (csr)


def _with_size(src: Tensor, dim: int, size: int) -> Tensor:
    """A zero-stride tensor shaped like ``src`` with ``size`` along ``dim`` (for broadcast())."""
    shape = list(src.shape)
    shape[dim] = size
    return src.new_empty(()).expand(shape)


def _csr_segments(src: Tensor, indptr: Tensor, extent: int) -> tuple[Tensor, int, int]:
    """For each position ``e < extent`` along the segment dim: its segment, or N if none."""
    if src.dim() < indptr.dim():
        raise ValueError(
            f"segment_csr: indptr has {indptr.dim()} dims, more than src ({src.dim()})"
        )
    dim = indptr.dim() - 1
    indptr = indptr.expand(*src.shape[:dim], indptr.size(dim)).contiguous()
    segments = max(indptr.size(dim) - 1, 0)
    positions = torch.arange(extent, device=indptr.device, dtype=indptr.dtype)
    positions = positions.expand(*indptr.shape[:dim], extent).contiguous()
    found = torch.searchsorted(indptr, positions, right=True) - 1
    # Positions before the first pointer or past the last belong to no segment.
    found = torch.where((found < 0) | (found >= segments), segments, found)
    return found, dim, segments


def _segment_csr(
    src: Tensor, indptr: Tensor, reduce: str
) -> tuple[Tensor, Tensor | None, int, int]:
    index, dim, segments = _csr_segments(src, indptr, src.size(indptr.dim() - 1))
    if reduce in ("amax", "amin"):
        values, arg = _scatter_arg(src, index, dim, None, segments + 1, reduce)
        return values.narrow(dim, 0, segments), arg.narrow(dim, 0, segments), dim, segments
    if reduce == "sum":
        values = scatter_sum(src, index, dim, None, segments + 1)
    else:
        values = scatter_mean(src, index, dim, None, segments + 1)
    return values.narrow(dim, 0, segments), None, dim, segments


def segment_sum_csr(src: Tensor, indptr: Tensor, out: Tensor | None = None) -> Tensor:
    values = _segment_csr(src, indptr, "sum")[0]
    return values if out is None else out.copy_(values)


def segment_add_csr(src: Tensor, indptr: Tensor, out: Tensor | None = None) -> Tensor:
    return segment_sum_csr(src, indptr, out)


def segment_mean_csr(src: Tensor, indptr: Tensor, out: Tensor | None = None) -> Tensor:
    values = _segment_csr(src, indptr, "mean")[0]
    return values if out is None else out.copy_(values)


def segment_min_csr(
    src: Tensor, indptr: Tensor, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    values, arg, _, _ = _segment_csr(src, indptr, "amin")
    assert arg is not None
    return (values if out is None else out.copy_(values)), arg


def segment_max_csr(
    src: Tensor, indptr: Tensor, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    values, arg, _, _ = _segment_csr(src, indptr, "amax")
    assert arg is not None
    return (values if out is None else out.copy_(values)), arg


def segment_csr(
    src: Tensor, indptr: Tensor, out: Tensor | None = None, reduce: str = "sum"
) -> Tensor:
    if reduce in ("sum", "add"):
        return segment_sum_csr(src, indptr, out)
    if reduce == "mean":
        return segment_mean_csr(src, indptr, out)
    if reduce == "min":
        return segment_min_csr(src, indptr, out)[0]
    if reduce == "max":
        return segment_max_csr(src, indptr, out)[0]
    raise ValueError(
        f"segment_csr: reduce must be 'sum', 'add', 'mean', 'min' or 'max', got {reduce!r}"
    )


def gather_csr(src: Tensor, indptr: Tensor, out: Tensor | None = None) -> Tensor:
    dim = indptr.dim() - 1
    extent = int(indptr.flatten()[-1]) if src.numel() > 0 else 0
    if out is not None:
        extent = out.size(dim)
    index, dim, segments = _csr_segments(src, indptr, extent)
    index = index.clamp(max=max(segments - 1, 0))
    gathered = src.gather(dim, broadcast(index, _with_size(src, dim, extent), dim))
    return gathered if out is None else out.copy_(gathered)
