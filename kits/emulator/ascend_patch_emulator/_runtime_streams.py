"""``torch.npu``'s streams and events, emulated: everything submitted has completed.

Each thread has its own current stream per device, as on a real device. Names and
behaviour follow torch_npu's ``torch_npu/npu/streams.py`` and ``utils.py``
(``StreamContext``, ``stream``, ``set_stream``); what an emulated stream cannot do
(wait for anything) it does not need to.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import torch

from ._runtime_state import device_index
from ._runtime_state import state


__all__ = [
    "Event",
    "ExternalStream",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "reset",
    "set_stream",
    "stream",
]

#: Stream ids are unique in the process; 0 is every device's default stream, as in torch.
_stream_ids = itertools.count(1)


class Stream:
    """An emulated stream: work submitted to it has always completed.

    ``Stream(device=None, priority=0)``; ``device`` is an index, ``"npu:N"`` or a
    ``torch.device`` (None: the current device). Two objects for the same stream
    compare equal, as torch_npu's do.
    """

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = device_index(device)
        self.priority = priority
        self.stream_id = next(_stream_ids)

    @property
    def device(self) -> Any:
        return torch.device("npu", self.device_index)

    @property
    def device_type(self) -> int:
        return int(torch._C._autograd.DeviceType.PrivateUse1)

    @property
    def npu_stream(self) -> int:
        """The stream handle (an opaque number here: there is no aclrtStream)."""
        return self.stream_id

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return False
        return (self.npu_stream, self.device_index) == (other.npu_stream, other.device_index)

    def __hash__(self) -> int:
        return hash((self.npu_stream, self.device_index))

    def __repr__(self) -> str:
        return (
            f"<torch_npu.npu.Stream device=npu:{self.device_index} "
            f"npu_stream={self.npu_stream:#x} (emulated)>"
        )


class _DefaultStream(Stream):
    """A device's default stream (id 0), the one current until another is set."""

    def __init__(self, index: int) -> None:
        self.device_index = index
        self.priority = 0
        self.stream_id = 0


class ExternalStream(Stream):
    """``torch.npu.ExternalStream(stream_ptr, device=None)``: a stream made elsewhere.

    As in torch_npu 2.13, such a stream can be made current (``torch.npu.stream``)
    but cannot be synchronized, queried, or record or wait for events: those raise
    ``RuntimeError`` with torch_npu's messages. ``priority`` must stay 0.
    """

    def __init__(self, stream_ptr: int, device: Any = None, **kwargs: Any) -> None:
        if kwargs.get("priority", 0) != 0:
            raise RuntimeError("Priority was explicitly set for an external stream")
        if kwargs.get("is_sync_launch", 0) != 0:
            raise RuntimeError("is_sync_launch was explicitly set for an external stream")
        if not isinstance(stream_ptr, int) or isinstance(stream_ptr, bool):
            raise TypeError(f"stream_ptr must be an int, got {type(stream_ptr).__name__}")
        self.device_index = device_index(device)
        self.priority = 0
        self.stream_id = stream_ptr

    def query(self) -> bool:
        raise RuntimeError(
            "Cannot query external NPU stream status. "
            "The caller must track stream completion externally."
        )

    def synchronize(self) -> None:
        raise RuntimeError(
            "External NPU stream is not supported in NPUStream::synchronize. "
            "The caller is responsible for synchronization of external streams."
        )

    def __repr__(self) -> str:
        return (
            f"<torch_npu.npu.ExternalStream device=npu:{self.device_index} "
            f"npu_stream={self.npu_stream:#x} (emulated)>"
        )


_NOT_ON_EXTERNAL = "External NPU stream is not supported by task queue enqueue."


class Event:
    """An emulated event; ``elapsed_time`` is host wall-clock time, not NPU time."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.interprocess = interprocess
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        if isinstance(stream, ExternalStream):
            raise RuntimeError(_NOT_ON_EXTERNAL)
        self._time = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def wait(self, stream: Stream | None = None) -> None:
        """Nothing to wait for."""
        if isinstance(stream, ExternalStream):
            raise RuntimeError(_NOT_ON_EXTERNAL)

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return "<torch_npu.npu.Event (emulated)>"


_default_streams: dict[int, Stream] = {}
_current_streams = threading.local()


def default_stream(device: Any = None) -> Stream:
    index = device_index(device)
    if index not in _default_streams:
        _default_streams[index] = _DefaultStream(index)
    return _default_streams[index]


def current_stream(device: Any = None) -> Stream:
    index = device_index(device)
    chosen: dict[int, Stream] = getattr(_current_streams, "by_device", {})
    return chosen.get(index) or default_stream(index)


def set_stream(stream: Stream | None) -> None:
    """Make ``stream`` current on its device, for this thread (None: no-op, as torch_npu).

    Its device becomes the current device too, as torch_npu's ``setStream`` (and
    CUDA's) switch to the stream's device: ``device="npu"`` allocations inside
    ``with torch.npu.stream(s):`` go to ``s``'s device.
    """
    if stream is None:
        return
    if not hasattr(_current_streams, "by_device"):
        _current_streams.by_device = {}
    _current_streams.by_device[stream.device_index] = stream
    if state.current != stream.device_index:
        state.current = stream.device_index


class StreamContext:
    """``with torch.npu.StreamContext(s):`` makes ``s`` current on its device for the block.

    As torch_npu's (and CUDA's): a no-op for None; inside the block ``s``'s device is
    the current device (:func:`set_stream`); on exit the previous stream is made
    current again, which restores the previous device, and if ``s`` is on another
    device that device's previous current stream is restored too.
    """

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self.idx = state.current
        self.src_prev_stream: Stream | None = None
        self.dst_prev_stream: Stream | None = None

    def __enter__(self) -> None:
        target = self.stream
        if target is None or self.idx == -1:
            return
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device != target.device:
            self.dst_prev_stream = current_stream(target.device_index)
        set_stream(target)

    def __exit__(self, *exc: object) -> None:
        target = self.stream
        if target is None or self.idx == -1 or self.src_prev_stream is None:
            return
        if self.src_prev_stream.device != target.device:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)


def stream(stream: Stream | None) -> StreamContext:
    """``with torch.npu.stream(s):`` -- a :class:`StreamContext` (None: no-op)."""
    return StreamContext(stream)


def reset() -> None:
    """Forget the streams of a previous activation (device counts may differ)."""
    _default_streams.clear()
    global _current_streams
    _current_streams = threading.local()
