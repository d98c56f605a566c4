"""accelerate on the NPU: what its CUDA branches need once ``torch.cuda`` is the NPU.

The torch plugin redirects ``torch.cuda.*`` to ``torch.npu.*``, so a library's
``torch.cuda.is_available()`` answers True on an Ascend machine. accelerate 1.x asks
for the NPU before CUDA where it picks the device and the collective backend
(``PartialState.default_device``, ``_prepare_backend``: ``npu`` and ``hccl``), so
``Accelerator()`` and the ``Trainer`` need nothing here. Two places do:

* ``accelerate.utils.environment.override_numa_affinity`` (``ACCELERATE_CPU_AFFINITY=1``)
  has a CUDA branch only: with CUDA "available" it asks NVML for the GPU's CPU set
  and fails without ``pynvml``. On the NPU it does what it does on a machine without
  CUDA: nothing (torch_npu binds cores itself, ``CPU_AFFINITY_CONF``).
* Under the NPU emulator, whose devices are the CPU, there is no ``hccl`` backend:
  accelerate's ``init_process_group(backend="hccl")`` gets the emulator's collective
  backend (gloo), as the torch plugin does for ``nccl``. On an NPU this patch is
  never installed (its precheck).

Importing this module does not import torch or accelerate.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = [
    "accelerate_patches",
    "emulated",
    "npu_in_use",
    "numa_affinity_on_npu",
    "to_emulated_backend",
]

_log = logging.getLogger("ascend_patch.transformers")


def emulated() -> bool:
    """Whether torch_npu is the NPU emulator's (its NPU tensors are CPU tensors)."""
    return bool(getattr(sys.modules.get("torch_npu"), "__emulated__", False))


def npu_in_use() -> bool:
    """Whether this process drives an NPU: torch_npu imported and a device visible."""
    if "torch_npu" not in sys.modules:
        return False
    torch = sys.modules["torch"]
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def numa_affinity_on_npu(local_process_index: int, verbose: bool | None = None) -> None:
    """accelerate's NUMA binding on an NPU: none, as on any machine without CUDA."""
    _log.debug(
        "ascend-patch: no NVML NUMA binding for NPU process %d (torch_npu binds cores)",
        local_process_index,
    )


def _numa_check(*args: Any, **kwargs: Any) -> bool:
    return npu_in_use()


def to_emulated_backend(original: Callable[..., Any]) -> Callable[..., Any]:
    """``init_process_group(backend="hccl")`` as accelerate calls it -> gloo under the emulator."""

    @functools.wraps(original)
    def prepare_backend(self: Any, *args: Any, **kwargs: Any) -> Any:
        backend, distributed_type = original(self, *args, **kwargs)
        if backend == "hccl" and emulated():
            backend = "gloo"
        return backend, distributed_type

    return prepare_backend


def accelerate_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The accelerate patches (see the module documentation)."""
    yield AtomicPatch(
        "accelerate.utils.environment.override_numa_affinity",
        numa_affinity_on_npu,
        runtime_check=_numa_check,
    )
    yield AtomicPatch(
        "accelerate.state.PartialState._prepare_backend",
        target_wrapper=to_emulated_backend,
        precheck=emulated,
    )
