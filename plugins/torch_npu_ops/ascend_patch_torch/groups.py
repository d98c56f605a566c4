"""Every patch group of the plugin (:data:`GROUPS`, in report order) and its import rules.

This module is what ``apply()`` imports. It imports no patch family: a group's
``patches()`` imports its family module only when the group is built, which the
core does only after the group's ``requires`` holds, it is not disabled and, for an
opt-in group (``opt_in = True``), it is enabled (``ASCEND_PATCH_ENABLE``). So a
machine without torch_npu pays for the class definitions below, not for the modules
that implement the redirect (see docs/benchmarks.md, in-torch start-up). The family
modules do not import this one: import a group from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook
from ascend_patch_core import Patch


if TYPE_CHECKING:
    from ascend_patch_core import ImportRule


__all__ = [
    "GROUPS",
    "NPU_RUNTIME",
    "Autocast",
    "BatchMatmul",
    "CudaApi",
    "DeviceContext",
    "Distributed",
    "FactoryDevices",
    "FusedOptimizers",
    "GeneratorAndEvent",
    "ModuleDevices",
    "NpuRuntime",
    "NumpyCompat",
    "Profiler",
    "ScriptBuiltins",
    "Serialization",
    "Storages",
    "TensorDevices",
    "TensorIndex",
    "TorchInternals",
    "TorchScatter",
    "import_rules",
    "torch_scatter_installed",
]

#: The requirement of every group that redirects to the NPU. Checked from metadata
#: before the group's patches are even built (the emulator counts as installed), so
#: a machine without torch_npu pays one lookup per group, not one per patch.
NPU_RUNTIME = "torch-npu"


class NpuRuntime(Patch):
    """Import torch_npu as soon as torch is imported (the redirect needs ``torch.npu``)."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[ModuleHook]:
        from .runtime import npu_runtime_patches

        return npu_runtime_patches(options)


class CudaApi(Patch):
    """``torch.cuda`` functions and classes -> ``torch.npu`` (counted per call)."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .cuda_api import cuda_api_patches

        return cuda_api_patches(options)


class FactoryDevices(Patch):
    """``torch.zeros(..., device="cuda")`` and the other factories -> NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import factory_devices_patches

        return factory_devices_patches(options)


class Serialization(Patch):
    """``torch.load``: ``map_location="cuda"`` -> NPU; without one, CUDA storages load onto the NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import serialization_patches

        return serialization_patches(options)


class TensorDevices(Patch):
    """``Tensor.cuda()``, ``.to("cuda")``, ``is_cuda``, ``new_*``, ``pin_memory`` -> NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import tensor_devices_patches

        return tensor_devices_patches(options)


class ModuleDevices(Patch):
    """``Module.cuda()``, ``.to("cuda")``, ``.to_empty(device="cuda")`` -> NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import module_devices_patches

        return module_devices_patches(options)


class Storages(Patch):
    """``UntypedStorage(n, device="cuda")`` -> NPU; ``TypedStorage.is_cuda`` = ``is_npu``."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import storages_patches

        return storages_patches(options)


class DeviceContext(Patch):
    """``with torch.device("cuda"):`` (and ``set_default_device``) -> NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import device_context_patches

        return device_context_patches(options)


class GeneratorAndEvent(Patch):
    """``torch.Generator("cuda")``, ``torch.Event("cuda")``, ``torch.cuda.default_generators`` -> NPU.

    The proxies wrap whatever ``torch.Generator`` / ``torch.Event`` is when they are
    installed, so ``isinstance`` keeps working and an earlier stand-in (the NPU
    emulator's) still builds the objects.
    """

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import generator_and_event_patches

        return generator_and_event_patches(options)


class ScriptBuiltins(Patch):
    """``torch.jit.script`` keeps compiling ``torch.zeros`` & co. as the aten ops they wrap.

    TorchScript recognizes torch functions by identity in a table it fills once; a
    redirect wrapper installed after that is unknown to it, and scripting a function
    calling ``torch.zeros`` would fail. Scripted code runs the plain aten op (its
    device arguments are not redirected), as it would without ascend-patch.
    """

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import script_builtins_patches

        return script_builtins_patches(options)


class Autocast(Patch):
    """``torch.autocast("cuda")``, ``torch.cuda.amp.*``, ``torch.amp.*(device_type="cuda")`` -> NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .redirect import autocast_patches

        return autocast_patches(options)


class TorchInternals(Patch):
    """Accelerator detection, lazy-module method checks and extension include paths -> NPU."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .internals import torch_internals_patches

        return torch_internals_patches(options)


class Distributed(Patch):
    """``init_process_group("nccl")`` -> hccl; DDP / FSDP / DeviceMesh / pipelining CUDA devices -> NPU.

    Also ``ProcessGroup._get_backend(cuda)``, ``ProcessGroupNCCL`` (= the NPU's process
    group class) and the default backend map (no ``cuda`` entry).
    """

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .distributed import distributed_patches

        return distributed_patches(options)


class Profiler(Patch):
    """``torch.profiler`` with ``ProfilerActivity.CUDA`` -> the NPU (torch_npu.profiler)."""

    requires = NPU_RUNTIME

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .profiler import profiler_patches

        return profiler_patches(options)


class NumpyCompat(Patch):
    """Restore numpy aliases removed in 1.24 and 2.0 (``np.int``, ``np.float``, ``np.float_``, ...)."""

    legacy_name = "numpy_type"
    #: Without numpy there is nothing to do. Not ``numpy>=1.24``: each patch's precheck
    #: already leaves alone an alias numpy still has (1.23 and older have them all), and
    #: a version specifier would import ``packaging.specifiers`` (~10 ms) on every run
    #: that misses the metadata cache, for every user of a recent numpy.
    requires = "numpy"

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .numpy_compat import numpy_compat_patches

        return numpy_compat_patches(options)


class BatchMatmul(Patch):
    """``torch.matmul`` / ``Tensor.matmul`` / ``@`` with a column right operand -> mul + sum."""

    legacy_name = "batch_matmul"

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .batch_matmul import batch_matmul_patches

        return batch_matmul_patches(options)


class TensorIndex(Patch):
    """``x[bool_mask]`` -> ``masked_select`` (opt-in: a check on every tensor indexing)."""

    legacy_name = "index"
    #: Skipped unless enabled by name: ``ASCEND_PATCH_ENABLE=TensorIndex`` (or ``index``).
    opt_in = True

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .tensor_index import tensor_index_patches

        return tensor_index_patches(options)


class FusedOptimizers(Patch):
    """``torch.optim.Adam/AdamW/SGD`` -> ``fused=True`` for NPU parameters (opt-in)."""

    #: Skipped unless enabled by name: ``ASCEND_PATCH_ENABLE=FusedOptimizers``.
    opt_in = True

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .optimizers import fused_optimizers_patches

        return fused_optimizers_patches(options)


class TorchScatter(Patch):
    """An installed torch_scatter, for NPU tensors: its functions -> the compatible ones."""

    legacy_name = "scatter"

    @classmethod
    def patches(cls, options: Any = None) -> Iterator[AtomicPatch]:
        from .scatter import torch_scatter_patches

        return torch_scatter_patches(options)


#: Every group of the plugin, in the order the report lists them.
#: ``plugin.register_patches`` declares :class:`TorchScatter` only where torch_scatter
#: is installed (see :func:`torch_scatter_installed`).
GROUPS: tuple[type[Patch], ...] = (
    # CUDA -> NPU redirect (each patch checks for an NPU runtime before installing).
    NpuRuntime,
    CudaApi,
    FactoryDevices,
    Serialization,
    TensorDevices,
    ModuleDevices,
    Storages,
    DeviceContext,
    GeneratorAndEvent,
    Autocast,
    ScriptBuiltins,
    TorchInternals,
    Distributed,
    Profiler,
    # The DrivingSDK patcher's table.
    NumpyCompat,
    BatchMatmul,
    TorchScatter,
    # Opt-in (``opt_in = True``): always declared, skipped by the core unless enabled by
    # name (ASCEND_PATCH_ENABLE=TensorIndex, apply(enable=...), Patcher.enable(...)):
    # they cost something on every call of a hot function.
    TensorIndex,
    FusedOptimizers,
)


def torch_scatter_installed() -> bool:
    """Whether a real torch_scatter is installed (a ``find_spec``, no import)."""
    # Imported here: groups.py imports only typing modules and the core at module level
    # (the plugin anatomy, docs/plugin-authors.md).
    import importlib.util

    try:
        return importlib.util.find_spec("torch_scatter") is not None
    except (ImportError, ValueError):
        return False


def import_rules() -> list[ImportRule]:
    """Every import rule of the plugin: :mod:`ascend_patch_torch.served.torch_scatter`.

    Served as ``torch_scatter`` (and its ``composite`` / ``utils`` submodules) only when
    torch_scatter is not installed and an NPU runtime is importable; where it is
    installed, :class:`TorchScatter` patches it instead.
    """
    if torch_scatter_installed():
        return []
    # Imported here: runtime.py is a family module (NpuRuntime's), which groups.py does
    # not import at module level, and the core loads its import-rule machinery only for
    # programs that use it.
    from . import runtime

    if not runtime.npu_runtime_importable():
        return []
    from ascend_patch_core import ReplaceImport

    return [
        ReplaceImport("torch_scatter", "ascend_patch_torch.served.torch_scatter:build"),
        ReplaceImport("torch_scatter.composite", "ascend_patch_torch.served.torch_scatter:build"),
        ReplaceImport("torch_scatter.utils", "ascend_patch_torch.served.torch_scatter:build"),
    ]
