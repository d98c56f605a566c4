"""Parity between an original function and its replacement: outputs and gradients.

:func:`assert_parity` runs both on their own clones of the same inputs (floating
tensors require grad), compares the outputs structurally, then back-propagates the
same random cotangents through both and compares the input gradients. Tolerances
follow the lower-precision dtype of each compared pair (:data:`TOLERANCES`), since
a replacement usually computes in another order than the original. torch is
imported when the helper runs, never at import.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any


__all__ = ["TOLERANCES", "assert_parity", "tolerance_for"]

#: ``dtype name -> (rtol, atol)`` for comparing two floating results.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "complex128": (1e-7, 1e-7),
    "float32": (1e-5, 1e-5),
    "complex64": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}
_LOOSEST = (1.6e-2, 1e-2)


def tolerance_for(*dtypes: Any) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing results of these dtypes: the loosest of them."""
    chosen = (0.0, 0.0)
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        rtol, atol = TOLERANCES.get(name, _LOOSEST if "float8" in name else (0.0, 0.0))
        chosen = (max(chosen[0], rtol), max(chosen[1], atol))
    return chosen


Leaves = list[tuple[str, Any]]


def _clone(value: Any, grad: bool, leaves: Leaves, path: str) -> Any:
    """A copy of ``value`` with every tensor cloned; ``leaves`` gets ``(path, clone)``."""
    import torch

    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        if grad and (copy.is_floating_point() or copy.is_complex()):
            copy.requires_grad_(True)
        leaves.append((path, copy))
        return copy
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(
            *(_clone(getattr(value, f), grad, leaves, f"{path}.{f}") for f in value._fields)
        )
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v, grad, leaves, f"{path}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _clone(v, grad, leaves, f"{path}[{k!r}]") for k, v in value.items()}
    return value


def _flatten(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        for field in value._fields:
            yield from _flatten(getattr(value, field), f"{path}.{field}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _flatten(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{path}[{key!r}]")
    else:
        yield path, value


def _structure(value: Any) -> Any:
    """The nesting of ``value`` with leaves replaced by their kind, for a first check."""
    import torch

    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_structure(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _structure(v)) for k, v in value.items()))
    return "tensor" if isinstance(value, torch.Tensor) else type(value).__name__


def _compare_tensors(
    where: str, expected: Any, actual: Any, rtol: float | None, atol: float | None
) -> str | None:
    import torch

    if expected.shape != actual.shape:
        return f"{where}: shape {tuple(actual.shape)} != original's {tuple(expected.shape)}"
    if expected.dtype != actual.dtype:
        return f"{where}: dtype {actual.dtype} != original's {expected.dtype}"
    default_rtol, default_atol = tolerance_for(expected.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if expected.numel() == 0:
        return None
    if not (expected.is_floating_point() or expected.is_complex()):
        mismatched = expected != actual
        if not bool(mismatched.any()):
            return None
        first = tuple(int(i) for i in mismatched.nonzero()[0])
        return (
            f"{where}: {int(mismatched.sum())} of {expected.numel()} values differ "
            f"(exact comparison for {expected.dtype}); first at index {first}: "
            f"{actual[first].item()} vs original {expected[first].item()}"
        )
    wide = torch.complex128 if expected.is_complex() else torch.float64
    e = expected.detach().to(wide)
    a = actual.detach().to(wide)
    close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    diff = (a - e).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    worst = int(diff.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), e.shape))
    relative = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    bad = int((~close).sum())
    return (
        f"{where}: {bad} of {e.numel()} values outside rtol={rtol:g}, atol={atol:g} "
        f"({expected.dtype}); max abs diff {float(diff.max()):.3g} at index {index} "
        f"({a[index].item():.6g} vs original {e[index].item():.6g}), "
        f"max rel diff {float(relative[~close].max()):.3g}"
    )


def _compare(
    label: str, expected: Any, actual: Any, rtol: float | None, atol: float | None
) -> list[str]:
    import torch

    if _structure(expected) != _structure(actual):
        return [
            f"{label}: structure differs: replacement gave {_structure(actual)}, "
            f"original {_structure(expected)}"
        ]
    problems = []
    for (path, e), (_, a) in zip(_flatten(expected, label), _flatten(actual, label), strict=True):
        if isinstance(e, torch.Tensor):
            problem = _compare_tensors(path, e, a, rtol, atol)
        elif isinstance(e, float) and isinstance(a, float):
            tol_r, tol_a = tolerance_for("float64")
            same = math.isclose(e, a, rel_tol=rtol or tol_r, abs_tol=atol or tol_a) or (
                math.isnan(e) and math.isnan(a)
            )
            problem = None if same else f"{path}: {a!r} != original's {e!r}"
        else:
            problem = None if e == a else f"{path}: {a!r} != original's {e!r}"
        if problem:
            problems.append(problem)
    return problems


def _differentiable(outputs: Any) -> list[tuple[int, Any]]:
    import torch

    return [
        (i, o)
        for i, (_, o) in enumerate(_flatten(outputs, ""))
        if isinstance(o, torch.Tensor) and o.requires_grad
    ]


def assert_parity(
    original: Callable[..., Any],
    replacement: Callable[..., Any],
    *inputs: Any,
    kwargs: Mapping[str, Any] | None = None,
    grad: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int | None = 0,
) -> None:
    """Assert ``replacement(*inputs, **kwargs)`` matches ``original`` in outputs and gradients.

    Each function gets its own clones of ``inputs`` (tensors nested in tuples,
    lists and dicts included); with ``grad``, floating tensors require grad, the
    same random cotangents (seeded) are back-propagated through both outputs and
    the input gradients are compared too. ``rtol``/``atol`` override the per-dtype
    :data:`TOLERANCES`. ``seed`` seeds torch before each call, so random ops (dropout)
    draw the same numbers; ``None`` leaves the RNG alone. Shapes and dtypes must
    match exactly, integer and bool tensors exactly too. Raises ``AssertionError``
    listing every difference, with where it is and how large.
    """
    import torch

    kwargs = dict(kwargs or {})
    runs = []
    for function in (original, replacement):
        leaves: Leaves = []
        cloned_args = [_clone(v, grad, leaves, f"input {i}") for i, v in enumerate(inputs)]
        cloned_kwargs = {k: _clone(v, grad, leaves, f"input {k!r}") for k, v in kwargs.items()}
        if seed is not None:
            torch.manual_seed(seed)
        runs.append((function(*cloned_args, **cloned_kwargs), leaves))
    (expected, expected_leaves), (actual, actual_leaves) = runs
    name = getattr(replacement, "__qualname__", repr(replacement))
    problems = _compare("output", expected, actual, rtol, atol)
    if grad and not problems:
        problems += _compare_gradients(
            expected, actual, expected_leaves, actual_leaves, rtol, atol, seed
        )
    if problems:
        listed = "\n  ".join(problems)
        raise AssertionError(
            f"{name} does not match {getattr(original, '__qualname__', repr(original))}:"
            f"\n  {listed}"
        )


def _compare_gradients(
    expected: Any,
    actual: Any,
    expected_leaves: Leaves,
    actual_leaves: Leaves,
    rtol: float | None,
    atol: float | None,
    seed: int | None,
) -> list[str]:
    import torch

    wanted_e = _differentiable(expected)
    wanted_a = _differentiable(actual)
    if [i for i, _ in wanted_e] != [i for i, _ in wanted_a]:
        return [
            f"gradients: outputs requiring grad differ: replacement {[i for i, _ in wanted_a]}, "
            f"original {[i for i, _ in wanted_e]} (flattened output positions)"
        ]
    trainable = [i for i, (_, leaf) in enumerate(expected_leaves) if leaf.requires_grad]
    if not wanted_e or not trainable:
        return []
    generator = torch.Generator().manual_seed(0 if seed is None else seed)
    cotangents = [
        torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.dtype)
        for _, o in wanted_e
    ]
    grads = []
    for wanted, leaves in ((wanted_e, expected_leaves), (wanted_a, actual_leaves)):
        computed = torch.autograd.grad(
            [o for _, o in wanted],
            [leaves[i][1] for i in trainable],
            [c.to(o.dtype) for c, (_, o) in zip(cotangents, wanted, strict=True)],
            allow_unused=True,
        )
        grads.append(
            [
                torch.zeros_like(leaves[i][1]) if g is None else g
                for i, g in zip(trainable, computed, strict=True)
            ]
        )
    problems = []
    for position, e, a in zip(trainable, grads[0], grads[1], strict=True):
        where = f"gradient of {expected_leaves[position][0]}"
        problems += _compare(where, e, a, rtol, atol)
    return problems
