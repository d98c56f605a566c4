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

A Python ``__getitem__`` on ``torch.Tensor`` also turns every tensor class into a
C-level sequence, which changes ``torch.tensor([torch.tensor(1), ...])`` and outlived
revert(); :mod:`._sequence_slot` says why and how the group's second patch (the
subclass hook) keeps them non-sequences, exactly as plain torch has them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch
from ascend_patch_core import SkipPatch

from ._sequence_slot import clear_sequence_item
from ._sequence_slot import inherits
from ._sequence_slot import subclasses
from ._sequence_slot import unsupported_reason
from .runtime import npu_runtime_importable


__all__ = ["is_bool_mask", "masked_index", "tensor_index_patches"]

_GETITEM = "torch.Tensor.__getitem__"

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


def _getitem_can_be_patched() -> bool:
    """``precheck``: an NPU runtime, and tensor classes that can be kept non-sequences."""
    if not npu_runtime_importable():
        return False
    reason = unsupported_reason(sys.modules["torch"].Tensor)
    if reason is not None:
        raise SkipPatch(
            f"x[mask] is left to torch: a patched Tensor.__getitem__ would make every tensor "
            f"a sequence for torch.tensor() and this Python cannot undo that ({reason})"
        )
    return True


def _keep_non_sequences(tensor: type) -> None:
    """Plain torch's NULL ``sq_item`` for each tensor class finding the patched ``__getitem__``."""
    installed = vars(tensor).get("__getitem__")
    if installed is None:  # nothing is patched on Tensor itself
        return
    for klass in subclasses(tensor):
        if inherits(klass, tensor, installed):
            clear_sequence_item(klass)


def _subclass_hook(original: Any) -> Any:
    """``Tensor.__init_subclass__``: new tensor classes stay non-sequences too.

    Installed right after ``Tensor.__getitem__`` (``after=``), it first brings every
    existing tensor class (``Parameter``, FakeTensor, ...) to that state.
    """
    tensor = sys.modules["torch"].Tensor
    _keep_non_sequences(tensor)

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        super(tensor, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
        installed = vars(tensor).get("__getitem__")
        if installed is not None and inherits(cls, tensor, installed):
            clear_sequence_item(cls)

    return classmethod(__init_subclass__)


def tensor_index_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.TensorIndex`."""
    yield AtomicPatch(
        _GETITEM,
        masked_index,
        runtime_check=is_bool_mask,
        precheck=_getitem_can_be_patched,
    )
    yield AtomicPatch(
        "torch.Tensor.__init_subclass__",
        target_wrapper=_subclass_hook,
        precheck=npu_runtime_importable,
        after=_GETITEM,
    )
