"""torch.profiler on the NPU: the CUDA activity maps to the NPU.

* With a real torch_npu, NPU kernels are traced by ``torch_npu.profiler`` only, so --
  as ``transfer_to_npu`` does -- ``torch.profiler.profile``, ``schedule``,
  ``tensorboard_trace_handler`` and ``ProfilerAction`` become torch_npu's (the four
  must move together: torch_npu's profile compares schedule results with its own
  ``ProfilerAction``). Unlike ``transfer_to_npu``, ``ProfilerActivity.CUDA`` is not
  rebound globally: the profile class maps ``CUDA`` to ``NPU`` and ``CPU`` to torch_npu's
  ``CPU`` for its own call, and drops a CUDA-only ``experimental_config`` with a warning.
* Under the NPU emulator (no ``torch_npu.profiler``), the emulated NPU is the CPU:
  ``torch.profiler.profile(activities=[CPU, CUDA])`` drops ``CUDA`` (the CPU activity
  records the emulated kernels), counted per call.
* ``prof.export_memory_timeline(path, device="cuda:0")``: with torch_npu, the profile
  class above passes torch_npu's method the NPU device (``transfer_to_npu`` rewrites
  the method itself); under the emulator, whose NPU memory is host memory, a CUDA
  device -- or none, which torch reads as ``cuda:0`` once ``torch.cuda.is_available()``
  answers for the NPU -- becomes ``cpu``, counted per call.

Importing this module imports neither torch nor torch_npu.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from .devices import is_cuda_spec
from .runtime import npu_runtime_importable


__all__ = ["npu_profiler_importable", "profiler_patches"]

_NPU_PROFILER = "ascend_patch_torch._npu_profiler"


def npu_profiler_importable() -> bool:
    """Whether ``torch_npu.profiler`` exists (a real torch_npu; the emulator has none)."""
    if "torch_npu.profiler" in sys.modules:
        return True
    if not npu_runtime_importable():
        return False
    try:
        return importlib.util.find_spec("torch_npu.profiler") is not None
    except (ImportError, ValueError):
        return False


def _no_npu_profiler() -> bool:
    return npu_runtime_importable() and not npu_profiler_importable()


def _is_cuda_activity(activity: Any) -> bool:
    return getattr(activity, "name", None) == "CUDA"


def names_cuda_activity(*args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: the profile is asked for the CUDA activity."""
    activities = kwargs.get("activities")
    return activities is not None and any(_is_cuda_activity(a) for a in activities)


def _drop_cuda_activity(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def profile_on_emulated_npu(*args: Any, **kwargs: Any) -> Any:
        kept = [a for a in kwargs["activities"] if not _is_cuda_activity(a)]
        torch = sys.modules["torch"]
        kwargs = {**kwargs, "activities": kept or [torch.profiler.ProfilerActivity.CPU]}
        return original(*args, **kwargs)

    return profile_on_emulated_npu


def _timeline_names_cuda(*args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: the timeline is asked for a CUDA device, or for none."""
    spec = args[2] if len(args) > 2 else kwargs.get("device")
    return spec is None or is_cuda_spec(spec)


def _timeline_on_host(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def export_memory_timeline_of_emulated_npu(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 2:
            args = (*args[:2], "cpu", *args[3:])
        else:
            kwargs = {**kwargs, "device": "cpu"}
        return original(*args, **kwargs)

    return export_memory_timeline_of_emulated_npu


def profiler_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.Profiler`."""
    for name in ("profile", "schedule", "tensorboard_trace_handler", "ProfilerAction"):
        yield AtomicPatch(
            f"torch.profiler.profiler.{name}",
            f"{_NPU_PROFILER}:{name}",
            aliases=(f"torch.profiler.{name}",),
            precheck=npu_profiler_importable,
            name=f"torch.profiler.{name} -> torch_npu.profiler",
        )
    yield AtomicPatch(
        "torch.profiler.profiler.profile.__init__",
        target_wrapper=_drop_cuda_activity,
        runtime_check=names_cuda_activity,
        precheck=_no_npu_profiler,
        name="torch.profiler.profile: CUDA activity on the emulated NPU",
    )
    yield AtomicPatch(
        "torch.profiler.profiler._KinetoProfile.export_memory_timeline",
        target_wrapper=_timeline_on_host,
        runtime_check=_timeline_names_cuda,
        precheck=_no_npu_profiler,
        name="torch.profiler export_memory_timeline: CUDA device on the emulated NPU",
    )
