"""The names a patch group answers to in ``disable()``, ``enable()`` and ``conflicts_with``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .._model.patch import Patch

__all__ = ["group_names", "snake_name"]


# Cached: every apply() asks for each group's names several times (plan, conflicts,
# unknown-name check); converting again each time cost ~0.5 ms of apply() for 43 groups.
@functools.cache
def snake_name(name: str) -> str:
    """``TensorIndex`` -> ``tensor_index``, ``DDP`` -> ``ddp``: the DrivingSDK patcher's 2.0 names."""
    out: list[str] = []
    for i, char in enumerate(name):
        if (
            char.isupper()
            and i
            and (
                name[i - 1].islower()
                or name[i - 1].isdigit()
                or (i + 1 < len(name) and name[i + 1].islower() and name[i - 1].isupper())
            )
        ):
            out.append("_")
        out.append(char.lower())
    return "".join(out)


def group_names(group: type[Patch]) -> frozenset[str]:
    """Every name a group answers to: ``name``, its snake-case form (the DrivingSDK
    patcher's 2.0 name, ``"tensor_index"``), ``legacy_name`` (1.0: ``"index"``), ``aliases``."""
    names = {group.name, snake_name(group.name), *group.aliases}
    if group.legacy_name:
        names.add(group.legacy_name)
    return frozenset(names)
