"""Plain PyTorch on the NPU: CUDA -> NPU redirect, HCCL, torch / numpy / torch_scatter patches.

Hook implementations only. Nothing here imports torch: the declarations are built
from torch-free modules, and replacements that need torch are dotted strings
resolved when their target module is imported.
"""

from __future__ import annotations

from ascend_patch_core import hookimpl

from . import cuda_api
from . import distributed
from . import redirect
from . import runtime


@hookimpl
def register_patches() -> list[object]:
    return [
        # CUDA -> NPU redirect (each group checks for an NPU runtime before installing).
        runtime.NpuRuntime,
        cuda_api.CudaApi,
        redirect.FactoryDevices,
        redirect.Serialization,
        redirect.TensorDevices,
        redirect.ModuleDevices,
        redirect.DeviceContext,
        redirect.GeneratorAndEvent,
        redirect.Autocast,
        distributed.Distributed,
    ]
