"""FusedOptimizers (opt-in): Adam, AdamW and SGD built with ``fused=True`` on the NPU.

A fused optimizer updates every parameter of a group in one kernel per step instead
of a few per parameter -- the NPU's launch overhead makes the difference large. The
kernels are torch's ``aten::_fused_adam_`` / ``_fused_adamw_`` / ``_fused_sgd_``,
which torch_npu registers for the NPU; the patch installs only where they are
(checked against the dispatcher, not a version), and under the NPU emulator, whose
NPU tensors are CPU tensors, torch's CPU kernels run them.

Only constructions that leave ``fused`` and ``foreach`` unset are changed (those
count as replacement calls), and only when every parameter is a floating-point NPU
tensor and ``differentiable`` is off; anything else is built exactly as written.
Opt-in (``ASCEND_PATCH_ENABLE=FusedOptimizers``): a fused step rounds
differently from the per-parameter one, so results move in the last bits.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from .runtime import npu_runtime_importable


__all__ = ["fused_kernels_available", "fused_optimizers_patches"]

# optimizer class path -> the aten op its fused path calls
_OPTIMIZERS = {
    "torch.optim.adam.Adam": "_fused_adam_",
    "torch.optim.adamw.AdamW": "_fused_adamw_",
    "torch.optim.sgd.SGD": "_fused_sgd_",
}


def fused_kernels_available(op: str) -> Callable[[], bool]:
    def npu_has_fused_kernel() -> bool:
        if not npu_runtime_importable():
            return False
        torch_npu = sys.modules.get("torch_npu")
        if getattr(torch_npu, "__emulated__", False):
            return True  # emulated NPU tensors are CPU tensors: torch's CPU kernels apply
        torch = sys.modules["torch"]
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "PrivateUse1"))

    npu_has_fused_kernel.__name__ = f"npu_has_{op.strip('_')}"
    return npu_has_fused_kernel


def leaves_fused_unset(*args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: the program did not choose ``fused`` or ``foreach`` itself."""
    return kwargs.get("fused") is None and kwargs.get("foreach") is None


def _materialized(params: Any) -> tuple[list[Any], list[Any]]:
    """``params`` as a list (it may be a generator), and the tensors in it."""
    items = list(params)
    tensors: list[Any] = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            group = {**item, "params": list(item["params"])}
            items[index] = group
            tensors.extend(p[1] if isinstance(p, tuple) else p for p in group["params"])
        elif isinstance(item, tuple):  # (name, parameter)
            tensors.append(item[1])
        else:
            tensors.append(item)
    return items, tensors


def _on_npu(tensor: Any) -> bool:
    return bool(getattr(tensor, "is_npu", False)) and tensor.is_floating_point()


def _fuse_by_default(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def fused_on_npu(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        params, tensors = _materialized(params)
        if tensors and all(_on_npu(t) for t in tensors) and not kwargs.get("differentiable"):
            kwargs = {**kwargs, "fused": True}
        return original(self, params, *args, **kwargs)

    return fused_on_npu


def fused_optimizers_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.FusedOptimizers`."""
    for target, op in _OPTIMIZERS.items():
        yield AtomicPatch(
            f"{target}.__init__",
            target_wrapper=_fuse_by_default,
            runtime_check=leaves_fused_unset,
            precheck=fused_kernels_available(op),
        )
