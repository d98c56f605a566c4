"""Call counting for patches without a ``runtime_check``, when asked for.

A ``runtime_check`` wrapper counts replacement and fallback calls anyway (it exists
to choose between them). Other patches install the replacement object itself:
nothing sits on the call path, so nothing can count. ``Patcher(count_calls=True)``
or ``ASCEND_PATCH_COUNT_CALLS=1`` puts a counting wrapper around each replacement
that is a Python function (also inside a staticmethod or classmethod), so the
report says which patches a program really called. Off (the default) the installer
does not come here at all: the cost is one test per patch at install time and
nothing per call. On, a call costs one more Python call (docs/core.md has the
measured numbers). Classes, builtins and other objects are installed as they are,
uncounted: wrapping them in a function would change what they are (``isinstance``,
subclassing, binding as a method).
"""

from __future__ import annotations

import types
from typing import Any

from .._model.report import CallCounters
from .._model.report import Record


__all__ = ["counted"]

_FUNCTION = types.FunctionType


def counted(new: Any, record: Record) -> Any:
    """``new`` with a counting wrapper around its function (the counts go to ``record``),
    or ``new`` itself when it is not a Python function, bare or in a static/classmethod.

    The wrapper looks like the replacement to tools (name, qualname, module,
    docstring, ``__dict__``, ``__wrapped__``).
    """
    descriptor = type(new) if type(new) in (staticmethod, classmethod) else None
    function = new.__func__ if descriptor is not None else new
    if type(function) is not _FUNCTION:
        return new
    if record.counters is None:
        record.counters = CallCounters()
    tick = record.counters.replacements.__next__

    def counting(*args: Any, **kwargs: Any) -> Any:
        tick()
        return function(*args, **kwargs)

    counting.__module__ = function.__module__
    counting.__name__ = function.__name__
    counting.__qualname__ = function.__qualname__
    counting.__doc__ = function.__doc__
    counting.__dict__.update(function.__dict__)
    counting.__wrapped__ = function  # type: ignore[attr-defined]
    return descriptor(counting) if descriptor is not None else counting
