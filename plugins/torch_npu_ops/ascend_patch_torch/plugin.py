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
    """The modules served where the real one is missing (``torch_scatter`` on an NPU machine)."""
    return list(groups.import_rules())


@hookimpl
def register_patches() -> list[type[Patch]]:
    """Every group of the plugin (:data:`groups.GROUPS`), TorchScatter only with torch_scatter."""
    # Without torch_scatter (served by the import rules) TorchScatter is not declared, nor listed.
    installed = groups.torch_scatter_installed()
    return [group for group in groups.GROUPS if installed or group is not groups.TorchScatter]


@hookimpl
def configure_env() -> list[object]:
    """Recommended NPU runtime settings (env.py), each written only if the user left it unset."""
    from . import env

    return list(env.recommended_env())
