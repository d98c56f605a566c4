"""Value equality for the core's small ``__slots__`` classes.

They are not NamedTuples or dataclasses because creating such a class costs ~80 us
(NamedTuple) to ~300 us (frozen dataclass) on every ``import ascend_patch_core``, a
cost budgeted inside training processes (docs/benchmarks.md). This base gives them
``==``, ``hash()`` and a ``repr()`` from one list of fields.
"""

from __future__ import annotations

from typing import Any
from typing import ClassVar


__all__ = ["Value"]


class Value:
    """Compared, hashed and shown by the attributes named in ``_fields``, in order."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._key()))})"
