"""``torch.npu``'s streams and events, emulated: everything submitted has completed.

Each thread has its own current stream per device, as on a real device.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from ._runtime_state import device_index


__all__ = ["Event", "Stream", "current_stream", "default_stream", "set_stream", "stream"]


class Stream:
    """An emulated stream: work submitted to it has always completed."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = device_index(device)
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
    index = device_index(device)
    if index not in _streams:
        _streams[index] = Stream(index)
    return _streams[index]


def current_stream(device: Any = None) -> Stream:
    index = device_index(device)
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
