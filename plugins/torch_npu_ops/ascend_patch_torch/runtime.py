"""Is there an NPU runtime (torch_npu, or the emulator's stand-in) to redirect to?

Every redirect patch checks :func:`npu_runtime_importable` right before it is
installed: on a machine without torch_npu the plugin leaves CUDA code alone, so
installing it next to a CUDA build changes nothing. :class:`~ascend_patch_torch.groups.NpuRuntime` imports
torch_npu right after torch, as ``transfer_to_npu`` users do by hand, so that
``torch.npu`` and the ``"npu"`` device exist before the program asks for them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook


__all__ = [
    "import_npu_runtime",
    "npu_module",
    "npu_runtime_importable",
    "npu_runtime_patches",
]

_lookup: tuple[tuple[object, ...], bool] | None = None


def npu_runtime_importable() -> bool:
    """Whether ``import torch_npu`` can work here (no import is done).

    Every redirect patch asks this in its precheck -- some 150 times in one
    ``apply()`` -- and ``find_spec`` costs ~100 us, so the answer is remembered for
    as long as the import system looks the same (the finders on ``sys.meta_path``,
    which the emulator adds to, and ``sys.path``).
    """
    global _lookup
    if "torch_npu" in sys.modules:
        # None there is the import system's "this module is blocked".
        return sys.modules["torch_npu"] is not None
    key = (*map(id, sys.meta_path), *sys.path)
    if _lookup is not None and _lookup[0] == key:
        return _lookup[1]
    try:
        found = importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):
        found = False
    _lookup = (key, found)
    return found


def import_npu_runtime(module: Any) -> list[AtomicPatch]:
    """ModuleHook callback for ``torch``: import torch_npu if it is there."""
    if "torch_npu" not in sys.modules and npu_runtime_importable():
        importlib.import_module("torch_npu")
    return []


def npu_runtime_patches(options: Any = None) -> Iterator[ModuleHook]:
    """The patches of :class:`ascend_patch_torch.groups.NpuRuntime`."""
    yield ModuleHook("torch", import_npu_runtime, name="import torch_npu after torch")


def npu_module() -> Any:
    """``torch.npu``, importing torch_npu first if the program has not."""
    torch = sys.modules["torch"]
    npu = getattr(torch, "npu", None)
    if npu is None:
        importlib.import_module("torch_npu")
        npu = torch.npu
    return npu
