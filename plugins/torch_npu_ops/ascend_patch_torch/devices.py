"""What is a CUDA device specification, and what is its NPU equivalent.

Every redirect patch of this plugin asks this module, and only this module, whether
an argument names a CUDA device. The rules are deliberately narrow -- unlike
torch_npu's ``transfer_to_npu``, which rewrites any string containing ``"cuda"``
(so ``torch.load("/ckpt/cuda_model.pt")`` opened ``/ckpt/npu_model.pt``):

* a string is a CUDA device only if it is exactly ``"cuda"`` or ``"cuda:N"``;
* a ``torch.device`` only if its type is ``"cuda"``;
* an ``int`` only where the caller says torch reads it as a device index
  (``Tensor.to(0)``, ``device=0``), never a size or a bool;
* a ``map_location`` mapping has its keys and values checked one by one.

Importing this module does not import torch: the redirect declarations use it from
``plugin.py``. The checks run only once torch is imported (their targets live in torch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any


__all__ = [
    "NPU",
    "is_cuda_spec",
    "npu_device",
    "to_npu_spec",
]

#: The device type the redirect produces.
NPU = "npu"

_device_class: Any = None


def _torch_device_class() -> Any:
    global _device_class
    if _device_class is None:
        torch = sys.modules.get("torch")
        device = getattr(torch, "device", None)
        if not isinstance(device, type):
            return None
        _device_class = device
    return _device_class


def _cuda_index(text: str) -> int | bool | None:
    """``None`` for ``"cuda"``, N for ``"cuda:N"``, False for anything else."""
    if text == "cuda":
        return None
    if text.startswith("cuda:"):
        digits = text[5:]
        # isdecimal() alone accepts non-ASCII digits that torch.device rejects.
        if digits.isascii() and digits.isdecimal():
            return int(digits)
    return False


def is_cuda_spec(spec: object, *, ints: bool = False) -> bool:
    """Whether ``spec`` names a CUDA device (see the module docstring for the rules)."""
    kind = type(spec)
    if kind is str:
        return _cuda_index(spec) is not False  # type: ignore[arg-type]
    if kind is int:
        return ints
    device = _torch_device_class()
    if device is not None and kind is device:
        return bool(spec.type == "cuda")  # type: ignore[attr-defined]
    if isinstance(spec, Mapping):
        return any(is_cuda_spec(k) or is_cuda_spec(v) for k, v in spec.items())
    return False


def npu_device(index: int | None = None) -> Any:
    """``torch.device("npu", index)``; needs torch_npu (or the emulator) to have named the backend."""
    device = _torch_device_class()
    if device is None:  # pragma: no cover - only reachable before torch is imported
        raise RuntimeError("torch is not imported; no device can be built")
    return device(NPU) if index is None else device(NPU, index)


def to_npu_spec(spec: Any, *, ints: bool = False) -> Any:
    """The NPU equivalent of a CUDA device spec; anything else is returned unchanged.

    The result keeps the input's kind: a string for a string, a ``torch.device`` for
    a device, a new mapping for a mapping. An int index (when ``ints``) becomes
    ``"npu:N"``.
    """
    kind = type(spec)
    if kind is str:
        index = _cuda_index(spec)
        if index is False:
            return spec
        return NPU if index is None else f"{NPU}:{index}"
    if kind is int:
        return f"{NPU}:{spec}" if ints else spec
    device = _torch_device_class()
    if device is not None and kind is device:
        if spec.type != "cuda":
            return spec
        return npu_device(spec.index)
    if isinstance(spec, Mapping):
        if not is_cuda_spec(spec):
            return spec
        return {to_npu_spec(k): to_npu_spec(v) for k, v in spec.items()}
    return spec


def spec_rewriter(ints: bool) -> Callable[[Any], Any]:
    """``to_npu_spec`` with ``ints`` bound, for tables of argument rules."""
    if ints:
        return lambda spec: to_npu_spec(spec, ints=True)
    return to_npu_spec
