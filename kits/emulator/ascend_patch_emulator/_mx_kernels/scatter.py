"""``scatter_add``, ``scatter_mean`` and ``scatter_max`` (torch_scatter's semantics).

``scatter_add(src, index, out=None, dim=0, dim_size=None)`` and ``scatter_mean`` (same
arguments) reduce ``src`` along ``dim`` into the slot ``index`` names. ``index`` is
broadcast as torch_scatter broadcasts it: a 1-d index lies along ``dim``, a
higher one covers ``src``'s leading dimensions. The output has ``dim_size`` slots
along ``dim`` (default ``index.max() + 1``); with ``out`` its values are the
starting point (the result is a new tensor; ``out`` is not written). Empty slots
are 0; a mean divides by the count of its entries. ``scatter_add`` computes in
float32 and returns ``src``'s dtype, as the wheel's does; ``scatter_mean`` keeps
``src``'s dtype (integers divide with floor). Gradients flow to ``src`` only.

``scatter_max(updates, indices, out=None)`` reduces rows: ``updates [N, ...]``,
``indices [N]``; returns ``(values [M, ...], argmax [M, ...] int32)`` with ``M =
indices.max() + 1`` (or ``out``'s rows, whose values then take part in the max).
``argmax`` is the first row holding the maximum, ``N`` where no row does (an empty
slot, value 0, or one where ``out`` wins). The gradient reaches the argmax rows.
"""

from __future__ import annotations

from typing import Any

import torch

from . import MxFunction
from . import applier


__all__ = ["PUBLIC", "ScatterAddFunction", "ScatterMaxFunction", "ScatterMeanFunction"]


def _spread(index: Any, src: Any, dim: int) -> Any:
    """``index`` broadcast to ``src``'s shape, torch_scatter's way, as int64."""
    index = index.long()
    if index.dim() == 1:
        index = index.view([1] * dim + [-1] + [1] * (src.dim() - dim - 1))
    else:
        index = index.view(*index.shape, *([1] * (src.dim() - index.dim())))
    return index.expand_as(src)


def _prepare(src: Any, index: Any, out: Any, dim: int, dim_size: Any) -> tuple[Any, int, Any]:
    """(broadcast index, normalized dim, output size)."""
    if not -src.dim() <= dim < max(src.dim(), 1):
        raise IndexError(f"dim {dim} is out of range for a {src.dim()}-d src")
    dim = dim % src.dim()
    spread = _spread(index, src, dim)
    size = list(src.shape)
    if out is not None:
        size = list(out.shape)
    elif dim_size is not None:
        size[dim] = int(dim_size)
    else:
        size[dim] = int(spread.max()) + 1 if spread.numel() else 0
    return spread, dim, size


def _sum(src: Any, spread: Any, dim: int, size: list[int], out: Any, dtype: Any) -> Any:
    base = out.to(dtype).clone() if out is not None else src.new_zeros(size, dtype=dtype)
    return base.scatter_add_(dim, spread, src.to(dtype))


class ScatterAddFunction(MxFunction):
    """The Function behind ``mx_driving.scatter_add``."""

    @staticmethod
    def forward(
        ctx: Any, src: Any, index: Any, out: Any = None, dim: int = 0, dim_size: Any = None
    ) -> Any:
        spread, dim, size = _prepare(src, index, out, dim, dim_size)
        wide = torch.float64 if src.dtype == torch.float64 else torch.float32
        ctx.dim = dim
        ctx.save_for_backward(spread)
        return _sum(src, spread, dim, size, out, wide).to(src.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> tuple[Any, ...]:
        (spread,) = ctx.saved_tensors
        return grad_out.gather(ctx.dim, spread), None, None, None, None


class ScatterMeanFunction(MxFunction):
    """The Function behind ``mx_driving.scatter_mean``."""

    @staticmethod
    def forward(
        ctx: Any, src: Any, index: Any, out: Any = None, dim: int = 0, dim_size: Any = None
    ) -> Any:
        spread, dim, size = _prepare(src, index, out, dim, dim_size)
        total = _sum(src, spread, dim, size, out, src.dtype)
        count = torch.zeros(size, dtype=torch.long).scatter_add_(
            dim, spread, torch.ones_like(spread)
        )
        count = count.clamp(min=1).to(total.dtype)
        ctx.dim = dim
        ctx.save_for_backward(spread, count)
        if total.is_floating_point():
            return total / count
        return torch.div(total, count, rounding_mode="floor")

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> tuple[Any, ...]:
        spread, count = ctx.saved_tensors
        return (grad_out / count).gather(ctx.dim, spread), None, None, None, None


class ScatterMaxFunction(MxFunction):
    """The Function behind ``mx_driving.scatter_max`` (rows of ``updates``)."""

    @staticmethod
    def forward(ctx: Any, updates: Any, indices: Any, out: Any = None) -> tuple[Any, Any]:
        if indices.dim() != 1 or indices.shape[0] != updates.shape[0]:
            raise RuntimeError(
                f"scatter_max: indices must be 1-d with one entry per row of updates, got "
                f"{tuple(indices.shape)} for updates {tuple(updates.shape)}"
            )
        rows = updates.shape[0]
        spread = _spread(indices, updates, 0)
        size = list(updates.shape)
        if out is not None:
            size = list(out.shape)
        else:
            size[0] = int(indices.max()) + 1 if rows else 0
        plain = updates.detach()
        if out is None:
            best = plain.new_zeros(size).scatter_reduce_(
                0, spread, plain, "amax", include_self=False
            )
            wins = plain == best.gather(0, spread)
        else:
            start = out.detach().to(plain.dtype)
            best = start.clone().scatter_reduce_(0, spread, plain, "amax", include_self=True)
            wins = (plain == best.gather(0, spread)) & (plain > start.gather(0, spread))
        positions = torch.arange(rows).view(-1, *([1] * (updates.dim() - 1))).expand_as(plain)
        argmax = torch.full(size, rows, dtype=torch.long)
        argmax.scatter_reduce_(
            0, spread, torch.where(wins, positions, rows), "amin", include_self=True
        )
        values = best if out is not None else torch.where(argmax < rows, best, 0).to(plain.dtype)
        ctx.rows = rows
        ctx.save_for_backward(argmax)
        ctx.mark_non_differentiable(argmax_int := argmax.int())
        return values, argmax_int

    @staticmethod
    def backward(ctx: Any, grad_values: Any, grad_argmax: Any) -> tuple[Any, ...]:
        (argmax,) = ctx.saved_tensors
        shape = [ctx.rows + 1, *grad_values.shape[1:]]
        grad = grad_values.new_zeros(shape).scatter_add_(0, argmax, grad_values)
        return grad[: ctx.rows], None, None


PUBLIC = {
    "scatter_add": applier("scatter_add", ScatterAddFunction),
    "scatter_mean": applier("scatter_mean", ScatterMeanFunction),
    "scatter_max": applier("scatter_max", ScatterMaxFunction),
}
