"""The implementations of ``mmcv._ext`` functions, by name, and the families that hold them.

Each family module (``ascend_patch_mmcv.served.mmcv_ext.<family>``) defines functions
with the exact name and argument names of mmcv's compiled function (mmcv's pybind
declarations; call sites pass many of them by keyword) and its conventions: most
write into preallocated output tensors and return None. A family registers each with
:func:`implements`; the provider (:mod:`ascend_patch_mmcv.served.mmcv_ext`) imports
every family when it builds the module, and serves a stand-in that raises at call time for every
name no family implements.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any
from typing import TypeVar


__all__ = ["FAMILIES", "IMPLEMENTATIONS", "NPU_KERNELS", "implements", "load_all"]

F = TypeVar("F", bound=Callable[..., Any])

#: The family modules, in the order they are imported.
FAMILIES = (
    "nms",
    "roi",
    "losses",
    "bbox",
    "deform",
    "msda",
    "voxel",
    "points",
    "iou3d",
    "sparse",
    "rotated",
)

#: ``_ext`` name -> implementation.
IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {}
#: ``_ext`` name -> the NPU kernels its implementation uses on NPU tensors, in words
#: (docs/mmcv-plugin.md's table shows it); absent: portable PyTorch on every device.
NPU_KERNELS: dict[str, str] = {}


def implements(name: str, npu: str | None = None) -> Callable[[F], F]:
    """Register the decorated function as the ``mmcv._ext`` function ``name``.

    ``npu`` says which NPU kernels it calls on NPU tensors (``"mx_driving knn"``);
    a test checks that every name given there is called by the family's code.
    """

    def register(function: F) -> F:
        if name in IMPLEMENTATIONS and IMPLEMENTATIONS[name] is not function:
            raise RuntimeError(f"mmcv._ext.{name} is implemented twice")
        IMPLEMENTATIONS[name] = function
        if npu is not None:
            NPU_KERNELS[name] = npu
        return function

    return register


def load_all() -> dict[str, Callable[..., Any]]:
    """Import every family that exists; return the implementations by name."""
    for family in FAMILIES:
        try:
            importlib.import_module(f"{__package__}.{family}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{family}":
                raise
    return dict(IMPLEMENTATIONS)
