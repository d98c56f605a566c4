"""``torch.npu``'s graphs, emulated: ``NPUGraph``, ``graph``, ``graph_pool_handle``.

On an NPU, ``capture_begin``/``capture_end`` record the work launched on the capturing
stream into a graph (aclmdlRI) without running it, and ``replay`` launches it again
on the same memory: inputs are read from, and outputs written to, the tensors that
existed at capture ("static" tensors). Emulated on CPU:

* capture records every aten/npu op the capturing thread dispatches (a
  ``TorchDispatchMode``, so it sees the ops autograd, the optimizer and the program
  run, in order) and runs it, because later ops need real shapes;
* at ``capture_end`` the tensors that existed before capture and were written
  during it get their pre-capture contents back, so, as on the device, capturing an
  optimizer step does not step;
* ``replay`` runs the recorded ops again on the recorded tensors and copies each
  result into the tensor capture produced, so a static output changes in place and
  anything that aliases it (views, ``.grad``) sees the new values.

Host reads of tensor data (``.item()``, ``bool(t)``, ``nonzero``) and
``torch.npu.synchronize()`` raise during capture, as a device refuses them; a replay
whose op would produce another shape raises too. The messages and checks are torch_npu
2.13's where it has one (non-default capture stream, replay or pool before capture).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any
from typing import NamedTuple

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ._runtime_streams import Stream
from ._runtime_streams import StreamContext
from ._runtime_streams import current_stream
from ._runtime_streams import default_stream


__all__ = [
    "NPUGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "not_while_capturing",
    "reset",
]

_CAPTURE_MODES = ("global", "thread_local", "relaxed")
_aten = torch.ops.aten
#: Ops whose result is read on the host, or whose shape depends on tensor data.
_HOST_READS = {
    _aten._local_scalar_dense.default,
    _aten.is_nonzero.default,
    _aten.equal.default,
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique2.default,
    _aten.unique_consecutive.default,
    _aten.unique_dim.default,
}
#: Ops whose output has no defined contents: replay need not run them.
_UNDEFINED_CONTENTS = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
}

#: Ops that write arguments their schema does not mark (running statistics), by position.
_UNDECLARED_WRITES = {_aten.native_batch_norm.default: (3, 4)}

_pool_ids = itertools.count(1)
_capturing = threading.local()


def graph_pool_handle() -> tuple[int, int]:
    """An opaque token naming a graph memory pool (``(n, 0)``, unique in the process)."""
    return (next(_pool_ids), 0)


def _capturing_stream() -> Stream | None:
    stream: Stream | None = getattr(_capturing, "stream", None)
    return stream


def is_current_stream_capturing() -> bool:
    """True while this thread captures a graph on its current stream."""
    stream = _capturing_stream()
    return stream is not None and current_stream(stream.device_index) == stream


def not_while_capturing(what: str) -> None:
    """Raise if this thread is capturing: ``what`` cannot be captured (torch_npu's message)."""
    if is_current_stream_capturing():
        raise RuntimeError(
            f"{what} during NPU graph capture. If you need this call to be captured, please "
            f"file an issue. (ascend-patch's NPU emulator: the replay would not repeat it)"
        )


class _Call(NamedTuple):
    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _written_arguments(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    written = []
    for position, argument in enumerate(func._schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write:
            continue
        if argument.kwarg_only or position >= len(args):
            written.append(kwargs.get(argument.name))
        else:
            written.append(args[position])
    written.extend(args[i] for i in _UNDECLARED_WRITES.get(func, ()) if i < len(args))
    return written


class _Recorder(TorchDispatchMode):  # type: ignore[misc]
    """Records (and runs) the ops of a capture; saves what capture overwrites."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[_Call] = []
        #: storage address -> the storage, for storages the capture produced.
        self.produced: dict[int, Any] = {}
        #: storage address -> (storage, its bytes before the capture first wrote it).
        self.saved: dict[int, tuple[Any, Any]] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _HOST_READS:
            not_while_capturing(f"{func} (a host read of tensor data)")
        for tensor in _tensors(_written_arguments(func, args, kwargs)):
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in self.produced and key not in self.saved:
                self.saved[key] = (storage, storage.clone())
        out = func(*args, **kwargs)
        self.calls.append(_Call(func, args, kwargs, out))
        for tensor in _tensors(_fresh_outputs(func, out)):
            storage = tensor.untyped_storage()
            self.produced.setdefault(storage.data_ptr(), storage)
        return out

    def restore(self) -> None:
        """Give the tensors that existed before capture their pre-capture contents."""
        for storage, before in self.saved.values():
            storage.copy_(before)
        self.saved.clear()
        self.produced.clear()


def _fresh_outputs(func: Any, out: Any) -> list[Any]:
    """The outputs of ``func`` that it allocated (not views of, or written, arguments)."""
    returns = func._schema.returns
    if not returns:
        return []
    values = out if len(returns) > 1 else (out,)
    return [
        value
        for declared, value in zip(returns, values, strict=True)
        if declared.alias_info is None
    ]


def _replay_call(call: _Call) -> None:
    if call.func in _UNDEFINED_CONTENTS:
        return
    result = call.func(*call.args, **call.kwargs)
    # Views and written arguments are up to date already; fresh outputs are copied
    # into the tensors the capture produced, which later ops and the program hold.
    recorded = _fresh_outputs(call.func, call.out)
    for old, new in zip(recorded, _fresh_outputs(call.func, result), strict=True):
        for old_tensor, new_tensor in zip(_tensors(old), _tensors(new), strict=True):
            if old_tensor.shape != new_tensor.shape:
                raise RuntimeError(
                    f"NPU graph replay: {call.func} produced shape {tuple(new_tensor.shape)}, "
                    f"captured {tuple(old_tensor.shape)}; a graph replays fixed shapes "
                    f"(ascend-patch's NPU emulator)"
                )
            old_tensor.copy_(new_tensor)


class NPUGraph:
    """``torch.npu.NPUGraph``: capture once, replay many times (emulated, see the module doc)."""

    def __init__(self) -> None:
        self.auto_dispatch_capture = False
        self._calls: list[_Call] | None = None
        self._recorder: _Recorder | None = None
        self._stream: Stream | None = None
        self._pool: tuple[int, int] | None = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Begin capturing this thread's work on the current stream (use ``torch.npu.graph``)."""
        if capture_error_mode not in _CAPTURE_MODES:
            raise RuntimeError(
                f"Unknown capture error mode. Expected one of {', '.join(_CAPTURE_MODES)}, "
                f"got {capture_error_mode!r}"
            )
        if self._recorder is not None:
            raise RuntimeError("This torch.accelerator.Graph instance is already capturing on NPU.")
        if _capturing_stream() is not None:
            raise RuntimeError("another NPU graph is capturing in this thread")
        stream = current_stream()
        if stream == default_stream(stream.device_index):
            raise RuntimeError(
                "NPU graphs must be captured on a non-default stream. (However, after "
                "capture, it's ok to replay them on the default stream.)"
            )
        self.reset()
        self._pool = tuple(pool) if pool is not None else graph_pool_handle()
        self._stream = stream
        self._recorder = _Recorder()
        _capturing.stream = stream
        self._recorder.__enter__()

    def capture_end(self) -> None:
        """End the capture; ``replay`` may be called from now on."""
        recorder = self._recorder
        if recorder is None:
            raise RuntimeError("capture_end() called before capture_begin().")
        if current_stream(self._stream.device_index if self._stream else None) != self._stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        recorder.__exit__(None, None, None)
        _capturing.stream = None
        self._recorder = None
        recorder.restore()
        self._calls = recorder.calls

    def replay(self) -> None:
        """Run the captured work again on the captured tensors."""
        if self._calls is None:
            raise RuntimeError("Called NPUGraph::replay without a preceding successful capture.")
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            for call in self._calls:
                _replay_call(call)

    def reset(self) -> None:
        """Drop the captured work (and the tensors it holds)."""
        self._calls = None

    def pool(self) -> tuple[int, int]:
        """The id of this graph's memory pool, to share with another capture."""
        if self._pool is None or self._calls is None:
            raise RuntimeError("Called NPUGraph::pool() without a preceding successful capture.")
        return self._pool

    def update(self, cpu_update_input: Any) -> None:
        if not self.auto_dispatch_capture:
            raise RuntimeError(
                "The current graph configuration does not support update,"
                "Try to capture by setting auto_dispatch_capture=True during capture"
            )
        raise RuntimeError(
            "NPUGraph.update (auto_dispatch_capture) is not emulated by ascend-patch's NPU "
            "emulator: it updates the arguments of torch_npu's attention kernels in place"
        )

    def debug_dump(self, debug_path: str) -> None:
        """Writes the recorded op names, one per line (the device dumps its graph as JSON)."""
        with open(debug_path, "w", encoding="utf-8") as file:
            for call in self._calls or ():
                file.write(f"{call.func}\n")

    def __repr__(self) -> str:
        captured = "empty" if self._calls is None else f"{len(self._calls)} ops"
        return f"<torch.npu.NPUGraph {captured} (emulated)>"


class graph:
    """``with torch.npu.graph(g, pool=None, stream=None):`` captures the block into ``g``.

    As torch_npu's: the block runs with ``stream`` (default: one side stream shared
    by all captures) as the current stream.
    """

    default_capture_stream: Stream | None = None

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool: Any = None,
        stream: Stream | None = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.default_capture_stream
        self.stream_ctx = StreamContext(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self.npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self) -> None:
        self.stream_ctx.__enter__()
        try:
            pool = self.pool[0] if self.pool else None
            self.npu_graph.capture_begin(pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.npu_graph.capture_end()
        finally:
            self.stream_ctx.__exit__(*exc)


def reset() -> None:
    """Forget the shared capture stream of a previous activation."""
    graph.default_capture_stream = None
    _capturing.stream = None
