"""CollectionsCompat: the ``collections`` ABC aliases that Python 3.10 removed.

Until Python 3.9, ``collections.Mapping``, ``collections.Sequence``,
``collections.Iterable`` and the other abstract base classes of
:mod:`collections.abc` were also reachable from :mod:`collections` (deprecated since
3.3). Python 3.10 removed them, and old OpenMMLab-era code (``from collections
import Sequence``, ``isinstance(x, collections.Mapping)``) fails at import with
``ImportError`` / ``AttributeError``. Each alias is the very class of
:mod:`collections.abc`, so ``isinstance`` and subclassing behave as they did; an
alias the running Python still has (or that someone else set) is left alone, and
``revert()`` deletes every alias this group created.
"""

from __future__ import annotations

import collections
import collections.abc
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = ["REMOVED_ALIASES", "collections_alias_patches"]

#: Every name Python 3.9's ``collections`` served from ``collections.abc`` (its
#: ``_collections_abc.__all__``) but ByteString: deprecated since Python 3.12 (reading it
#: warns), removed in 3.14, and rare in old code.
REMOVED_ALIASES = (
    "Awaitable",
    "Coroutine",
    "AsyncIterable",
    "AsyncIterator",
    "AsyncGenerator",
    "Hashable",
    "Iterable",
    "Iterator",
    "Generator",
    "Reversible",
    "Sized",
    "Container",
    "Callable",
    "Collection",
    "Set",
    "MutableSet",
    "Mapping",
    "MutableMapping",
    "MappingView",
    "KeysView",
    "ItemsView",
    "ValuesView",
    "Sequence",
    "MutableSequence",
)


def collections_alias_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_mmcv.groups.CollectionsCompat`."""
    for name in REMOVED_ALIASES:
        if name in vars(collections):
            continue  # set by someone else: theirs to keep
        yield AtomicPatch(
            f"collections:{name}",
            getattr(collections.abc, name),
            create=True,
            name=f"collections.{name}",
        )
