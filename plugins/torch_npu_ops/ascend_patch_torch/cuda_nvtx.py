"""``torch.cuda.nvtx`` -> torch_npu's ``mstx`` markers (what the Ascend profilers read).

NPU machines run a CPU build of torch, on which every ``torch.cuda.nvtx`` call raises
``NVTX functions not installed``; ``transfer_to_npu`` leaves the module alone. Here each
function goes to ``torch.npu.mstx``, feature-detected per call because ``mstx`` grew
over torch_npu releases (``mark``/``range_start``/``range_end`` first, ``range_push``/
``range_pop`` later):

==================  =============================  =======================================
torch.cuda.nvtx     ``mstx`` has the function       otherwise
==================  =============================  =======================================
``range_push(m)``   ``mstx.range_push(m)``         ``mstx.range_start(m)`` on a per-thread
                                                   stack; returns the depth, as nvtx does
``range_pop()``     ``mstx.range_pop()``           ``mstx.range_end`` of the stack's top;
                                                   the depth left, -1 on an empty stack
``range_start(m)``  ``mstx.range_start(m)``        a fresh range id
``range_end(id)``   ``mstx.range_end(id)``         nothing
``mark(m)``         ``mstx.mark(m)``               nothing
==================  =============================  =======================================

``torch.cuda.nvtx.range`` (context manager and decorator) calls ``range_push`` and
``range_pop`` and so follows. Where there is no ``mstx`` at all (a torch_npu from before
it) the calls succeed and keep nvtx's depth counting, and the markers go nowhere: there
is no profiler to take them, and annotations must not stop a program.

Importing this module does not import torch.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from ._calls import always
from .runtime import npu_module
from .runtime import npu_runtime_importable


__all__ = ["mark", "nvtx_patches", "range_end", "range_pop", "range_push", "range_start"]

_local = threading.local()
_ids = itertools.count(1)


def _mstx_function(name: str) -> Callable[..., Any] | None:
    function: Callable[..., Any] | None = getattr(getattr(npu_module(), "mstx", None), name, None)
    return function


def _open_ranges() -> list[Any]:
    """This thread's open ``range_push`` ranges (their mstx ids, or None), innermost last."""
    stack: list[Any] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def range_push(msg: str) -> int:
    """``torch.cuda.nvtx.range_push`` on the NPU: the zero-based depth of the range started."""
    push = _mstx_function("range_push")
    if push is not None:
        depth: int = push(msg)
        return depth
    start = _mstx_function("range_start")
    stack = _open_ranges()
    stack.append(start(msg) if start is not None else None)
    return len(stack) - 1


def range_pop() -> int:
    """``torch.cuda.nvtx.range_pop`` on the NPU: the depth left, -1 when no range is open."""
    pop = _mstx_function("range_pop")
    if pop is not None:
        depth: int = pop()
        return depth
    stack = _open_ranges()
    if not stack:
        return -1
    range_id = stack.pop()
    end = _mstx_function("range_end")
    if range_id is not None and end is not None:
        end(range_id)
    return len(stack)


def range_start(msg: str) -> int:
    """``torch.cuda.nvtx.range_start`` on the NPU: a handle for :func:`range_end`."""
    start = _mstx_function("range_start")
    if start is not None:
        handle: int = start(msg)
        return handle
    return next(_ids)


def range_end(range_id: int) -> None:
    """``torch.cuda.nvtx.range_end`` on the NPU."""
    end = _mstx_function("range_end")
    if end is not None:
        end(range_id)


def mark(msg: str) -> None:
    """``torch.cuda.nvtx.mark`` on the NPU: an instantaneous marker."""
    marker = _mstx_function("mark")
    if marker is not None:
        marker(msg)


_REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "range_push": range_push,
    "range_pop": range_pop,
    "range_start": range_start,
    "range_end": range_end,
    "mark": mark,
}


def nvtx_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """``torch.cuda.nvtx``'s functions, part of :class:`ascend_patch_torch.groups.CudaApi`."""
    for name, replacement in _REPLACEMENTS.items():
        yield AtomicPatch(
            f"torch.cuda.nvtx.{name}",
            replacement,
            runtime_check=always,
            precheck=npu_runtime_importable,
        )
