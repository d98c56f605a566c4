"""The emulated device runtime: what ``torch.npu`` (= ``torch_npu.npu``) offers, on CPU.

Devices are bookkeeping only: every ``npu`` tensor is a CPU tensor, streams and
events complete immediately, device memory is not tracked (all counters are 0),
and the RNG of every emulated device is the CPU generator. Names and signatures
follow ``torch_npu.npu``; values say "emulated" wherever a string is returned.
Imported only by :func:`ascend_patch_emulator.activate`, so importing torch here is fine.

The shared state is in :mod:`._runtime_state`, streams and events in
:mod:`._runtime_streams`, graphs in :mod:`._runtime_graphs` and
:mod:`._runtime_graphed`, the memory API in :mod:`._runtime_memory`, the legacy
``*Tensor``/``*Storage`` types in :mod:`._runtime_types`; devices, random numbers,
amp, ``mstx`` and the export tables are here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import _runtime_memory
from . import _runtime_types

# _modules fills torch.npu from this module by the names in the export tables below
# (see export()), so the names defined by the sibling modules are bound here too.
from ._runtime_graphed import make_graphed_callables as make_graphed_callables
from ._runtime_graphs import NPUGraph as NPUGraph
from ._runtime_graphs import graph as graph
from ._runtime_graphs import graph_pool_handle as graph_pool_handle
from ._runtime_graphs import is_current_stream_capturing as is_current_stream_capturing
from ._runtime_graphs import not_while_capturing
from ._runtime_mstx import mstx as mstx
from ._runtime_properties import NPUDeviceProperties
from ._runtime_properties import device_properties
from ._runtime_state import config as config
from ._runtime_state import conv as conv
from ._runtime_state import device_index
from ._runtime_state import host_memory
from ._runtime_state import matmul as matmul
from ._runtime_state import state
from ._runtime_streams import Event
from ._runtime_streams import ExternalStream as ExternalStream
from ._runtime_streams import Stream
from ._runtime_streams import StreamContext as StreamContext
from ._runtime_streams import current_stream as current_stream
from ._runtime_streams import default_stream as default_stream
from ._runtime_streams import set_stream as set_stream
from ._runtime_streams import stream as stream


__all__ = [
    "AMP_EXPORTS",
    "DEVICE_NAME",
    "MEMORY_EXPORTS",
    "NPU_EXPORTS",
    "RANDOM_EXPORTS",
    "UTILS_EXPORTS",
    "Event",
    "Stream",
    "export",
    "state",
]

#: What ``torch.npu.get_device_name()`` returns: says plainly that nothing runs on an NPU.
DEVICE_NAME = "Ascend NPU (emulated on CPU by ascend-patch)"


def is_available() -> bool:
    return state.active


def device_count() -> int:
    return state.device_count if state.active else 0


def current_device() -> int:
    return state.current


def set_device(device: Any) -> None:
    state.current = device_index(device, optional=False)


def synchronize(device: Any = None) -> None:
    """Nothing is asynchronous on the emulated device (but a capture cannot synchronize)."""
    device_index(device)
    not_while_capturing("torch.npu.synchronize()")


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Every emulated device is the host: each can reach every other one (not itself, as CUDA)."""
    return device_index(device) != device_index(peer_device)


def ipc_collect() -> None:
    """No inter-process device memory to collect."""


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Remembered only: nothing synchronizes on the emulated device."""
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError(
                "invalid value of debug_mode, expected one of `default`, `warn`, `error`"
            )
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    state.options["sync_debug_mode"] = int(debug_mode)


def get_sync_debug_mode() -> int:
    mode: int = state.options.get("sync_debug_mode", 0)
    return mode


def current_blas_handle() -> int:
    """No BLAS handle: CPU kernels do the work (0, a null handle)."""
    return 0


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
    device_index(device)
    return DEVICE_NAME


def get_device_capability(device: Any = None) -> None:
    """torch_npu has no compute capability either: it returns None."""
    device_index(device)
    return None


def get_device_properties(device: Any = None) -> NPUDeviceProperties:
    """torch_npu's properties object (every name it binds: see ``_runtime_properties``)."""
    return device_properties(device_index(device), DEVICE_NAME, host_memory()[1])


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype() -> list[Any]:
    return [torch.float16, torch.bfloat16, torch.float32]


def utilization(device: Any = None) -> int:
    device_index(device)
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


#: ``torch_npu.npu.utils.get_soc_version()``: a number of torch_npu's SoC enumeration.
#: 220 is the first Ascend 910B; code such as mmengine's
#: ``is_npu_support_full_precision`` compares against it, and the emulator computes
#: in full precision on the CPU.
SOC_VERSION = 220


def get_soc_version() -> int:
    """The emulated device's SoC number (an Ascend 910B-class one: see SOC_VERSION)."""
    return SOC_VERSION


class device:
    """``with torch.npu.device(1):`` selects a device for the block."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None or device == -1 else device_index(device)
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
    device_index(device)
    return torch.get_rng_state()


def set_rng_state(new_state: Any, device: Any = "npu") -> None:
    device_index(device)
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
    "ExternalStream",
    "NPUGraph",
    "Stream",
    "StreamContext",
    "_is_in_bad_fork",
    "_lazy_call",
    "_lazy_init",
    "can_device_access_peer",
    "config",
    "conv",
    "current_blas_handle",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "get_amp_supported_dtype",
    "get_sync_debug_mode",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_initialized",
    "ipc_collect",
    "is_jit_compile_false",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "matmul",
    "mstx",
    "seed",
    "seed_all",
    "set_compile_mode",
    "set_device",
    "set_option",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "set_sync_debug_mode",
    "stream",
    "synchronize",
    "utilization",
    # torch.npu.memory's public names are torch.npu's too, as in torch_npu.
    *(name for name in _runtime_memory.__all__ if not name.startswith(("_", "reset_state"))),
    *_runtime_types.TENSOR_TYPES,
    *_runtime_types.STORAGE_TYPES,
)

AMP_EXPORTS = (
    "GradScaler",
    "autocast",
    "custom_bwd",
    "custom_fwd",
    "get_autocast_dtype",
    "is_autocast_enabled",
)

#: torch.npu.memory: what _runtime_memory defines (and this module re-binds).
MEMORY_EXPORTS = tuple(name for name in _runtime_memory.__all__ if name != "reset_state")

UTILS_EXPORTS = ("get_cann_version", "get_soc_version", "is_jit_compile_false", "set_compile_mode")

#: torch.npu.random (torch_npu.npu.random): the generator functions, also on torch.npu.
#: transformers' Trainer saves and restores the NPU's RNG through it.
RANDOM_EXPORTS = (
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
)


def export(name: str) -> Any:
    """The object ``torch.npu.<name>`` (or a submodule's) is: defined here or in a sibling."""
    for table in (_runtime_types.TENSOR_TYPES, _runtime_types.STORAGE_TYPES):
        if name in table:
            return table[name]
    if name in MEMORY_EXPORTS:
        return getattr(_runtime_memory, name)
    return globals()[name]
