"""Plain PyTorch on the NPU: CUDA -> NPU redirect, HCCL, torch / numpy / torch_scatter patches.

Hook implementations only. Nothing here imports torch: the groups are declared in
:mod:`ascend_patch_torch.groups`, which imports no patch family until a group is
built, and replacements that need torch are dotted strings resolved when their
target module is imported.
"""

from __future__ import annotations

from ascend_patch_core import Patch
from ascend_patch_core import hookimpl

from . import groups


@hookimpl
def register_import_rules() -> list[object]:
    from . import scatter_patches

    return list(scatter_patches.import_rules())


@hookimpl
def register_patches() -> list[type[Patch]]:
    declared: list[type[Patch]] = [
        # CUDA -> NPU redirect (each patch checks for an NPU runtime before installing).
        groups.NpuRuntime,
        groups.CudaApi,
        groups.FactoryDevices,
        groups.Serialization,
        groups.TensorDevices,
        groups.ModuleDevices,
        groups.Storages,
        groups.DeviceContext,
        groups.GeneratorAndEvent,
        groups.Autocast,
        groups.ScriptBuiltins,
        groups.TorchInternals,
        groups.Distributed,
        groups.Profiler,
        # The DrivingSDK patcher's table.
        groups.NumpyCompat,
        groups.BatchMatmul,
    ]
    from . import scatter_patches

    if scatter_patches.torch_scatter_installed():
        declared.append(groups.TorchScatter)
    # Opt-in (``opt_in = True``): always declared, skipped by the core unless enabled by
    # name (ASCEND_PATCH_ENABLE=TensorIndex, apply(enable=...), Patcher.enable(...)):
    # they cost something on every call of a hot function.
    declared += [groups.TensorIndex, groups.FusedOptimizers]
    return declared


@hookimpl
def configure_env() -> list[object]:
    """Recommended NPU runtime settings (env.py), each written only if the user left it unset."""
    from . import env

    return list(env.recommended_env())
