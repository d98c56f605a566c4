"""The emulated device runtime: what ``torch.npu`` (= ``torch_npu.npu``) offers, on CPU.

Devices are bookkeeping only: every ``npu`` tensor is a CPU tensor, streams and
events complete immediately, device memory is not tracked (all counters are 0),
and the RNG of every emulated device is the CPU generator. Names and signatures
follow ``torch_npu.npu``; values say "emulated" wherever a string is returned.
Imported only by :func:`ascend_patch_emulator.activate`, so importing torch here is fine.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import NamedTuple

import torch


__all__ = [
    "AMP_EXPORTS",
    "DEVICE_NAME",
    "MEMORY_EXPORTS",
    "NPU_EXPORTS",
    "UTILS_EXPORTS",
    "Event",
    "Stream",
    "state",
]

#: What ``torch.npu.get_device_name()`` returns: says plainly that nothing runs on an NPU.
DEVICE_NAME = "Ascend NPU (emulated on CPU by ascend-patch)"


class _State:
    """Per-activation runtime settings, reset by :func:`reset`."""

    def __init__(self) -> None:
        self.active = False
        self.version = ""
        self.device_count = 1
        self._local = threading.local()
        self.jit_compile = True
        self.options: dict[str, Any] = {}

    @property
    def current(self) -> int:
        index: int = getattr(self._local, "device", 0)
        return index

    @current.setter
    def current(self, index: int) -> None:
        self._local.device = index

    def reset(self, *, version: str, device_count: int) -> None:
        self.version = version
        self.device_count = device_count
        self._local = threading.local()
        self.jit_compile = True
        self.options = {}
        config.allow_internal_format = False
        matmul.allow_hf32 = False
        conv.allow_hf32 = True


state = _State()


class _Config:
    """``torch.npu.config``: plain flags, read by nothing in the emulator."""

    allow_internal_format = False


class _Hf32:
    allow_hf32 = False


config = _Config()
matmul = _Hf32()
conv = _Hf32()


# --------------------------------------------------------------------------- devices


def _index(device: Any, *, optional: bool = True) -> int:
    """The device index named by an int, ``"npu:1"``, ``torch.device`` or None (current)."""
    if device is None:
        if optional:
            return state.current
        raise ValueError("expected an NPU device, got None")
    if isinstance(device, bool):
        raise TypeError(f"expected an NPU device (int, 'npu:N' or torch.device), got {device!r}")
    if isinstance(device, int):
        index = device
    else:
        parsed = torch.device(device) if isinstance(device, str) else device
        if not isinstance(parsed, torch.device) or parsed.type != "npu":
            raise ValueError(f"expected an NPU device ('npu', 'npu:N'), got {device!r}")
        index = state.current if parsed.index is None else parsed.index
    if not 0 <= index < state.device_count:
        raise RuntimeError(
            f"invalid NPU device ordinal {index}: the emulator has {state.device_count} "
            f"device(s) (activate(device_count=N) for more)"
        )
    return index


def is_available() -> bool:
    return state.active


def device_count() -> int:
    return state.device_count if state.active else 0


def current_device() -> int:
    return state.current


def set_device(device: Any) -> None:
    state.current = _index(device, optional=False)


def synchronize(device: Any = None) -> None:
    """Nothing is asynchronous on the emulated device."""
    _index(device)


def is_initialized() -> bool:
    return state.active


def init() -> None:
    """Nothing to initialize."""


def _lazy_init() -> None:
    """Nothing to initialize."""


def _lazy_call(callable: Callable[[], Any], **kwargs: Any) -> None:
    callable()


def _is_in_bad_fork() -> bool:
    return False


def get_device_name(device: Any = None) -> str:
    _index(device)
    return DEVICE_NAME


def get_device_capability(device: Any = None) -> None:
    """torch_npu has no compute capability either: it returns None."""
    _index(device)
    return None


class _DeviceProperties(NamedTuple):
    name: str
    total_memory: int
    multi_processor_count: int
    emulated: bool


def get_device_properties(device: Any = None) -> _DeviceProperties:
    _index(device)
    return _DeviceProperties(DEVICE_NAME, _host_memory()[1], 1, True)


def is_bf16_supported() -> bool:
    return True


def is_current_stream_capturing() -> bool:
    """No graph capture under the emulator."""
    return False


def get_amp_supported_dtype() -> list[Any]:
    return [torch.float16, torch.bfloat16, torch.float32]


def utilization(device: Any = None) -> int:
    _index(device)
    return 0


def set_compile_mode(jit_compile: bool = True) -> None:
    state.jit_compile = bool(jit_compile)


def is_jit_compile_false() -> bool:
    return not state.jit_compile


def set_option(option: dict[str, Any]) -> None:
    if not isinstance(option, dict):
        raise TypeError(f"torch.npu.set_option expects a dict, got {type(option).__name__}")
    state.options.update(option)


def get_cann_version(module: str = "CANN") -> str:
    """There is no CANN toolkit under the emulator."""
    return "emulated"


class device:
    """``with torch.npu.device(1):`` selects a device for the block."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None or device == -1 else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = state.current
        if self.idx >= 0:
            state.current = self.idx

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            state.current = self.prev_idx


class device_of(device):
    """``with torch.npu.device_of(tensor):`` selects the tensor's device (always the current one)."""

    def __init__(self, obj: Any) -> None:
        super().__init__(state.current)


# --------------------------------------------------------------------------- streams and events


class Stream:
    """An emulated stream: work submitted to it has always completed."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = _index(device)
        self.priority = priority

    @property
    def device(self) -> Any:
        return torch.device("npu", self.device_index)

    @property
    def npu_stream(self) -> int:
        return id(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def wait_event(self, event: Event) -> None:
        """Nothing to wait for."""

    def wait_stream(self, stream: Stream) -> None:
        """Nothing to wait for."""

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device=npu:{self.device_index} (emulated)>"


class Event:
    """An emulated event; ``elapsed_time`` is host wall-clock time, not NPU time."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._time = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def wait(self, stream: Stream | None = None) -> None:
        """Nothing to wait for."""

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return "<torch.npu.Event (emulated)>"


_streams: dict[int, Stream] = {}
_current_streams = threading.local()


def default_stream(device: Any = None) -> Stream:
    index = _index(device)
    if index not in _streams:
        _streams[index] = Stream(index)
    return _streams[index]


def current_stream(device: Any = None) -> Stream:
    index = _index(device)
    chosen: dict[int, Stream] = getattr(_current_streams, "by_device", {})
    return chosen.get(index) or default_stream(index)


def set_stream(stream: Stream) -> None:
    if not hasattr(_current_streams, "by_device"):
        _current_streams.by_device = {}
    _current_streams.by_device[stream.device_index] = stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    if stream is None:
        yield
        return
    previous = current_stream(stream.device_index)
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(previous)


# --------------------------------------------------------------------------- memory


def _host_memory() -> tuple[int, int]:
    """(available, total) host memory in bytes, or (0, 0) where sysconf cannot tell."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_AVPHYS_PAGES"), page * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _zero(device: Any = None) -> int:
    _index(device)
    return 0


memory_allocated = max_memory_allocated = memory_reserved = max_memory_reserved = _zero
memory_cached = max_memory_cached = _zero


def _reset(device: Any = None) -> None:
    _index(device)


reset_peak_memory_stats = reset_max_memory_allocated = reset_max_memory_cached = _reset
reset_accumulated_memory_stats = _reset


def empty_cache() -> None:
    """Tensors live in host memory: there is no device cache to empty."""


def memory_stats(device: Any = None) -> dict[str, Any]:
    _index(device)
    return {}


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    _index(device)
    return "emulated NPU: tensors live in host memory; device memory is not tracked\n"


def mem_get_info(device: Any = None) -> tuple[int, int]:
    _index(device)
    return _host_memory()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    _index(device)


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
    _index(device)
    _history.update(enabled=enabled, context=context, stacks=stacks, max_entries=max_entries)


def _snapshot(device: Any = None) -> dict[str, Any]:
    """A snapshot in torch's format, with no segments and no trace events (nothing is tracked)."""
    _index(device)
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


# --------------------------------------------------------------------------- random numbers


def manual_seed(seed: int) -> None:
    """Emulated NPU tensors draw from the CPU generator, so that is what gets seeded."""
    torch.random.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    torch.random.default_generator.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    value: int = torch.random.default_generator.initial_seed()
    return value


def get_rng_state(device: Any = "npu") -> Any:
    _index(device)
    return torch.get_rng_state()


def set_rng_state(new_state: Any, device: Any = "npu") -> None:
    _index(device)
    torch.set_rng_state(new_state)


def get_rng_state_all() -> list[Any]:
    return [torch.get_rng_state() for _ in range(state.device_count)]


def set_rng_state_all(new_states: list[Any]) -> None:
    for new_state in new_states[:1]:
        torch.set_rng_state(new_state)


# --------------------------------------------------------------------------- amp


class autocast(torch.amp.autocast_mode.autocast):  # type: ignore[misc]
    """``torch.npu.amp.autocast``: CPU autocast, since emulated NPU tensors are CPU tensors."""

    def __init__(self, enabled: bool = True, dtype: Any = None, cache_enabled: bool = True) -> None:
        super().__init__(
            "cpu",
            dtype=torch.float16 if dtype is None else dtype,
            enabled=enabled,
            cache_enabled=cache_enabled,
        )


class GradScaler(torch.amp.GradScaler):  # type: ignore[misc]
    """``torch.npu.amp.GradScaler``: torch's scaler on the CPU device."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("device", None)
        super().__init__("cpu", *args, **kwargs)


def custom_fwd(fwd: Any = None, *, cast_inputs: Any = None) -> Any:
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="cpu", cast_inputs=cast_inputs)


def custom_bwd(bwd: Any) -> Any:
    return torch.amp.custom_bwd(bwd, device_type="cpu")


def is_autocast_enabled() -> bool:
    enabled: bool = torch.is_autocast_enabled("cpu")
    return enabled


def get_autocast_dtype() -> Any:
    return torch.get_autocast_dtype("cpu")


NPU_EXPORTS = (
    "Event",
    "Stream",
    "_is_in_bad_fork",
    "_lazy_call",
    "_lazy_init",
    "config",
    "conv",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_initialized",
    "is_jit_compile_false",
    "manual_seed",
    "manual_seed_all",
    "matmul",
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
    "seed",
    "seed_all",
    "set_compile_mode",
    "set_device",
    "set_option",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
    "utilization",
)

AMP_EXPORTS = (
    "GradScaler",
    "autocast",
    "custom_bwd",
    "custom_fwd",
    "get_autocast_dtype",
    "is_autocast_enabled",
)

MEMORY_EXPORTS = (
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
)

UTILS_EXPORTS = ("get_cann_version", "is_jit_compile_false", "set_compile_mode")
