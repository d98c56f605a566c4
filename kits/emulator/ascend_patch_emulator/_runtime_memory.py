"""``torch.npu``'s memory API, emulated: tensors live in host memory, so nothing is tracked.

Counters are 0, and a memory snapshot has no segments; ``mem_get_info`` reports the
host's memory. The underscored names are torch_npu's own (``torch.npu.memory._snapshot``).
Memory pools (``MemPool``, ``use_mem_pool``), the allocator API
(``caching_allocator_alloc``, ``NPUPluggableAllocator``, ``change_current_allocator``)
and the per-process fraction keep torch_npu's names, arguments and bookkeeping;
no tensor allocation goes through them (emulated NPU tensors are host tensors).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import pickle
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ._runtime_state import device_index
from ._runtime_state import host_memory
from ._runtime_state import state


__all__ = [
    "MemPool",
    "NPUPluggableAllocator",
    "_NPUAllocator",
    "_dump_snapshot",
    "_get_current_allocator",
    "_record_memory_history",
    "_snapshot",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "change_current_allocator",
    "empty_cache",
    "empty_virt_addr_cache",
    "get_allocator_backend",
    "get_per_process_memory_fraction",
    "host_empty_cache",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "reset_state",
    "set_per_process_memory_fraction",
    "use_mem_pool",
]


def _zero(device: Any = None) -> int:
    device_index(device)
    return 0


memory_allocated = max_memory_allocated = memory_reserved = max_memory_reserved = _zero
memory_cached = max_memory_cached = _zero


def _reset(device: Any = None) -> None:
    device_index(device)


reset_peak_memory_stats = reset_max_memory_allocated = reset_max_memory_cached = _reset
reset_accumulated_memory_stats = _reset


def empty_cache() -> None:
    """Tensors live in host memory: there is no device cache to empty."""


def empty_virt_addr_cache() -> None:
    """No virtual address cache either."""


def host_empty_cache() -> None:
    """No pinned host cache: pinned memory is ordinary host memory here."""


def _no_stats() -> dict[str, Any]:
    return {}


host_memory_stats = host_memory_stats_as_nested_dict = _no_stats


def _no_host_reset() -> None:
    """Nothing is tracked."""


reset_accumulated_host_memory_stats = reset_peak_host_memory_stats = _no_host_reset


def memory_stats(device: Any = None) -> dict[str, Any]:
    device_index(device)
    return {}


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    device_index(device)
    return {}


def memory_snapshot(mempool_id: tuple[int, int] | None = None) -> list[Any]:
    """The allocator's segments: none, since nothing is allocated on a device."""
    return []


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    device_index(device)
    return "emulated NPU: tensors live in host memory; device memory is not tracked\n"


def mem_get_info(device: Any = None) -> tuple[int, int]:
    device_index(device)
    return host_memory()


_fractions: dict[int, float] = {}


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Checked and remembered as torch_npu does; nothing enforces it on host memory."""
    index = device_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _fractions[index] = fraction


def get_per_process_memory_fraction(device: Any = None) -> float:
    return _fractions.get(device_index(device), 1.0)


# --------------------------------------------------------------------------- allocator

#: Buffers handed out by caching_allocator_alloc, by address, until deleted.
_raw_blocks: dict[int, Any] = {}


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """``size`` bytes of host memory; returns their address (an int, as torch_npu)."""
    from ._runtime_streams import Stream
    from ._runtime_streams import current_stream

    index = device_index(device)
    if stream is None:
        stream = current_stream(index)
    if isinstance(stream, Stream):
        stream = stream.npu_stream
    if not isinstance(stream, int):
        raise TypeError(
            "Invalid type for stream argument, must be `torch_npu.npu.Stream` or `int` "
            "representing a pointer to a existing stream"
        )
    block = torch.empty(int(size), dtype=torch.uint8)
    address: int = block.data_ptr()
    _raw_blocks[address] = block
    return address


def caching_allocator_delete(mem_ptr: int) -> None:
    if _raw_blocks.pop(mem_ptr, None) is None:
        raise RuntimeError(f"invalid device pointer: {mem_ptr:#x}")


def get_allocator_backend() -> str:
    return "native"


class _NPUAllocator:
    """Wrapper over an allocator (torch_npu.npu.memory._NPUAllocator)."""

    def __init__(self, allocator: Any) -> None:
        self._allocator = allocator

    def allocator(self) -> Any:
        return self._allocator


class NPUPluggableAllocator(_NPUAllocator):
    """An allocator from a shared library, checked as torch_npu does (file and both symbols).

    Under the emulator no tensor memory comes from it: emulated NPU tensors are host tensors.
    """

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
        library = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(library, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(library, free_fn_name), ctypes.c_void_p).value
        if alloc_fn is None:
            raise RuntimeError("alloc_fn is None")
        if free_fn is None:
            raise RuntimeError("free_fn is None")
        super().__init__((path_to_so_file, alloc_fn, free_fn))


_current_allocator: _NPUAllocator = _NPUAllocator("native")


def change_current_allocator(allocator: _NPUAllocator) -> None:
    """Make ``allocator`` current (reported by ``_get_current_allocator``); nothing allocates with it."""
    global _current_allocator
    if not isinstance(allocator, _NPUAllocator):
        raise TypeError(
            f"expected a torch.npu.memory._NPUAllocator, got {type(allocator).__name__}"
        )
    _current_allocator = allocator


def _get_current_allocator() -> _NPUAllocator:
    return _current_allocator


# --------------------------------------------------------------------------- memory pools

_pool_ids = itertools.count(1)
_pool_lock = threading.Lock()
_active_pools = threading.local()


class MemPool:
    """``torch.npu.MemPool``: a pool id in the caching allocator (torch_npu's description).

    Ids are ``(0, n)``, unique in the process, as torch's user-created pools. The use
    count is 1 plus the ``use_mem_pool`` blocks using it; allocations are not routed
    (they are host allocations), so ``snapshot()`` is empty.
    """

    def __init__(
        self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False
    ) -> None:
        self._id = (0, next(_pool_ids))
        self._allocator = allocator
        self.use_on_oom = use_on_oom
        self.no_split = no_split
        self._uses = 1

    @property
    def id(self) -> tuple[int, int]:
        return self._id

    @property
    def allocator(self) -> Any:
        return self._allocator

    def use_count(self) -> int:
        return self._uses

    def snapshot(self) -> list[Any]:
        return memory_snapshot(self.id)

    def __repr__(self) -> str:
        return f"<torch.npu.MemPool id={self._id} (emulated)>"


def _pool_stack() -> list[MemPool]:
    stack: list[MemPool] | None = getattr(_active_pools, "stack", None)
    if stack is None:
        stack = _active_pools.stack = []
    return stack


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
    """Route this thread's allocations on ``device`` to ``pool`` for the block (bookkeeping only)."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool expects a torch.npu.MemPool, got {type(pool).__name__}")
    device_index(device)
    with _pool_lock:
        pool._uses += 1
    _pool_stack().append(pool)
    try:
        yield
    finally:
        _pool_stack().pop()
        with _pool_lock:
            pool._uses -= 1


# Memory history: torch_npu.npu.memory._record_memory_history / _snapshot / _dump_snapshot.
_history: dict[str, Any] = {"enabled": None}


def _record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
) -> None:
    """Records the settings only: host-memory tensors make no device allocator events."""
    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    device_index(device)
    _history.update(enabled=enabled, context=context, stacks=stacks, max_entries=max_entries)


def _snapshot(device: Any = None) -> dict[str, Any]:
    """A snapshot in torch's format, with no segments and no trace events (nothing is tracked)."""
    device_index(device)
    return {
        "segments": [],
        "device_traces": [[] for _ in range(state.device_count)],
        "allocator_settings": {},
        "emulated": True,
    }


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle :func:`_snapshot` to ``filename``, as ``torch.cuda.memory._dump_snapshot`` does."""
    with open(filename, "wb") as file:
        pickle.dump(_snapshot(), file)


def reset_state() -> None:
    """Forget what a previous activation set: fractions, raw blocks, the current allocator."""
    global _current_allocator
    _fractions.clear()
    _raw_blocks.clear()
    _current_allocator = _NPUAllocator("native")
