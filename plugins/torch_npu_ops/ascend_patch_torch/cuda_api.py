"""``torch.cuda.*`` redirected to ``torch.npu.*``: device management, streams, events,
memory (history and snapshots included), RNG, graphs and the legacy tensor types.

Functions are replaced by small delegates that look ``torch.npu.<name>`` up when
called, so nothing here needs torch_npu before the program uses it, and device
arguments such as ``"cuda:1"`` are rewritten on the way. Every call is counted in the
report. Classes (``Event``, graphs, ``MemPool``, ``*Tensor``) are replaced by the NPU
classes themselves, once torch_npu is imported, so ``isinstance`` and subclassing keep
working; the classes that take a device (``device``, ``Stream``, ``ExternalStream``)
by a stand-in (:func:`ascend_patch_torch._proxies.proxy_of`) that rewrites the device
and builds the NPU class, so ``torch.cuda.device("cuda:0")`` and
``torch.cuda.Stream(device=torch.device("cuda", 0))`` work and ``isinstance`` still
holds. A class torch_npu does not have is skipped, and named in the report.
``torch.cuda.nvtx`` goes to torch_npu's ``mstx`` (:mod:`ascend_patch_torch.cuda_nvtx`).

``torch.cuda.amp`` needs nothing here: its ``autocast`` and ``GradScaler`` derive from
``torch.amp``'s, which :mod:`ascend_patch_torch.redirect` patches.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from ._calls import Param
from ._calls import always
from ._calls import device
from ._calls import rewrite_call
from .cuda_nvtx import nvtx_patches
from .runtime import npu_module
from .runtime import npu_runtime_importable


__all__ = ["cuda_api_patches", "to_npu_function", "to_npu_memory_function"]


def to_npu_function(
    name: str, params: tuple[Param, ...] = (), npu_name: str | None = None
) -> Callable[..., Any]:
    """A stand-in for ``torch.cuda.<name>`` calling ``torch.npu.<npu_name>`` with NPU devices."""
    target = npu_name or name

    def redirected(*args: Any, **kwargs: Any) -> Any:
        if params:
            args, kwargs = rewrite_call(params, args, kwargs)
        try:
            function = getattr(npu_module(), target)
        except AttributeError:
            raise AttributeError(
                f"torch.cuda.{name} is redirected to torch.npu.{target}, which this torch_npu"
                " does not have; disable the patch 'CudaApi' or call an NPU equivalent"
            ) from None
        return function(*args, **kwargs)

    redirected.__name__ = name
    redirected.__qualname__ = name
    redirected.__module__ = "torch.cuda"
    redirected.__doc__ = f"Redirected by ascend-patch to ``torch.npu.{target}``."
    return redirected


# name -> (module defining it under torch.cuda, device parameters). Integers are left
# alone: under torch.cuda they are device indexes already, and torch.npu reads them the same.
_D0 = (device(0),)
_D1 = (device(1),)
_FUNCTIONS: dict[str, tuple[str, tuple[Param, ...]]] = {
    # device management
    "is_available": ("", ()),
    "is_initialized": ("", ()),
    "init": ("", ()),
    "device_count": ("", ()),
    "current_device": ("", ()),
    "set_device": ("", _D0),
    "get_device_name": ("", _D0),
    "get_device_properties": ("", _D0),
    "get_device_capability": ("", _D0),
    "can_device_access_peer": ("", (device(0), Param(1, "peer_device"))),
    "synchronize": ("", _D0),
    "utilization": ("", _D0),
    "ipc_collect": ("", ()),
    "set_sync_debug_mode": ("", ()),
    "get_sync_debug_mode": ("", ()),
    "current_blas_handle": ("", ()),
    # streams
    "stream": ("", ()),
    "set_stream": ("", ()),
    "current_stream": ("", _D0),
    "default_stream": ("", _D0),
    # memory
    "mem_get_info": ("memory", _D0),
    "empty_cache": ("memory", ()),
    "memory_stats": ("memory", _D0),
    "memory_stats_as_nested_dict": ("memory", _D0),
    "reset_accumulated_memory_stats": ("memory", _D0),
    "reset_peak_memory_stats": ("memory", _D0),
    "reset_max_memory_allocated": ("memory", _D0),
    "reset_max_memory_cached": ("memory", _D0),
    "memory_allocated": ("memory", _D0),
    "max_memory_allocated": ("memory", _D0),
    "memory_reserved": ("memory", _D0),
    "max_memory_reserved": ("memory", _D0),
    "memory_cached": ("memory", _D0),
    "max_memory_cached": ("memory", _D0),
    "memory_snapshot": ("memory", ()),
    "memory_summary": ("memory", _D0),
    "caching_allocator_alloc": ("memory", _D1),
    "caching_allocator_delete": ("memory", ()),
    "get_per_process_memory_fraction": ("memory", _D0),
    "set_per_process_memory_fraction": ("memory", _D1),
    "get_allocator_backend": ("memory", ()),
    "host_memory_stats": ("memory", ()),
    "host_memory_stats_as_nested_dict": ("memory", ()),
    "reset_accumulated_host_memory_stats": ("memory", ()),
    "reset_peak_host_memory_stats": ("memory", ()),
    "use_mem_pool": ("memory", _D1),
    "change_current_allocator": ("memory", ()),
    # RNG
    "manual_seed": ("random", ()),
    "manual_seed_all": ("random", ()),
    "seed": ("random", ()),
    "seed_all": ("random", ()),
    "initial_seed": ("random", ()),
    "get_rng_state": ("random", _D0),
    "set_rng_state": ("random", _D1),
    "get_rng_state_all": ("random", ()),
    "set_rng_state_all": ("random", ()),
    # graphs
    "graph_pool_handle": ("graphs", ()),
    "is_current_stream_capturing": ("graphs", ()),
    "make_graphed_callables": ("graphs", ()),
}

# torch.cuda class -> (module defining it under torch.cuda, torch.npu class, device
# parameters). A class with device parameters is replaced by a stand-in rewriting them.
_CLASSES: dict[str, tuple[str, str, tuple[Param, ...]]] = {
    "device": ("", "device", _D0),
    "device_of": ("", "device_of", ()),
    "StreamContext": ("", "StreamContext", ()),
    "Stream": ("streams", "Stream", _D0),
    "Event": ("streams", "Event", ()),
    "ExternalStream": ("streams", "ExternalStream", _D1),
    "graph": ("graphs", "graph", ()),
    "CUDAGraph": ("graphs", "NPUGraph", ()),
    "MemPool": ("memory", "MemPool", ()),
    # Legacy tensor and storage types keep their dtype (transfer_to_npu turned
    # DoubleTensor into FloatTensor silently).
    **{
        f"{dtype}{kind}": ("", f"{dtype}{kind}", ())
        for dtype in (
            "Bool",
            "Byte",
            "Char",
            "Short",
            "Int",
            "Long",
            "Half",
            "Float",
            "Double",
            "BFloat16",
        )
        for kind in ("Tensor", "Storage")
    },
}


# torch.cuda.memory private functions -> torch.npu.memory (memory history and snapshots).
_MEMORY_HISTORY = ("_record_memory_history", "_snapshot", "_dump_snapshot")


def to_npu_memory_function(name: str) -> Callable[..., Any]:
    """A stand-in for ``torch.cuda.memory.<name>`` calling ``torch.npu.memory.<name>``."""
    params = (Param(4, "device"),) if name == "_record_memory_history" else ()
    if name == "_snapshot":
        params = (device(0),)

    def redirected(*args: Any, **kwargs: Any) -> Any:
        if params:
            args, kwargs = rewrite_call(params, args, kwargs)
        memory = getattr(npu_module(), "memory", None)
        function = getattr(memory, name, None)
        if function is None:
            raise AttributeError(
                f"torch.cuda.memory.{name} is redirected to torch.npu.memory.{name}, which this"
                " torch_npu does not have; disable the patch 'CudaApi' or call an NPU equivalent"
            )
        return function(*args, **kwargs)

    redirected.__name__ = redirected.__qualname__ = name
    redirected.__module__ = "torch.cuda.memory"
    redirected.__doc__ = f"Redirected by ascend-patch to ``torch.npu.memory.{name}``."
    return redirected


def _is_bf16_supported(including_emulation: bool = True) -> Any:
    # torch.npu's takes no argument.
    return npu_module().is_bf16_supported()


def _npu_class(npu_name: str) -> Callable[..., Any]:
    def has_it() -> bool:
        return hasattr(npu_module(), npu_name)

    has_it.__name__ = f"torch_npu_has_{npu_name}"
    return has_it


def _class_from_npu(name: str, npu_name: str, params: tuple[Param, ...]) -> Callable[[Any], Any]:
    def npu_class(original: Any) -> Any:
        cls = getattr(npu_module(), npu_name)
        if not params:
            return cls
        from ._proxies import proxy_of

        return proxy_of(
            cls,
            params,
            module="torch.cuda",
            doc=f"``torch.cuda.{name}``: builds ``torch.npu.{npu_name}``, CUDA devices moved to the NPU.",
        )

    npu_class.__name__ = f"npu_{npu_name}"
    return npu_class


def _alias(module: str, name: str) -> tuple[str, ...]:
    return (f"torch.cuda.{module}.{name}",) if module else ()


def cuda_api_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.CudaApi`."""
    for name, (module, params) in _FUNCTIONS.items():
        yield AtomicPatch(
            f"torch.cuda.{name}",
            to_npu_function(name, params),
            aliases=_alias(module, name),
            runtime_check=always,
            precheck=npu_runtime_importable,
        )
    yield AtomicPatch(
        "torch.cuda.is_bf16_supported",
        _is_bf16_supported,
        runtime_check=always,
        precheck=npu_runtime_importable,
    )
    for name in _MEMORY_HISTORY:
        yield AtomicPatch(
            f"torch.cuda.memory.{name}",
            to_npu_memory_function(name),
            runtime_check=always,
            precheck=npu_runtime_importable,
        )
    for name, (module, npu_name, params) in _CLASSES.items():
        yield AtomicPatch(
            f"torch.cuda.{name}",
            target_wrapper=_class_from_npu(name, npu_name, params),
            aliases=_alias(module, name),
            precheck=_npu_class(npu_name),
            after_import="torch_npu",
        )
    yield from nvtx_patches()
