"""``torch.npu``'s memory API, emulated: tensors live in host memory, so nothing is tracked.

Counters are 0, and a memory snapshot has no segments; ``mem_get_info`` reports the
host's memory. The underscored names are torch_npu's own (``torch.npu.memory._snapshot``).
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from ._runtime_state import device_index
from ._runtime_state import host_memory
from ._runtime_state import state


__all__ = [
    "_dump_snapshot",
    "_record_memory_history",
    "_snapshot",
    "empty_cache",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
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


def memory_stats(device: Any = None) -> dict[str, Any]:
    device_index(device)
    return {}


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    device_index(device)
    return "emulated NPU: tensors live in host memory; device memory is not tracked\n"


def mem_get_info(device: Any = None) -> tuple[int, int]:
    device_index(device)
    return host_memory()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    device_index(device)


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
