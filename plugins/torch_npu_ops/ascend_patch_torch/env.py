"""Recommended NPU runtime settings, offered through the ``configure_env`` hook.

Each is a default only: the core writes a variable into ``os.environ`` only when it
is unset, before anything imports torch_npu, records it (``ascend-patch doctor``
and the report show the value and the reason), and removes it again on
``revert()``. To override one, set the variable yourself (any value, including
torch_npu's own default, listed below); to turn all of them off, set
``ASCEND_PATCH_NPU_ENV=0``.

They are NPU runtime settings, so they are offered only where an NPU runtime is
importable (torch_npu, or the NPU emulator's stand-in): on a CPU or CUDA machine the
plugin changes nothing, the environment included.

The values and their reasons are in :data:`RECOMMENDED` (and docs/training.md):
``TASK_QUEUE_ENABLE=2`` (torch_npu's default 1), ``CPU_AFFINITY_CONF=1`` (default 0),
``HCCL_CONNECT_TIMEOUT=1200`` (default 120 seconds), ``COMBINED_ENABLE=1`` (default 0).
"""

from __future__ import annotations

from ascend_patch_core import EnvSetting
from ascend_patch_core import env_flag

from .runtime import npu_runtime_importable


__all__ = ["RECOMMENDED", "SWITCH", "recommended_env"]

#: Set to 0 to get none of the recommendations.
SWITCH = "ASCEND_PATCH_NPU_ENV"

RECOMMENDED: tuple[EnvSetting, ...] = (
    EnvSetting(
        "TASK_QUEUE_ENABLE",
        "2",
        "level-2 task-queue pipeline: less host-bound time per step (torch_npu default: 1)",
    ),
    EnvSetting(
        "CPU_AFFINITY_CONF",
        "1",
        "bind each rank's threads to the CPU cores near its NPU (torch_npu default: 0)",
    ),
    EnvSetting(
        "HCCL_CONNECT_TIMEOUT",
        "1200",
        "seconds to wait for every rank to connect; the default 120 is short for many nodes",
    ),
    EnvSetting(
        "COMBINED_ENABLE",
        "1",
        "copy non-contiguous views (slices, transposes) with one fused kernel (torch_npu default: 0)",
    ),
)


def recommended_env() -> list[EnvSetting]:
    """The recommendations where an NPU runtime is importable, unless ``ASCEND_PATCH_NPU_ENV=0``."""
    if not env_flag(SWITCH, True):  # the core's reader: "maybe" is an error, not a guess
        return []
    # The same test every redirect patch makes before it is installed: no torch_npu (and
    # no emulator), no NPU settings. Nothing is imported to answer it.
    if not npu_runtime_importable():
        return []
    return list(RECOMMENDED)
