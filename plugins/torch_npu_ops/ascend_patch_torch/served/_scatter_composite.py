"""torch_scatter's ``composite`` functions: softmax, log-softmax, logsumexp and std per index.

Part of :mod:`ascend_patch_torch.served.torch_scatter`, which re-exports every public
name (and serves them as ``torch_scatter.composite``); import them from there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._scatter_ops import broadcast
from ._scatter_ops import scatter_max
from ._scatter_ops import scatter_sum


__all__ = ["scatter_log_softmax", "scatter_logsumexp", "scatter_softmax", "scatter_std"]

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
