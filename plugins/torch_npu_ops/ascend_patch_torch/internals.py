"""torch internals that ask "which accelerator?" or compare against ``Tensor.to``.

* ``torch._utils._get_available_device_type`` answers ``"cuda"`` first when
  ``torch.cuda.is_available()`` -- which the redirect makes true on an NPU -- so
  DataParallel and distributed checkpoint loading (``_OverlappingCpuLoader``) would
  pick the CUDA device module. Here it answers the NPU.
* Lazy modules allow only the ``Tensor`` methods listed in
  ``UninitializedTensorMixin._allowed_methods``, by identity; the redirect's
  ``Tensor.to`` wrapper is not in that list. The list is extended to accept any
  ascend-patch wrapper of a listed method.
* ``torch.utils.cpp_extension.include_paths("cuda")`` -> the NPU's include paths
  (no CUDA toolkit directories).

Importing this module does not import torch.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from ._calls import Param
from ._calls import always
from .devices import NPU
from .redirect import redirect_patch
from .runtime import npu_runtime_importable


__all__ = ["AllowedMethods", "torch_internals_patches"]


def _available_device_type(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def npu_first() -> Any:
        npu = getattr(sys.modules["torch"], NPU, None)
        if npu is not None and npu.is_available():
            return NPU
        return original()

    return npu_first


class AllowedMethods(list):  # type: ignore[type-arg]
    """A list whose ``in`` also accepts an ascend-patch wrapper of a listed function."""

    def __contains__(self, item: object) -> bool:
        if list.__contains__(self, item):
            return True
        original = getattr(item, "__ascend_patch_original__", None)
        return original is not None and list.__contains__(self, original)


def _allowed_methods(original: list[Any]) -> AllowedMethods:
    return AllowedMethods(original)


def torch_internals_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.TorchInternals`."""
    yield AtomicPatch(
        "torch._utils._get_available_device_type",
        target_wrapper=_available_device_type,
        runtime_check=always,
        precheck=npu_runtime_importable,
        aliases=(
            "torch.nn.parallel.data_parallel._get_available_device_type",
            "torch.distributed.checkpoint.filesystem._get_available_device_type",
        ),
    )
    yield AtomicPatch(
        "torch.nn.parameter.UninitializedTensorMixin._allowed_methods",
        target_wrapper=_allowed_methods,
        precheck=npu_runtime_importable,
    )
    yield redirect_patch("torch.utils.cpp_extension.include_paths", (Param(0, "device_type"),))
