"""TensorIndex: boolean-mask indexing ``x[mask]`` through ``masked_select`` (opt-in).

``aten::index`` with a boolean mask has a data-dependent output shape, which the
NPU runs as a slow generic path; ``masked_select`` is a single fused kernel there.
The replacement computes exactly ``x[mask]`` -- values, shape, dtype, gradient --
for a boolean mask of *k* dimensions matching ``x.shape[:k]``,
including ``k == 0`` (a 0-d mask), which the DrivingSDK patcher's patch broadcast into a wrong
shape.

Cost: ``Tensor.__getitem__`` runs on every ``x[...]`` in the program, so a Python
check there costs about a microsecond per indexing (``benchmarks`` entry
``torch_plugin_tensor_index``). The check rejects anything but a bare bool tensor
with two type tests, but the patch is still **opt-in**
(``ASCEND_PATCH_ENABLE=TensorIndex``), as the docs say.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from .runtime import npu_runtime_importable


__all__ = ["is_bool_mask", "masked_index", "tensor_index_patches"]

_tensor_type: Any = None
_bool: Any = None


def _torch_types() -> tuple[Any, Any]:
    global _tensor_type, _bool
    if _tensor_type is None:
        torch = sys.modules["torch"]
        _tensor_type, _bool = torch.Tensor, torch.bool
    return _tensor_type, _bool


def is_bool_mask(self: Any, index: Any) -> bool:
    """``runtime_check``: ``index`` is a bool tensor whose shape leads ``self``'s shape."""
    tensor, boolean = _torch_types()
    if type(index) is not tensor or index.dtype is not boolean:
        return False
    if type(self) is not tensor:  # subclasses keep their own __getitem__ semantics
        return False
    k = index.dim()
    return k <= self.dim() and index.shape == self.shape[:k] and index.device == self.device


def masked_index(self: Any, index: Any) -> Any:
    """``self[index]`` for a boolean mask over the leading ``index.dim()`` dimensions."""
    k = index.dim()
    trailing = self.shape[k:]
    mask = index.reshape(index.shape + (1,) * len(trailing))
    selected = self.masked_select(mask)
    width = trailing.numel()
    # reshape(-1, ...) is ambiguous when a trailing dimension is 0: count the rows.
    rows = selected.numel() // width if width else int(index.sum())
    return selected.reshape(rows, *trailing)


def tensor_index_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.TensorIndex`."""
    yield AtomicPatch(
        "torch.Tensor.__getitem__",
        masked_index,
        runtime_check=is_bool_mask,
        precheck=npu_runtime_importable,
    )
