"""Running the original (and, for gradients, both sides) again on copies of live inputs.

Copies keep the live call untouched: tensors are cloned at the call event, before the
replacement can modify them in place. A module argument is the live module itself:
its buffers (running statistics, counters) are saved at the call event too, loaded
for each extra run (so the original sees the state the replacement saw) and set
back to their live values afterwards. Likewise the RNG state of the call is
restored for each extra run and the live one afterwards (``fork_rng``). Imported
only when a check runs (it imports torch).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import torch

from ._compare import Deviation
from ._compare import compare
from ._compare import compare_tensors
from ._compare import has_tensor
from ._compare import tensor_leaves


__all__ = ["Buffers", "Outcome", "clone_inputs", "run_comparison"]

Arguments = tuple[tuple[Any, ...], dict[str, Any]]


class Outcome(NamedTuple):
    """What one checked call found."""

    #: The result holds no tensor: nothing to compare (the patch is not checked further).
    no_tensor: bool = False
    #: The original could not run on the replacement's arguments.
    error: str | None = None
    deviations: tuple[Deviation, ...] = ()
    gradient_deviations: tuple[Deviation, ...] = ()
    notes: tuple[str, ...] = ()


def clone_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Arguments:
    return tuple(_clone(a) for a in args), {k: _clone(v) for k, v in kwargs.items()}


def _clone(value: Any, depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        if value.requires_grad and (copy.is_floating_point() or copy.is_complex()):
            copy.requires_grad_(True)
        return copy
    if depth > 8:
        return value
    if isinstance(value, tuple):
        items = [_clone(v, depth + 1) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [_clone(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v, depth + 1) for k, v in value.items()}
    return value


def _modules(names: list[str], args: Arguments) -> list[tuple[str, torch.nn.Module]]:
    positional, keywords = args
    found = [
        (n, a) for n, a in zip(names, positional, strict=False) if isinstance(a, torch.nn.Module)
    ]
    found += [(n, a) for n, a in keywords.items() if isinstance(a, torch.nn.Module)]
    return found


class Buffers:
    """The values of every buffer of the module arguments of a call, to load back later."""

    def __init__(self, names: list[str], inputs: Arguments) -> None:
        self._saved = [
            (buffer, buffer.detach().clone())
            for _, module in _modules(names, inputs)
            for buffer in module.buffers()
            if buffer is not None
        ]

    def load(self) -> None:
        with torch.no_grad():
            for buffer, value in self._saved:
                if buffer.shape == value.shape:
                    buffer.copy_(value)


def run_comparison(
    replacement: Callable[..., Any],
    original: Callable[..., Any],
    live_result: Any,
    names: list[str],
    inputs: Arguments,
    grad_inputs: Arguments | None,
    rng: torch.Tensor,
    buffers_at_call: Buffers,
    thresholds: Mapping[str, tuple[float, float]],
) -> Outcome:
    """Run the original on ``inputs`` and compare with the live result (and gradients)."""
    if not has_tensor(live_result):
        return Outcome(no_tensor=True)
    live_buffers = Buffers(names, inputs)
    try:
        buffers_at_call.load()
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng)
            with torch.no_grad():
                expected = original(*inputs[0], **inputs[1])
    except Exception as exc:
        return Outcome(
            error=f"the original raised {type(exc).__name__} on the replacement's arguments: {exc}"
        )
    finally:
        live_buffers.load()
    deviations = compare(live_result, expected, thresholds)
    if grad_inputs is None:
        return Outcome(deviations=tuple(deviations))
    gradient, notes = _compare_gradients(
        replacement, original, names, grad_inputs, rng, buffers_at_call, thresholds
    )
    return Outcome(
        deviations=tuple(deviations), gradient_deviations=tuple(gradient), notes=tuple(notes)
    )


def _grad_leaves(names: list[str], args: Arguments) -> list[tuple[str, torch.Tensor]]:
    positional, keywords = args
    labelled = [(names[i] if i < len(names) else f"args[{i}]", a) for i, a in enumerate(positional)]
    labelled += list(keywords.items())
    return [
        (path, leaf)
        for name, value in labelled
        for path, leaf in tensor_leaves(value, name)
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad
    ]


def _differentiable(value: Any) -> list[torch.Tensor]:
    return [
        t
        for _, t in tensor_leaves(value)
        if isinstance(t, torch.Tensor)
        and t.requires_grad
        and (t.is_floating_point() or t.is_complex())
    ]


def _compare_gradients(
    replacement: Callable[..., Any],
    original: Callable[..., Any],
    names: list[str],
    grad_inputs: Arguments,
    rng: torch.Tensor,
    buffers_at_call: Buffers,
    thresholds: Mapping[str, tuple[float, float]],
) -> tuple[list[Deviation], list[str]]:
    side_r = grad_inputs
    side_o = clone_inputs(*grad_inputs)
    modules = _modules(names, side_r)
    leaves_r = _grad_leaves(names, side_r)
    leaves_o = _grad_leaves(names, side_o)
    parameters = [
        (f"{label}.{name}", p)
        for label, module in modules
        for name, p in module.named_parameters()
        if p.requires_grad
    ]
    if not leaves_r and not parameters:
        return [], []
    live_buffers = Buffers(names, side_r)
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            buffers_at_call.load()
            torch.set_rng_state(rng)
            out_r = replacement(*side_r[0], **side_r[1])
            buffers_at_call.load()
            torch.set_rng_state(rng)
            out_o = original(*side_o[0], **side_o[1])
    except Exception as exc:
        return [], [f"gradients not compared: a re-run raised {type(exc).__name__}: {exc}"]
    finally:
        live_buffers.load()
    outs_r, outs_o = _differentiable(out_r), _differentiable(out_o)
    if not outs_o:
        return [], []
    if [t.shape for t in outs_r] != [t.shape for t in outs_o]:
        return [], ["gradients not compared: the differentiable outputs differ in number or shape"]
    generator = torch.Generator().manual_seed(0)
    cotangents = [torch.randn(t.shape, generator=generator).to(t) for t in outs_o]
    labels = [n for n, _ in leaves_r] + [n for n, _ in parameters]
    try:
        grads_r = torch.autograd.grad(
            outs_r,
            [t for _, t in leaves_r] + [p for _, p in parameters],
            cotangents,
            allow_unused=True,
        )
        grads_o = torch.autograd.grad(
            outs_o,
            [t for _, t in leaves_o] + [p for _, p in parameters],
            cotangents,
            allow_unused=True,
        )
    except Exception as exc:
        return [], [f"gradients not compared: autograd raised {type(exc).__name__}: {exc}"]
    deviations: list[Deviation] = []
    for label, g_r, g_o in zip(labels, grads_r, grads_o, strict=True):
        where = f"grad[{label}]"
        if g_r is None and g_o is None:
            continue
        if g_r is None or g_o is None:
            missing = "the replacement" if g_r is None else "the original"
            deviations.append(
                Deviation.unmatched(
                    where, f"{missing} gives no gradient here and the other side does"
                )
            )
            continue
        deviations.append(compare_tensors(g_r, g_o, thresholds, where))
    return deviations, []
