"""Plain PyTorch on the NPU: CUDA -> NPU redirect, HCCL, torch / numpy / torch_scatter patches.

Hook implementations only. Nothing here imports torch: the declarations are built
from torch-free modules, and replacements that need torch are dotted strings
resolved when their target module is imported.
"""

from __future__ import annotations

import os

from ascend_patch_core import Patch
from ascend_patch_core import hookimpl

from . import batch_matmul
from . import cuda_api
from . import distributed
from . import internals
from . import numpy_compat
from . import optimizers
from . import profiler
from . import redirect
from . import runtime
from . import scatter_patches
from . import tensor_index


#: Patch groups applied only when named in ``ASCEND_PATCH_TORCH_OPT_IN`` (comma-separated,
#: ``*`` for all): they cost something on every call of a hot function.
OPT_IN: dict[str, type[Patch]] = {
    "TensorIndex": tensor_index.TensorIndex,
    "FusedOptimizers": optimizers.FusedOptimizers,
}


def _opted_in() -> list[type[Patch]]:
    names = {n.strip() for n in os.environ.get("ASCEND_PATCH_TORCH_OPT_IN", "").split(",")}
    names.discard("")
    if "*" in names:
        return list(OPT_IN.values())
    unknown = names - OPT_IN.keys()
    if unknown:
        raise ValueError(
            f"ASCEND_PATCH_TORCH_OPT_IN names {sorted(unknown)}; the opt-in patch groups are"
            f" {sorted(OPT_IN)} (or '*' for all)"
        )
    return [group for name, group in OPT_IN.items() if name in names]


@hookimpl
def register_import_rules() -> list[object]:
    return list(scatter_patches.import_rules())


@hookimpl
def register_patches() -> list[type[Patch]]:
    groups: list[type[Patch]] = [
        # CUDA -> NPU redirect (each patch checks for an NPU runtime before installing).
        runtime.NpuRuntime,
        cuda_api.CudaApi,
        redirect.FactoryDevices,
        redirect.Serialization,
        redirect.TensorDevices,
        redirect.ModuleDevices,
        redirect.Storages,
        redirect.DeviceContext,
        redirect.GeneratorAndEvent,
        redirect.Autocast,
        redirect.ScriptBuiltins,
        internals.TorchInternals,
        distributed.Distributed,
        profiler.Profiler,
        # The seed's table.
        numpy_compat.NumpyCompat,
        batch_matmul.BatchMatmul,
    ]
    if scatter_patches.torch_scatter_installed():
        groups.append(scatter_patches.TorchScatter)
    return groups + _opted_in()


@hookimpl
def configure_env() -> list[object]:
    """Recommended NPU runtime settings (env.py), each written only if the user left it unset."""
    from . import env

    return list(env.recommended_env())
