"""torch_npu.profiler in torch.profiler's place, taking torch's activity names.

Imported only when the Profiler patches are installed on a stack with torch_npu.profiler.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch_npu.profiler as npu_profiler

from .devices import to_npu_spec


__all__ = ["ProfilerAction", "profile", "schedule", "tensorboard_trace_handler"]

schedule = npu_profiler.schedule
tensorboard_trace_handler = npu_profiler.tensorboard_trace_handler
ProfilerAction = npu_profiler.ProfilerAction


def _npu_activity(activity: Any) -> Any:
    """torch's CUDA (or PrivateUse1) activity -> torch_npu's NPU; torch's CPU -> torch_npu's CPU."""
    if isinstance(activity, torch.profiler.ProfilerActivity):
        # PrivateUse1 is listed as NPU once torch_npu has named the backend.
        if activity.name in ("CUDA", "PrivateUse1", "NPU"):
            return npu_profiler.ProfilerActivity.NPU
        if activity.name == "CPU":
            return npu_profiler.ProfilerActivity.CPU
    return activity


class profile(npu_profiler.profile):  # type: ignore[misc]
    """``torch_npu.profiler.profile`` accepting torch's ``ProfilerActivity`` values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        activities = kwargs.get("activities")
        if activities is not None:
            mapped = [_npu_activity(a) for a in activities]
            kwargs["activities"] = [a for i, a in enumerate(mapped) if a not in mapped[:i]]
        config = kwargs.get("experimental_config")
        if config is not None and not isinstance(config, npu_profiler._ExperimentalConfig):
            warnings.warn(
                "ascend-patch: torch.profiler.profile(experimental_config=...) is CUDA's; it is"
                " dropped on the NPU (pass torch_npu.profiler._ExperimentalConfig instead)",
                stacklevel=2,
            )
            del kwargs["experimental_config"]
        super().__init__(*args, **kwargs)

    def export_memory_timeline(self, output_path: str, device: Any = None) -> Any:
        """torch_npu's, with a CUDA device (``"cuda:0"``, ``torch.device("cuda", 0)``) moved to the NPU."""
        if device is not None:
            device = str(to_npu_spec(device))
        return super().export_memory_timeline(output_path, device)
