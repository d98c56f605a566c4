"""A ``torch_scatter``-compatible module for machines where torch_scatter cannot be built (NPU).

Same names, signatures and results as torch_scatter 2.1.2: ``scatter`` and
``scatter_{sum,add,mul,mean,min,max}`` (min/max return ``(out, argmax)``, with
``src.size(dim)`` as the argmax of empty slots and 0 as their value),
``segment_*_csr`` / ``segment_*_coo``, ``gather_csr`` / ``gather_coo``,
``scatter_softmax`` / ``scatter_log_softmax`` / ``scatter_std`` / ``scatter_logsumexp``,
and the ``torch_scatter.utils`` / ``torch_scatter.composite`` submodules.
Gradients match too: min/max send the gradient to the arg element only.

Kernels: ``mx_driving.scatter_add`` / ``scatter_mean`` / ``scatter_max`` when mx_driving
is importable and the input is a float32 NPU tensor in their domain (the seed's
patch called ``scatter_max`` with five arguments for its three, and cast every input
to float32); otherwise ``Tensor.scatter_add_`` / ``scatter_reduce_``, which torch_npu
runs on the NPU.

Served as ``torch_scatter`` by a ``ReplaceImport`` rule when torch_scatter is not
installed (see :func:`build`); when it is installed, :class:`TorchScatter` patches its
functions to these for NPU tensors only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


__all__ = [
    "broadcast",
    "build",
    "gather_coo",
    "gather_csr",
    "scatter",
    "scatter_add",
    "scatter_log_softmax",
    "scatter_logsumexp",
    "scatter_max",
    "scatter_mean",
    "scatter_min",
    "scatter_mul",
    "scatter_softmax",
    "scatter_std",
    "scatter_sum",
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

#: The torch_scatter release whose behaviour this module reproduces.
VERSION = "2.1.2"

# --------------------------------------------------------------------------- mx_driving

_NOT_LOOKED_UP = object()
_mx_driving: Any = _NOT_LOOKED_UP


def _mx_kernel(name: str, src: Tensor) -> Callable[..., Any] | None:
    """``mx_driving.<name>`` if mx_driving is importable and ``src`` is a float32 NPU tensor."""
    global _mx_driving
    if src.dtype is not torch.float32 or not getattr(src, "is_npu", False):
        return None
    module = sys.modules.get("mx_driving")
    if module is None:
        if _mx_driving is _NOT_LOOKED_UP:
            _mx_driving = (
                importlib.import_module("mx_driving")
                if importlib.util.find_spec("mx_driving") is not None
                else None
            )
        module = _mx_driving
    return getattr(module, name, None) if module is not None else None


# --------------------------------------------------------------------------- helpers


def broadcast(src: Tensor, other: Tensor, dim: int) -> Tensor:
    """torch_scatter's index broadcast: a 1-d ``src`` lies along ``dim`` of ``other``."""
    if dim < 0:
        dim = other.dim() + dim
    if src.dim() == 1:
        for _ in range(dim):
            src = src.unsqueeze(0)
    for _ in range(src.dim(), other.dim()):
        src = src.unsqueeze(-1)
    return src.expand(other.size())


def _out_size(src: Tensor, index: Tensor, dim: int, dim_size: int | None) -> list[int]:
    size = list(src.size())
    if dim_size is not None:
        size[dim] = dim_size
    elif index.numel() == 0:
        size[dim] = 0
    else:
        size[dim] = int(index.max()) + 1
    return size


def _positions(like: Tensor, dim: int) -> Tensor:
    """The index along ``dim`` of every element of ``like``."""
    shape = [1] * like.dim()
    shape[dim] = like.size(dim)
    return torch.arange(like.size(dim), device=like.device).view(shape).expand_as(like)


# --------------------------------------------------------------------------- scatter


def scatter_sum(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
) -> Tensor:
    kernel = _mx_kernel("scatter_add", src) if out is None else None
    if kernel is not None:
        return kernel(src, index.int(), None, dim, dim_size)  # type: ignore[no-any-return]
    index = broadcast(index, src, dim)
    if out is None:
        out = src.new_zeros(_out_size(src, index, dim, dim_size))
    return out.scatter_add_(dim, index, src)


def scatter_add(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
) -> Tensor:
    return scatter_sum(src, index, dim, out, dim_size)


def scatter_mul(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
) -> Tensor:
    index = broadcast(index, src, dim)
    if out is None:
        out = src.new_ones(_out_size(src, index, dim, dim_size))
    return out.scatter_reduce_(dim, index, src, "prod", include_self=True)


def scatter_mean(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
) -> Tensor:
    kernel = _mx_kernel("scatter_mean", src) if out is None else None
    if kernel is not None:
        return kernel(src, index.int(), None, dim, dim_size)  # type: ignore[no-any-return]
    out = scatter_sum(src, index, dim, out, dim_size)
    dim_size = out.size(dim)
    index_dim = dim + src.dim() if dim < 0 else dim
    if index.dim() <= index_dim:
        index_dim = index.dim() - 1
    ones = torch.ones(index.size(), dtype=src.dtype, device=src.device)
    count = scatter_sum(ones, index, index_dim, None, dim_size)
    count[count < 1] = 1
    count = broadcast(count, out, dim)
    if out.is_floating_point():
        return out.true_divide_(count)
    return out.div_(count, rounding_mode="floor")


def _scatter_arg(
    src: Tensor,
    index: Tensor,
    dim: int,
    out: Tensor | None,
    dim_size: int | None,
    reduce: str,
) -> tuple[Tensor, Tensor]:
    """scatter_max / scatter_min: values and the index (along ``dim``) of the first winner."""
    dim = dim + src.dim() if dim < 0 else dim
    index = broadcast(index, src, dim)
    extent = src.size(dim)
    size = list(out.size()) if out is not None else _out_size(src, index, dim, dim_size)
    arg = torch.full(size, extent, dtype=torch.long, device=src.device)
    if src.numel() == 0:
        if out is None:
            out = src.new_zeros(size)
        return out, arg
    plain = src.detach()
    if out is None:
        best = plain.new_zeros(size).scatter_reduce_(dim, index, plain, reduce, include_self=False)
        wins = plain == best.gather(dim, index)
    else:
        before = out.detach().clone()
        best = before.clone().scatter_reduce_(dim, index, plain, reduce, include_self=True)
        beats = (
            plain > before.gather(dim, index)
            if reduce == "amax"
            else plain < before.gather(dim, index)
        )
        wins = (plain == best.gather(dim, index)) & beats
    candidates = torch.where(wins, _positions(plain, dim), extent)
    arg.scatter_reduce_(dim, index, candidates, "amin", include_self=True)
    found = arg < extent
    # Gathering src at the arg makes the gradient reach exactly the arg element, as in torch_scatter.
    picked = src.gather(dim, arg.clamp(max=extent - 1))
    if out is None:
        return torch.where(found, picked, torch.zeros((), dtype=src.dtype, device=src.device)), arg
    return out.copy_(torch.where(found, picked, out)), arg


def scatter_max(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    normalized = dim + src.dim() if dim < 0 else dim
    if out is None and dim_size is None and normalized == 0 and index.dim() == 1:
        kernel = _mx_kernel("scatter_max", src)
        if kernel is not None:
            values, arg = kernel(src, index.int(), None)
            return values, arg.long()
    return _scatter_arg(src, index, dim, out, dim_size, "amax")


def scatter_min(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    return _scatter_arg(src, index, dim, out, dim_size, "amin")


def scatter(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
    reduce: str = "sum",
) -> Tensor:
    if reduce in ("sum", "add"):
        return scatter_sum(src, index, dim, out, dim_size)
    if reduce == "mul":
        return scatter_mul(src, index, dim, out, dim_size)
    if reduce == "mean":
        return scatter_mean(src, index, dim, out, dim_size)
    if reduce == "min":
        return scatter_min(src, index, dim, out, dim_size)[0]
    if reduce == "max":
        return scatter_max(src, index, dim, out, dim_size)[0]
    raise ValueError(
        f"scatter: reduce must be 'sum', 'add', 'mul', 'mean', 'min' or 'max', got {reduce!r}"
    )


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


# --------------------------------------------------------------------------- composite


def _require_float(src: Tensor, name: str) -> None:
    if not torch.is_floating_point(src):
        raise ValueError(
            f"`{name}` can only be computed over tensors with floating point data types."
        )


def scatter_softmax(
    src: Tensor, index: Tensor, dim: int = -1, dim_size: int | None = None
) -> Tensor:
    _require_float(src, "scatter_softmax")
    index = broadcast(index, src, dim)
    max_value_per_index = scatter_max(src, index, dim=dim, dim_size=dim_size)[0]
    recentered = src - max_value_per_index.gather(dim, index)
    exp = recentered.exp_()
    sum_per_index = scatter_sum(exp, index, dim, dim_size=dim_size)
    return exp.div(sum_per_index.gather(dim, index))


def scatter_log_softmax(
    src: Tensor, index: Tensor, dim: int = -1, eps: float = 1e-12, dim_size: int | None = None
) -> Tensor:
    _require_float(src, "scatter_log_softmax")
    index = broadcast(index, src, dim)
    max_value_per_index = scatter_max(src, index, dim=dim, dim_size=dim_size)[0]
    recentered = src - max_value_per_index.gather(dim, index)
    sum_per_index = scatter_sum(recentered.exp(), index, dim, dim_size=dim_size)
    normalizing = sum_per_index.add_(eps).log_().gather(dim, index)
    return recentered.sub_(normalizing)


def scatter_logsumexp(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
    eps: float = 1e-12,
) -> Tensor:
    _require_float(src, "scatter_logsumexp")
    index = broadcast(index, src, dim)
    if out is not None:
        dim_size = out.size(dim)
    elif dim_size is None:
        dim_size = int(index.max()) + 1
    size = list(src.size())
    size[dim] = dim_size
    max_value_per_index = torch.full(size, float("-inf"), dtype=src.dtype, device=src.device)
    scatter_max(src, index, dim, max_value_per_index, dim_size=dim_size)
    recentered = src - max_value_per_index.gather(dim, index)
    recentered.masked_fill_(torch.isnan(recentered), float("-inf"))
    if out is not None:
        out = out.sub_(max_value_per_index).exp_()
    sum_per_index = scatter_sum(recentered.exp_(), index, dim, out, dim_size)
    result = sum_per_index.add_(eps).log_().add_(max_value_per_index)
    return result.nan_to_num_(neginf=0.0)


def scatter_std(
    src: Tensor,
    index: Tensor,
    dim: int = -1,
    out: Tensor | None = None,
    dim_size: int | None = None,
    unbiased: bool = True,
) -> Tensor:
    if out is not None:
        dim_size = out.size(dim)
    if dim < 0:
        dim = src.dim() + dim
    count_dim = dim if index.dim() > dim else index.dim() - 1
    ones = torch.ones(index.size(), dtype=src.dtype, device=src.device)
    count = scatter_sum(ones, index, count_dim, dim_size=dim_size)
    index = broadcast(index, src, dim)
    total = scatter_sum(src, index, dim, dim_size=dim_size)
    count = broadcast(count, total, dim).clamp(1)
    mean = total.div(count)
    var = src - mean.gather(dim, index)
    var = var * var
    out = scatter_sum(var, index, dim, out, dim_size)
    if unbiased:
        count = count.sub(1).clamp_(1)
    return out.div(count + 1e-6).sqrt()


# --------------------------------------------------------------------------- the module

_TOP_LEVEL = [n for n in __all__ if n not in ("build", "broadcast")]
_COMPOSITE = ["scatter_std", "scatter_logsumexp", "scatter_softmax", "scatter_log_softmax"]


def build(name: str) -> types.ModuleType:
    """``ReplaceImport`` factory: the module served as ``torch_scatter`` (or a submodule)."""
    this = sys.modules[__name__]
    module = types.ModuleType(
        name,
        f"torch_scatter {VERSION}-compatible functions served by ascend-patch "
        f"({__name__}); torch_scatter itself is not installed.",
    )
    if name == "torch_scatter":
        module.__path__ = []  # a package, so torch_scatter.composite / .utils import
        names = _TOP_LEVEL
        module.__version__ = VERSION  # type: ignore[attr-defined]
    elif name == "torch_scatter.composite":
        names = _COMPOSITE
    elif name == "torch_scatter.utils":
        names = ["broadcast"]
    else:
        raise ImportError(f"ascend-patch serves no module {name!r} in place of torch_scatter")
    for attr in names:
        setattr(module, attr, getattr(this, attr))
    module.__all__ = list(names)  # type: ignore[attr-defined]
    return module
