"""How the precision check sees a replacement's calls: code objects, frames, arguments.

The check never wraps what the patcher installed; it recognises a replacement's
frames by their code object (:func:`observable`), tells apart closures that share
one (:func:`pick`), and at the call event clones the frame's arguments
(:func:`capture`) before the replacement can modify them in place.
"""

from __future__ import annotations

import inspect
import threading
import types
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple


if TYPE_CHECKING:
    from ._precision_records import PrecisionRecord

__all__ = ["PatchState", "Pending", "capture", "frame_arguments", "observable", "pick"]

_NOT_OBSERVABLE_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class PatchState:
    """One selected patch as the check follows it: the function watched, the original."""

    __slots__ = ("done", "function", "lock", "original", "record")

    def __init__(self, record: PrecisionRecord) -> None:
        self.record = record
        self.function: types.FunctionType | None = None
        self.original: Any = None
        self.done = False
        self.lock = threading.Lock()


class Pending(NamedTuple):
    """A checked call between its call and return events."""

    frame: types.FrameType
    state: PatchState
    call: int
    names: list[str]
    inputs: tuple[tuple[Any, ...], dict[str, Any]]
    grad_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None
    rng: Any
    buffers: Any


def capture(frame: types.FrameType, state: PatchState, call: int, *, gradients: bool) -> Pending:
    """Clones of a call's inputs and the RNG state, taken before the replacement runs."""
    import torch

    from ._rerun import Buffers
    from ._rerun import clone_inputs

    args, kwargs, names = frame_arguments(frame)
    grad_inputs = None
    if gradients and torch.is_grad_enabled():
        grad_inputs = clone_inputs(args, kwargs)
    return Pending(
        frame,
        state,
        call,
        names,
        clone_inputs(args, kwargs),
        grad_inputs,
        torch.get_rng_state(),
        Buffers(names, (args, kwargs)),
    )


def observable(function: Any) -> tuple[types.FunctionType | None, str | None]:
    """The Python function whose frames are the patch's replacement running."""
    if isinstance(function, type):
        return None, (
            "the replacement is a class: calls cannot be compared (patch its methods to check them)"
        )
    if not isinstance(function, types.FunctionType):
        return None, (
            f"the replacement is a {type(function).__name__}, not a Python function: "
            "its calls cannot be observed"
        )
    if function.__code__.co_flags & _NOT_OBSERVABLE_FLAGS:
        return None, "the replacement is a generator or coroutine function"
    return function, None


def frame_arguments(
    frame: types.FrameType,
) -> tuple[tuple[Any, ...], dict[str, Any], list[str]]:
    """A frame's arguments at its call event: positional ones (and their names), keyword-only ones.

    Positional parameters are passed on positionally, so the original may name them
    differently; keyword-only ones go by name.
    """
    code = frame.f_code
    values = frame.f_locals
    names = code.co_varnames
    count, kwonly = code.co_argcount, code.co_kwonlyargcount
    labels = list(names[:count])
    args = [values[name] for name in labels]
    kwargs = {name: values[name] for name in names[count : count + kwonly] if name in values}
    index = count + kwonly
    if code.co_flags & inspect.CO_VARARGS:
        extra = values[names[index]]
        labels += [f"{names[index]}[{i}]" for i in range(len(extra))]
        args.extend(extra)
        index += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(values[names[index]])
    return tuple(args), kwargs, labels


def pick(frame: types.FrameType, states: list[PatchState]) -> PatchState | None:
    """Which patch a frame belongs to when several replacements share one code object.

    Closures made by one factory share their code; their cell contents tell them apart.
    """
    if len(states) == 1:
        return states[0]
    code = frame.f_code
    values = frame.f_locals
    matches = []
    for state in states:
        function = state.function
        cells = function.__closure__ if function is not None else None
        if cells is None:
            continue
        if all(
            name in values and values[name] is cell.cell_contents
            for name, cell in zip(code.co_freevars, cells, strict=False)
        ):
            matches.append(state)
    return matches[0] if len(matches) == 1 else None
