"""Numbers for the precision check: max absolute and relative deviation, dtype-aware tolerances.

An element passes when ``|actual - expected| <= atol + rtol * |expected|`` (the
``torch.allclose`` rule, with the original's output as ``expected``). NaN matches
NaN and an infinity matches the same infinity; anything else involving them fails.
The relative deviation divides by ``max(|expected|, atol)`` so that values near
zero do not report an infinite relative error. Integer and bool results must be
exact. When the two sides differ in dtype, the looser dtype's tolerance applies and
the difference is reported.

Imported only when a check runs (it imports torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import torch


__all__ = [
    "Deviation",
    "compare",
    "compare_tensors",
    "has_tensor",
    "tensor_leaves",
]

_EXACT = (0.0, 0.0)


class Deviation(NamedTuple):
    """How one tensor of the replacement's result differs from the original's."""

    where: str
    dtype: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    exceeded: bool
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._asdict())

    @classmethod
    def unmatched(cls, where: str, problem: str) -> Deviation:
        """The two sides cannot be compared here at all (no tensor, no gradient on one side)."""
        return cls(where, "-", float("inf"), float("inf"), 0.0, 0.0, True, problem)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tolerance(
    actual: torch.dtype, expected: torch.dtype, tolerances: Mapping[str, tuple[float, float]]
) -> tuple[float, float]:
    """The tolerance for comparing these dtypes: the looser of the two."""
    candidates = [
        tolerances.get(dtype_name(d), _EXACT if not (d.is_floating_point or d.is_complex) else None)
        for d in (actual, expected)
    ]
    known = [c for c in candidates if c is not None]
    if not known:  # an unlisted floating dtype: as loose as the loosest listed one
        return max(tolerances.values(), key=lambda t: t[1])
    return max(known, key=lambda t: (t[1], t[0]))


def tensor_leaves(value: Any, where: str = "output", depth: int = 0) -> list[tuple[str, Any]]:
    """Flatten a result into (path, leaf) pairs: tensors, sequences, mappings (ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return [(where, value)]
    if depth > 8:
        return [(where, value)]
    if isinstance(value, Mapping):
        pairs: list[tuple[str, Any]] = []
        for key in value:
            pairs += tensor_leaves(value[key], f"{where}[{key!r}]", depth + 1)
        return pairs
    if isinstance(value, (list, tuple)):
        pairs = []
        for index, item in enumerate(value):
            pairs += tensor_leaves(item, f"{where}[{index}]", depth + 1)
        return pairs
    return [(where, value)]


def has_tensor(value: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for _, leaf in tensor_leaves(value))


def compare(
    actual: Any,
    expected: Any,
    tolerances: Mapping[str, tuple[float, float]],
    where: str = "output",
) -> list[Deviation]:
    """Compare every tensor of two results that should have the same structure."""
    left = tensor_leaves(actual, where)
    right = tensor_leaves(expected, where)
    left_tensors = [(p, t) for p, t in left if isinstance(t, torch.Tensor)]
    right_tensors = [(p, t) for p, t in right if isinstance(t, torch.Tensor)]
    if [p for p, _ in left_tensors] != [p for p, _ in right_tensors]:
        return [
            Deviation.unmatched(
                where,
                "the results differ in structure: the replacement returns tensors at "
                f"{_paths(left_tensors)}, the original at {_paths(right_tensors)}",
            )
        ]
    return [
        compare_tensors(a, e, tolerances, path)
        for (path, a), (_, e) in zip(left_tensors, right_tensors, strict=True)
    ]


def _paths(pairs: list[tuple[str, Any]]) -> str:
    return ", ".join(p for p, _ in pairs) or "nowhere"


def compare_tensors(
    actual: torch.Tensor,
    expected: torch.Tensor,
    tolerances: Mapping[str, tuple[float, float]],
    where: str,
) -> Deviation:
    atol, rtol = tolerance(actual.dtype, expected.dtype, tolerances)
    dtype = dtype_name(expected.dtype)
    if actual.dtype != expected.dtype:
        dtype = f"{dtype_name(actual.dtype)} vs {dtype}"
    if tuple(actual.shape) != tuple(expected.shape):
        return Deviation(
            where,
            dtype,
            float("inf"),
            float("inf"),
            atol,
            rtol,
            True,
            f"shape {tuple(actual.shape)} vs the original's {tuple(expected.shape)}",
        )
    a = _as_float64(actual)
    e = _as_float64(expected)
    if a.numel() == 0:
        return Deviation(where, dtype, 0.0, 0.0, atol, rtol, False)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    same = (a == e) | (nan_a & nan_e)  # equal infinities are equal too
    special = ~same & ~(torch.isfinite(a) & torch.isfinite(e))
    inf = torch.full_like(a, float("inf"))
    diff = torch.where(same, torch.zeros_like(a), (a - e).abs())
    diff = torch.where(special, inf, diff)
    magnitude = torch.where(torch.isfinite(e), e.abs(), torch.zeros_like(e))
    floor = atol if atol > 0 else 1.0
    max_abs = float(diff.max())
    max_rel = float((diff / magnitude.clamp_min(floor)).max())
    exceeded = bool(special.any()) or bool((diff > atol + rtol * magnitude).any())
    problem = None
    if bool((nan_a != nan_e).any()):
        problem = "NaN where the other side has a number"
    elif bool(special.any()):
        problem = "an infinity where the other side differs"
    return Deviation(where, dtype, max_abs, max_rel, atol, rtol, exceeded, problem)


def _as_float64(tensor: torch.Tensor) -> torch.Tensor:
    value = tensor.detach()
    if value.is_complex():
        value = torch.view_as_real(value)
    return value.to(device="cpu", dtype=torch.float64)
