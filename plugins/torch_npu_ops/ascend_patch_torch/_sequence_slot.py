"""Keep ``torch.Tensor`` a non-sequence for CPython while ``Tensor.__getitem__`` is patched.

Why this exists: assigning a Python function to ``torch.Tensor.__getitem__`` makes
CPython fill *two* C slots of the class and of every subclass -- ``mp_subscript``
(mapping) and ``sq_item`` (sequence) -- while plain torch fills only the first
(``TensorBase.__getitem__`` is a mapping slot). With ``sq_item`` set,
``PySequence_Check(tensor)`` is true, so ``torch.tensor([torch.tensor(1), ...])`` walks
each 0-d tensor as a nested sequence and calls ``len()`` on it ("len() of a 0-d
tensor"), and ``torch.tensor([t1, t2])`` of 1-d tensors builds a matrix where plain
torch refuses. Deleting the attribute does not undo it: CPython then finds both slots
filled, cannot tell which one the inherited wrapper belongs to (``resolve_slotdups``),
and keeps the generic ``sq_item`` -- so the classes stayed sequences after revert().

The fix: once the patch is installed, and for every subclass created while it is,
``sq_item`` is set back to NULL (what plain torch has). Python's own ``x[i]`` goes
through ``mp_subscript``, which still reaches the patched ``__getitem__``. Because the
slot is NULL when revert() deletes the attribute, CPython computes NULL again for the
class and each subclass: the undo is exact.

No C API writes a type slot, so the address is computed from ``PyTypeObject``'s layout
(stable since Python 3.0) and checked against ``PyType_GetSlot`` before anything is
written; where the check fails (another layout, a free-threaded build) nothing is
written and :func:`unsupported_reason` says why, which skips the patch.
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig
from collections.abc import Iterator
from typing import Any


__all__ = ["clear_sequence_item", "inherits", "subclasses", "unsupported_reason"]

# typeslots.h
_PY_SQ_ITEM = 44
_PY_SQ_LENGTH = 45
_PY_SQ_CONTAINS = 41
_POINTER = ctypes.sizeof(ctypes.c_void_p)
# PyVarObject, then tp_name .. tp_as_number (10 pointer-sized fields), then tp_as_sequence.
_AS_SEQUENCE = object.__basicsize__ + ctypes.sizeof(ctypes.c_ssize_t) + 10 * _POINTER
# PySequenceMethods: sq_length, sq_concat, sq_repeat, sq_item, ..., sq_contains (8th).
_OFFSETS = {_PY_SQ_LENGTH: 0, _PY_SQ_ITEM: 3 * _POINTER, _PY_SQ_CONTAINS: 7 * _POINTER}
#: sizeof(PyHeapTypeObject): a heap type's PySequenceMethods lie within it.
_HEAP_TYPE_SIZE: int = type.__basicsize__  # type: ignore[assignment]  # typeshed: a property

_get_slot: Any = None


def _slot(cls: type, slot: int) -> int | None:
    global _get_slot
    if _get_slot is None:
        function = ctypes.pythonapi.PyType_GetSlot
        function.restype, function.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_int)
        _get_slot = function
    value: int | None = _get_slot(cls, slot)
    return value


def _sequence_methods(cls: type) -> int | None:
    """The address of ``cls``'s ``PySequenceMethods``, checked against the C API; else None."""
    if not cls.__flags__ & (1 << 9):  # Py_TPFLAGS_HEAPTYPE: its methods live in the object
        return None
    start = id(cls)
    methods = ctypes.c_void_p.from_address(start + _AS_SEQUENCE).value
    if methods is None or not start < methods < start + _HEAP_TYPE_SIZE:
        return None
    for slot, offset in _OFFSETS.items():
        if ctypes.c_void_p.from_address(methods + offset).value != _slot(cls, slot):
            return None
    return methods


def unsupported_reason(cls: type) -> str | None:
    """Why ``cls``'s sequence slot cannot be restored on this interpreter, or None if it can."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded Python: type slots cannot be written safely"
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name} is not CPython"
    if _slot(cls, _PY_SQ_LENGTH) is None:  # Tensor's __len__: what the layout is checked with
        return f"{cls.__qualname__} has no sequence length slot to check the type layout with"
    if _sequence_methods(cls) is None:
        return (
            f"CPython {sys.version.split()[0]}'s type layout does not match PyType_GetSlot "
            f"for {cls.__qualname__}"
        )
    return None


def clear_sequence_item(cls: type) -> None:
    """Set ``cls``'s ``sq_item`` to NULL (only where the layout checks out)."""
    methods = _sequence_methods(cls)
    if methods is not None:
        ctypes.c_void_p.from_address(methods + _OFFSETS[_PY_SQ_ITEM]).value = None


def inherits(cls: type, owner: type, value: Any) -> bool:
    """Whether ``cls`` finds ``owner.__getitem__``, which is ``value``, rather than its own."""
    for klass in cls.__mro__:
        if "__getitem__" in vars(klass):
            return klass is owner and vars(klass)["__getitem__"] is value
    return False


def subclasses(cls: type) -> Iterator[type]:
    """``cls`` and every class derived from it, each once."""
    seen: set[int] = set()
    pending = [cls]
    while pending:
        klass = pending.pop()
        if id(klass) in seen:
            continue
        seen.add(id(klass))
        yield klass
        pending.extend(type.__subclasses__(klass))
