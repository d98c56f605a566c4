"""torch_scatter's ``scatter_*`` functions and the helpers the other families share.

Part of :mod:`ascend_patch_torch.served.torch_scatter`, which re-exports every public
name; import them from there. Kernels: ``mx_driving.scatter_add`` / ``scatter_mean`` /
``scatter_max`` when mx_driving is importable and the input is a float32 NPU tensor in
their domain; otherwise ``Tensor.scatter_add_`` / ``scatter_reduce_``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


__all__ = [
    "broadcast",
    "scatter",
    "scatter_add",
    "scatter_max",
    "scatter_mean",
    "scatter_min",
    "scatter_mul",
    "scatter_sum",
]

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
