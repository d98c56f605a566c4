"""Stream and DDP: mmcv 1.x's data-parallel wrappers on NPUs and on torch >= 2.0.

**Stream.** ``mmcv.parallel._functions.Scatter.forward(target_gpus, input)`` is how
mmcv 1.x's ``MMDataParallel`` and ``MMDistributedDataParallel`` (``scatter`` /
``to_kwargs`` -> ``scatter_kwargs``) move the data of a ``DataContainer`` -- the
images, boxes and metas of an mmdet 2.x batch -- onto the devices. mmcv 1.7.2 does
that with ``torch.cuda`` only, and asks torch for the copy streams with
``_get_stream(device_index)``, which newer torch (2.13) rejects: it wants a
``torch.device``. The replacement does the same on NPUs: host tensors are copied on
one ``torch.npu`` side stream per device (kept for as long as the patch is applied),
and each device's current stream then waits for its side stream, so the next kernel
sees the data. Tensors already on an NPU are copied on the current stream. It runs
when ``torch.npu`` is available and the target is not the CPU (``[-1]``); otherwise
mmcv's original runs. Unlike mmcv, which synchronizes the i-th output with the i-th
device when a list does not divide evenly among the devices, every copy is
synchronized with the device it went to.

**DDP.** ``MMDistributedDataParallel._run_ddp_forward`` in mmcv 1.7.2 reads
``self._use_replicated_tensor_module``, which torch 2.0 removed, so every ``forward``
of the wrapper raises ``AttributeError``. The replacement keeps mmcv's step -- the
inputs go through ``self.to_kwargs`` (DataContainer aware) when the wrapper has
``device_ids`` -- and then runs the module through torch's own
``DistributedDataParallel._run_ddp_forward``, which keeps torch's bookkeeping around
the call (``_inside_ddp_forward``). It is device-independent: it fixes the wrapper on
CPU, CUDA and NPU alike, so it has no runtime check.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = [
    "DDP_TARGET",
    "STREAM_TARGET",
    "NpuScatter",
    "ddp_patches",
    "run_ddp_forward",
    "scatters_to_npu",
    "stream_patches",
]

STREAM_TARGET = "mmcv.parallel._functions:Scatter.forward"
DDP_TARGET = "mmcv.parallel.distributed:MMDistributedDataParallel._run_ddp_forward"

_NPU = "npu"
#: mmcv's device list meaning "stay on the host" (CPU inference).
_HOST = [-1]


def _npu_runtime() -> Any:
    """``torch.npu`` when an NPU (or the NPU emulator) is available, else None."""
    torch = sys.modules.get("torch")
    npu = getattr(torch, "npu", None)
    if npu is None:
        return None
    try:
        return npu if npu.is_available() else None
    except Exception:  # a half-initialized runtime counts as no NPU: mmcv's original runs
        return None


def scatters_to_npu(target_gpus: Any, input: Any) -> bool:
    """``runtime_check`` of the Stream patch: device targets, and an NPU to copy to."""
    return list(target_gpus) != _HOST and _npu_runtime() is not None


def _index(device: Any) -> int:
    """A target as mmcv passes it (an index; a ``torch.device`` is accepted too) -> its index."""
    index = getattr(device, "index", device)
    return 0 if index is None else int(index)


class NpuScatter:
    """mmcv 1.x's ``Scatter.forward`` with NPU copies; one side stream per device, reused."""

    def __init__(self) -> None:
        self.copy_streams: dict[int, Any] = {}

    def forward(self, target_gpus: Any, input: Any) -> tuple[Any, ...]:
        """Copy ``input`` (a tensor, or a list spread over the devices in chunks) to ``target_gpus``."""
        npu = sys.modules["torch"].npu
        devices = [_index(device) for device in target_gpus]
        # Host data is copied on side streams; data already on an NPU on the current one.
        on_host = self._input_device(input) == -1
        copies: list[tuple[Any, int, Any]] = []
        outputs = self._scatter(npu, input, devices, on_host, copies)
        for output, device, stream in copies:
            self._synchronize(npu, output, device, stream)
        return tuple(outputs) if isinstance(outputs, list) else (outputs,)

    def _input_device(self, input: Any) -> int:
        """The index of the first NPU any tensor of ``input`` is on; -1 if all are on the host."""
        torch = sys.modules["torch"]
        if isinstance(input, list):
            for item in input:
                device = self._input_device(item)
                if device != -1:
                    return device
            return -1
        if isinstance(input, torch.Tensor):
            return int(input.get_device()) if input.device.type == _NPU else -1
        raise TypeError(f"Unknown type {type(input)}.")

    def _stream(self, npu: Any, device: int) -> Any:
        stream = self.copy_streams.get(device)
        if stream is None:
            stream = self.copy_streams[device] = npu.Stream(device=device)
        return stream

    def _scatter(
        self,
        npu: Any,
        input: Any,
        devices: list[int],
        on_host: bool,
        copies: list[tuple[Any, int, Any]],
    ) -> Any:
        torch = sys.modules["torch"]
        if isinstance(input, list):
            # mmcv's split: consecutive chunks of ceil(len / devices) items per device.
            chunk = (len(input) - 1) // len(devices) + 1
            return [
                self._scatter(npu, item, [devices[i // chunk]], on_host, copies)
                for i, item in enumerate(input)
            ]
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"Unknown type {type(input)}.")
        output = input.contiguous()
        device = devices[0]
        # mmcv copies empty tensors without a side stream: nothing to wait for.
        stream = self._stream(npu, device) if on_host and output.numel() > 0 else None
        with npu.device(device), npu.stream(stream):
            output = output.to(torch.device(_NPU, device), non_blocking=True)
        if stream is not None:
            copies.append((output, device, stream))
        return output

    @staticmethod
    def _synchronize(npu: Any, output: Any, device: int, stream: Any) -> None:
        """The device's current stream waits for the copy, and owns the tensor's memory."""
        with npu.device(device):
            main_stream = npu.current_stream()
            main_stream.wait_stream(stream)
            # An NPU tensor's memory must not be reused before the main stream used it.
            # (Under the NPU emulator the copy is a host tensor: nothing to record.)
            if output.device.type == _NPU:
                output.record_stream(main_stream)


def stream_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.Stream`."""
    scatter = NpuScatter()  # its streams live as long as this patch
    yield AtomicPatch(
        STREAM_TARGET,
        scatter.forward,
        runtime_check=scatters_to_npu,
        note="copies on torch.npu side streams",
    )


def run_ddp_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
    """``MMDistributedDataParallel._run_ddp_forward`` without torch 1.13's replicated module."""
    if self.device_ids:
        moved_inputs, moved_kwargs = self.to_kwargs(inputs, kwargs, self.device_ids[0])
        if moved_inputs:
            inputs, kwargs = moved_inputs[0], moved_kwargs[0]
    distributed_data_parallel = sys.modules["torch"].nn.parallel.DistributedDataParallel
    return distributed_data_parallel._run_ddp_forward(self, *inputs, **kwargs)


def ddp_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.DDP`."""
    yield AtomicPatch(DDP_TARGET, run_ddp_forward, note="torch's _run_ddp_forward, no class swap")
