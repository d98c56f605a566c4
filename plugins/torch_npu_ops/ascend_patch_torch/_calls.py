"""Where device arguments sit in a call, and the two callables every redirect patch needs.

A redirect patch is an :class:`~ascend_patch_core.AtomicPatch` with

* ``runtime_check=cuda_check(params)`` -- true when the call names a CUDA device,
  so the report counts redirected calls (replacement) and untouched ones (fallback);
* ``target_wrapper=cuda_rewriter(params)`` -- wraps the original in a function that
  rewrites those arguments (``ascend_patch_torch.devices``) and calls it.

No torch import here: ``plugin.py`` builds the declarations from these helpers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

from .devices import NPU
from .devices import is_cuda_spec
from .devices import to_npu_spec


__all__ = [
    "Param",
    "always",
    "cuda_check",
    "cuda_rewriter",
    "device",
    "rewrite_call",
]


class Param(NamedTuple):
    """One parameter that may hold a device.

    :param position: its index in ``args`` (counting ``self`` for methods), or None if keyword-only.
    :param keyword: its keyword name, or None if positional-only.
    :param ints: torch reads an int there as a device index.
    :param many: the value is a list or tuple of devices (``device_ids``).
    :param absent_is_cuda: leaving it out means CUDA (``GradScaler(device="cuda")``).
    """

    position: int | None
    keyword: str | None
    ints: bool = False
    many: bool = False
    absent_is_cuda: bool = False


def device(position: int | None = None, keyword: str | None = "device", **flags: bool) -> Param:
    """Shorthand for the common ``device=`` parameter."""
    return Param(position, keyword, **flags)


_ABSENT = object()


def _value(param: Param, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if param.position is not None and param.position < len(args):
        return args[param.position]
    if param.keyword is not None:
        return kwargs.get(param.keyword, _ABSENT)
    return _ABSENT


def _names_cuda(param: Param, value: Any) -> bool:
    if value is _ABSENT:
        return param.absent_is_cuda
    if param.many:
        return isinstance(value, (list, tuple)) and any(
            is_cuda_spec(v, ints=param.ints) for v in value
        )
    return is_cuda_spec(value, ints=param.ints)


def _rewritten(param: Param, value: Any) -> Any:
    if value is _ABSENT:
        return NPU
    if param.many:
        return type(value)(to_npu_spec(v, ints=param.ints) for v in value)
    return to_npu_spec(value, ints=param.ints)


def rewrite_call(
    params: Sequence[Param], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``, ``kwargs`` with every CUDA device named by ``params`` replaced by its NPU twin."""
    new_args: list[Any] | None = None
    for param in params:
        value = _value(param, args, kwargs)
        if not _names_cuda(param, value):
            continue
        new = _rewritten(param, value)
        if param.position is not None and param.position < len(args):
            if new_args is None:
                new_args = list(args)
            new_args[param.position] = new
        else:
            assert param.keyword is not None
            kwargs = {**kwargs, param.keyword: new}
    return (tuple(new_args) if new_args is not None else args), kwargs


def cuda_check(params: Sequence[Param]) -> Callable[..., bool]:
    """A ``runtime_check``: does this call name a CUDA device in one of ``params``?"""
    params = tuple(params)

    def names_cuda_device(*args: Any, **kwargs: Any) -> bool:
        # A plain loop: any() over a generator costs a frame per call, and this runs
        # on every Tensor.to().
        for param in params:  # noqa: SIM110
            if _names_cuda(param, _value(param, args, kwargs)):
                return True
        return False

    return names_cuda_device


def cuda_rewriter(params: Sequence[Param]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``target_wrapper``: the original, called with its CUDA devices rewritten to NPU."""
    params = tuple(params)

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def on_npu(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = rewrite_call(params, args, kwargs)
            return original(*args, **kwargs)

        return on_npu

    return wrap


def always(*args: Any, **kwargs: Any) -> bool:
    """A ``runtime_check`` for patches whose every call is a redirect (``torch.cuda.*``).

    It exists so that the report counts those calls.
    """
    return True
