"""CPU reference kernels for the ``mx_driving`` ops the plugins call, one module per family.

Each kernel takes the arguments of the real op's Python API (the parameter names and
defaults recorded from the mx-driving wheel in ``data/mx_driving-<version>.json``)
and follows its conventions; the formulas are written from the ops' math (mmcv's
documented semantics, which these ops mirror), not from the wheel's code. Where the
wheel makes a name ``SomeFunction.apply``, the emulator has an autograd Function of
the same class name whose ``apply`` is that name, so autograd behaves as there
(``backward`` where the real one has one, none where it has none).

:func:`implementations` maps each public name with a kernel to the object
``mx_driving.<name>`` is: a function, an autograd Function class, an ``nn.Module``
class, or the ``apply`` of a Function class (:func:`applier`). Every call goes
through :func:`called` first: it refuses to run while the emulator is inactive and
reports the call to the contract recorder.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import torch

from .._errors import EmulatorInactiveError


__all__ = [
    "LIBRARY",
    "MxFunction",
    "applier",
    "called",
    "ensure_active",
    "implementations",
    "public",
    "raw_apply",
]

#: The library name calls are recorded under (the contract check's ``mx_driving``).
LIBRARY = "mx_driving"
#: The family modules, imported by :func:`implementations`.
_FAMILIES = ("msda", "deform", "elementwise", "scatter", "voxel", "losses")


def called(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse when the emulator is off; report ``mx_driving.<name>(...)`` to the recorder."""
    ensure_active(name)
    from .._contract import record_call

    record_call(name, args, kwargs, library=LIBRARY)


def ensure_active(name: str) -> None:
    """Refuse to run ``mx_driving.<name>`` while the emulator is off."""
    from .. import _runtime

    if not _runtime.state.active:
        raise EmulatorInactiveError(
            f"mx_driving.{name}: ascend-patch's NPU emulator is not active (emulated "
            f"mx_driving exists only while it is); call ascend_patch_emulator.activate() first"
        )


class MxFunction(torch.autograd.Function):  # type: ignore[misc]
    """Base of the emulated autograd Functions: ``apply`` checks and reports the call."""

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        called(f"{cls.__name__}.apply", args, kwargs)
        return super().apply(*args, **kwargs)


def raw_apply(function: type[MxFunction], *args: Any) -> Any:
    """``function.apply(*args)`` without reporting it (a kernel calling its own Function)."""
    return super(MxFunction, function).apply(*args)  # type: ignore[misc]


def applier(name: str, function: type[MxFunction]) -> Callable[..., Any]:
    """``mx_driving.<name>`` where the wheel has ``name = function.apply``.

    The call goes to torch's ``Function.apply`` exactly as the real name's does (so
    keywords behave as there); the contract recorder sees ``name``.
    """

    def apply(*args: Any, **kwargs: Any) -> Any:
        called(name, args, kwargs)
        return super(MxFunction, function).apply(*args, **kwargs)  # type: ignore[misc]

    apply.__name__ = apply.__qualname__ = name
    apply.__doc__ = f"mx_driving.{name} = {function.__name__}.apply (emulated on CPU)."
    apply.__wrapped_function__ = function  # type: ignore[attr-defined]
    return apply


def public(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``fn`` is the plain function ``mx_driving.<name>``; its calls are reported."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def function(*args: Any, **kwargs: Any) -> Any:
            called(name, args, kwargs)
            return fn(*args, **kwargs)

        function.__name__ = function.__qualname__ = name
        return function

    return wrap


def implementations() -> dict[str, Any]:
    """Every public mx_driving name with a reference kernel, to what the name is."""
    found: dict[str, Any] = {}
    for family in _FAMILIES:
        module = importlib.import_module(f"{__name__}.{family}")
        found.update(module.PUBLIC)
    return found
