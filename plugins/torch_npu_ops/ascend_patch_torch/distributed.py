"""torch.distributed on the NPU: ``nccl`` -> ``hccl``, CUDA device ids -> NPU.

Only a backend *name* is rewritten -- ``"nccl"``, or the ``nccl`` / ``cuda`` parts of a
per-device spec such as ``"cpu:gloo,cuda:nccl"`` -- never an arbitrary string
containing them (``transfer_to_npu`` rewrote ``nccl`` inside any positional string,
init_method URLs and file paths included).

Under the NPU emulator, whose devices are the CPU, the backend becomes ``gloo``
instead of ``hccl`` (see :func:`npu_backend`), so these patches run and are tested on CPU.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from ._calls import Param
from ._calls import always
from ._calls import cuda_check
from ._calls import rewrite_call
from .devices import NPU
from .devices import to_npu_spec
from .redirect import redirect_patch
from .runtime import npu_runtime_importable


__all__ = [
    "HCCL",
    "distributed_patches",
    "emulated",
    "is_hccl_available",
    "names_nccl",
    "npu_backend",
    "npu_process_group_class",
    "to_hccl_backend",
]

HCCL = "hccl"


def _backend_parts(backend: str) -> list[tuple[str | None, str]]:
    parts: list[tuple[str | None, str]] = []
    for item in backend.split(","):
        dev, sep, name = item.strip().partition(":")
        parts.append((dev.strip(), name.strip()) if sep else (None, dev.strip()))
    return parts


def names_nccl(backend: object) -> bool:
    """Whether a backend spec uses NCCL or names the CUDA device."""
    if type(backend) is not str:
        return False
    return any(
        name.lower() == "nccl" or (dev is not None and dev.lower() == "cuda")
        for dev, name in _backend_parts(backend)
    )


def emulated() -> bool:
    """Whether torch_npu is the NPU emulator's (its NPU tensors are CPU tensors)."""
    return bool(getattr(sys.modules.get("torch_npu"), "__emulated__", False))


def npu_backend() -> str:
    """The collective backend for NPU tensors: ``hccl``, or ``gloo`` under the NPU emulator."""
    return "gloo" if emulated() else HCCL


def to_hccl_backend(backend: Any) -> Any:
    """``"nccl"`` -> ``"hccl"``; ``"cpu:gloo,cuda:nccl"`` -> ``"cpu:gloo,npu:hccl"``; else unchanged."""
    if not names_nccl(backend):
        return backend
    collective = npu_backend()
    items = []
    for dev, name in _backend_parts(backend):
        name = collective if name.lower() == "nccl" else name
        if dev is None:
            items.append(name)
        else:
            items.append(f"{NPU if dev.lower() == 'cuda' else dev}:{name}")
    return ",".join(items)


def _backend_rewriter(
    backend: Param, devices: tuple[Param, ...]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def on_hccl(*args: Any, **kwargs: Any) -> Any:
            assert backend.position is not None and backend.keyword is not None
            if backend.position < len(args):
                value = args[backend.position]
                if names_nccl(value):
                    args = (
                        *args[: backend.position],
                        to_hccl_backend(value),
                        *args[backend.position + 1 :],
                    )
            elif names_nccl(kwargs.get(backend.keyword)):
                kwargs = {**kwargs, backend.keyword: to_hccl_backend(kwargs[backend.keyword])}
            args, kwargs = rewrite_call(devices, args, kwargs)
            return original(*args, **kwargs)

        return on_hccl

    return wrap


def _backend_check(backend: Param, devices: tuple[Param, ...]) -> Callable[..., bool]:
    names_cuda = cuda_check(devices)

    def names_nccl_or_cuda(*args: Any, **kwargs: Any) -> bool:
        assert backend.position is not None and backend.keyword is not None
        value = (
            args[backend.position] if backend.position < len(args) else kwargs.get(backend.keyword)
        )
        return names_nccl(value) or names_cuda(*args, **kwargs)

    return names_nccl_or_cuda


def _backend_patch(name: str, backend: Param, devices: tuple[Param, ...]) -> AtomicPatch:
    return AtomicPatch(
        f"torch.distributed.distributed_c10d.{name}",
        aliases=(f"torch.distributed.{name}",),
        target_wrapper=_backend_rewriter(backend, devices),
        runtime_check=_backend_check(backend, devices),
        precheck=npu_runtime_importable,
    )


_DDP_DEVICES = (Param(2, "device_ids", many=True), Param(3, "output_device"))
_ddp_names_cuda = cuda_check(_DDP_DEVICES)


def _ddp_check(*args: Any, **kwargs: Any) -> bool:
    if _ddp_names_cuda(*args, **kwargs):
        return True
    return emulated() and any(
        p.position is not None
        and (args[p.position] if p.position < len(args) else kwargs.get(p.keyword or ""))
        is not None
        for p in _DDP_DEVICES
    )


def _ddp_rewriter(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def on_npu(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = rewrite_call(_DDP_DEVICES, args, kwargs)
        if emulated():
            # Emulated NPU parameters are CPU tensors, and DDP takes no device ids for
            # CPU modules: on the emulator the ids name the one device there is.
            for param in _DDP_DEVICES:
                assert param.position is not None and param.keyword is not None
                if param.position < len(args):
                    args = (*args[: param.position], None, *args[param.position + 1 :])
                elif param.keyword in kwargs:
                    kwargs = {**kwargs, param.keyword: None}
        return original(*args, **kwargs)

    return on_npu


def is_hccl_available() -> bool:
    """``is_nccl_available`` on the NPU: whether the hccl backend can be used."""
    dist = sys.modules["torch.distributed"]
    probe = getattr(dist, "is_hccl_available", None)
    if probe is not None:
        return bool(probe())
    return bool(dist.is_backend_available(npu_backend()))


def _is_hccl_available(original: Callable[..., Any]) -> Callable[..., Any]:
    return is_hccl_available


def _collective_device(spec: Any) -> Any:
    """The device whose collective backend serves NPU tensors: the NPU (the CPU under the emulator)."""
    torch = sys.modules["torch"]
    if emulated():
        return torch.device("cpu")
    return to_npu_spec(torch.device(spec) if isinstance(spec, str) else spec)


def _get_backend_rewriter(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_npu_backend(self: Any, device: Any) -> Any:
        return original(self, _collective_device(device))

    return get_npu_backend


_GET_BACKEND_DEVICE = (Param(1, "device"),)


def npu_process_group_class() -> Any:
    """``ProcessGroupHCCL`` (``ProcessGroupGloo`` under the NPU emulator), or None."""
    if emulated():
        return getattr(sys.modules["torch.distributed"], "ProcessGroupGloo", None)
    try:
        c10d = importlib.import_module("torch_npu._C._distributed_c10d")
    except ImportError:
        return None
    return getattr(c10d, "ProcessGroupHCCL", None)


def _called(factory: Callable[[], Any]) -> Any:
    # A replacement_wrapper: the value is computed at install (torch_npu imported by then).
    return factory()


def _has_npu_process_group() -> bool:
    return npu_runtime_importable() and npu_process_group_class() is not None


def _backend_map_for_npu(original: dict[str, str]) -> dict[str, str]:
    """``Backend.default_device_backend_map`` without ``cuda`` (and with ``npu`` on the emulator).

    ``init_process_group()`` without a backend picks the accelerator's entry; torch_npu
    registers ``npu: hccl``, the emulator's NPU gets ``gloo``.
    """
    backends = {device: name for device, name in original.items() if device != "cuda"}
    if emulated():
        backends.setdefault(NPU, "gloo")
    return backends


def distributed_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.Distributed`."""
    yield _backend_patch("init_process_group", Param(0, "backend"), (Param(None, "device_id"),))
    yield _backend_patch("new_group", Param(2, "backend"), (Param(None, "device_id"),))
    yield AtomicPatch(
        "torch.distributed.distributed_c10d.is_nccl_available",
        target_wrapper=_is_hccl_available,
        runtime_check=always,
        precheck=npu_runtime_importable,
        aliases=("torch.distributed.is_nccl_available",),
    )
    yield AtomicPatch(
        "torch.nn.parallel.distributed.DistributedDataParallel.__init__",
        target_wrapper=_ddp_rewriter,
        runtime_check=_ddp_check,
        precheck=npu_runtime_importable,
    )
    yield redirect_patch(
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.__init__",
        (Param(10, "device_id"),),
    )
    yield redirect_patch(
        "torch.distributed.device_mesh.init_device_mesh",
        (Param(0, "device_type"),),
        aliases=("torch.distributed.init_device_mesh",),
    )
    yield redirect_patch(
        "torch.distributed.device_mesh.DeviceMesh.__init__", (Param(1, "device_type"),)
    )
    yield AtomicPatch(
        "torch.distributed.ProcessGroup._get_backend",
        target_wrapper=_get_backend_rewriter,
        runtime_check=cuda_check(_GET_BACKEND_DEVICE),
        precheck=npu_runtime_importable,
    )
    # Two patches, not a target and an alias: a CPU or NPU build of torch has no
    # ProcessGroupNCCL, and only a target can be created.
    for module in ("torch.distributed.distributed_c10d", "torch.distributed"):
        yield AtomicPatch(
            f"{module}.ProcessGroupNCCL",
            npu_process_group_class,
            replacement_wrapper=_called,
            create=True,
            precheck=_has_npu_process_group,
            after_import="torch_npu",
        )
    yield AtomicPatch(
        "torch.distributed.distributed_c10d.Backend.default_device_backend_map",
        target_wrapper=_backend_map_for_npu,
        precheck=npu_runtime_importable,
        after_import="torch_npu",
    )
    yield redirect_patch(
        "torch.distributed.pipelining.stage.PipelineStage.__init__", (Param(4, "device"),)
    )
    yield redirect_patch(
        "torch.distributed.pipelining.stage.build_stage",
        (Param(3, "device"),),
        aliases=("torch.distributed.pipelining.build_stage",),
    )
