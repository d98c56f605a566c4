"""``torch.npu.mstx`` (torch_npu's profiler marks and ranges), emulated in memory."""

from __future__ import annotations

import functools
import itertools
import threading
import warnings
from collections.abc import Callable
from typing import Any
from typing import ClassVar


__all__ = ["mstx"]

#: Marks kept in memory: a mark per training step must not grow without bound.
_KEPT_MARKS = 1024


class mstx:
    """``torch.npu.mstx``: profiler marks and ranges, kept in memory (no profiler is attached).

    ``marks`` lists the recent marks (trimmed to the last 1024 once past 2048).
    ``range_push`` returns the depth of the new range in this thread (0 for the
    outermost) and ``range_pop`` the depth of the range it ends (-1 with none open), as
    NVTX does; ``range_start`` returns an id for ``range_end``. Invalid arguments warn
    and return -1 / 0, as torch_npu's do.
    """

    marks: ClassVar[list[str]] = []
    _threads = threading.local()
    _open: ClassVar[dict[int, str]] = {}
    _ids = itertools.count(1)

    @staticmethod
    def _stack() -> list[str]:
        stack: list[str] | None = getattr(mstx._threads, "stack", None)
        if stack is None:
            stack = mstx._threads.stack = []
        return stack

    @staticmethod
    def mark(message: str, stream: Any = None, domain: str = "default") -> None:
        if mstx._valid("mark", message, domain):
            mstx.marks.append(message)
            if len(mstx.marks) > 2 * _KEPT_MARKS:
                del mstx.marks[:-_KEPT_MARKS]

    @staticmethod
    def range_push(message: str, stream: Any = None, domain: str = "default") -> int:
        if not mstx._valid("range_push", message, domain):
            return -1
        stack = mstx._stack()
        stack.append(message)
        return len(stack) - 1

    @staticmethod
    def range_pop(domain: str = "default") -> int:
        stack = mstx._stack()
        if not stack:
            return -1
        stack.pop()
        return len(stack)

    @staticmethod
    def range_start(message: str, stream: Any = None, domain: str = "default") -> int:
        if not mstx._valid("range_start", message, domain):
            return 0
        range_id = next(mstx._ids)
        mstx._open[range_id] = message
        return range_id

    @staticmethod
    def range_end(range_id: int, domain: str = "default") -> None:
        mstx._open.pop(range_id, None)

    @staticmethod
    def mstx_range(message: str, stream: Any = None, domain: str = "default") -> Any:
        def wrapper(func: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                range_id = mstx.range_start(message, stream, domain)
                try:
                    return func(*args, **kwargs)
                finally:
                    mstx.range_end(range_id, domain)

            return inner

        return wrapper

    @staticmethod
    def _valid(function: str, message: Any, domain: Any) -> bool:
        if not message or not isinstance(message, str) or not isinstance(domain, str):
            warnings.warn(
                f"Invalid message or domain for mstx.{function}. Please provide valid strings.",
                stacklevel=3,
            )
            return False
        return True
