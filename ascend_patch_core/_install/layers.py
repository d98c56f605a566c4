"""Undoing one layer of a slot that several patches hold, in whatever order they go.

Two patchers -- or a patcher and ``AtomicPatch(...).apply()``, a group's
``apply_all()``, the default patcher, a patch installed when its module was imported
-- may patch one slot: the later one finds the earlier one's object there and
stands on it. Each installation is a layer of the slot (``_install.entries.push_layer``),
oldest first. Taking a layer out:

* the top layer puts back what it found: the next layer's object, or the original;
* a layer below the top is spliced out: the layer above now stands on what the
  removed one stood on -- its slot's value (restored when it goes in turn), its
  original, the originals of the stale references it rebound -- and what in it
  called the removed layer calls the one below now: a ``runtime_check`` wrapper's
  fallback is pointed there in place (the same object stays installed), a
  replacement ``target_wrapper`` made from its original is made again over the new
  one and put in place of the old (and so up the chain while each layer wraps the
  one below). A precheck is not asked again: it decided when the layer went in;
* a top layer whose slot someone else changed since (user code assigning the
  attribute) is left as it is and reported, as without layers: the foreign value
  stays. A patch installed over such a value starts a new chain, so the layers
  under it are undone on their own (each left alone and reported, as the value
  they would restore is not theirs to put back).

The slot writes and the bookkeeping happen under ``layers_lock``; making a
replacement again runs user code (``target_wrapper``), so it happens outside, and
its result goes in only if nothing changed meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from .entries import Site
from .entries import layers_lock
from .entries import top_layers
from .entries import who
from .stale import module_ids
from .target import ABSENT
from .target import adapt_to_descriptor
from .target import inner_callable


__all__ = ["take_out"]

Warn = Callable[[str], None]
#: (id(module), global name) -> what a layer found there before rebinding it.
_Rebound = dict[tuple[int, str], Any]


def take_out(sites: Iterable[Site], warn: Warn) -> None:
    """Undo each of ``sites``' installations, in this order, and their rebinds,
    whatever else their slots hold now."""
    with layers_lock:  # once for all: revert() comes here with every patch it undoes
        jobs = [_take_out(site, warn) for site in sites if site.slot is not None]
    for job in jobs:
        while job is not None:
            job = job.run(warn)


def _take_out(site: Site, warn: Warn) -> _Remake | None:
    slot = site.slot
    assert slot is not None
    rebinds = site.rebinds
    if rebinds:
        for module, name, original in reversed(rebinds):
            if vars(module).get(name) is site.installed_inner:
                setattr(module, name, original)
        site.rebinds = None
    above, below = site.above, site.below
    job = None
    if above is None:  # the top layer (or one left under someone else's value)
        if slot.current() is site.installed:
            slot.restore()
        else:
            message = (
                f"{site.path.text} was changed by someone else after it was patched; "
                "left as is (the original was not restored)"
            )
            warn(message)
            site.entry.record.warnings.append(message)
        key = (id(slot.owner), slot.key, slot.kind == "item")
        if top_layers.get(key) is site:
            if below is None:
                del top_layers[key]
            else:
                top_layers[key] = below
    else:
        above.below = below
        rebound: _Rebound = {(id(m), name): o for m, name, o in rebinds or ()}
        found = _found(slot.raw)
        job = _stand_on(above, slot.raw, slot.own, found, site.installed_inner, rebound)
    if below is not None:
        below.above = above
    site.above = site.below = None
    site.clear()
    return job


def _found(raw: Any) -> Any:
    """The original a patch gets for a slot holding ``raw`` (as the installer reads it)."""
    original = inner_callable(raw)
    return None if original is ABSENT else original


def _stand_on(
    layer: Site, raw: Any, own: bool, below: Any, replaced: Any, rebound: _Rebound
) -> _Remake | None:
    """Under the lock: ``layer`` stands on ``raw`` now (``below`` inside it), not on ``replaced``.

    Returns the work left to do outside the lock: a replacement to make again.
    """
    slot = layer.slot
    assert slot is not None
    slot.raw, slot.own = raw, own
    entry = layer.entry
    if layer is entry:
        entry.original = below
    if layer.rebinds:
        layer.rebinds = [
            (module, name, rebound.get((id(module), name), below) if o is replaced else o)
            for module, name, o in layer.rebinds
        ]
    patch = entry.patch
    if patch.target_wrapper is not None:
        return _Remake(layer, raw, below)
    if patch.runtime_check is not None:
        from .wrappers import retarget

        if not callable(below) or not retarget(layer.installed_inner, below):
            return _Remake(layer, raw, below)
    return None


class _Remake:
    """Make ``layer``'s replacement again over ``below`` (outside the lock), put it in."""

    __slots__ = ("below", "layer", "raw")

    def __init__(self, layer: Site, raw: Any, below: Any) -> None:
        self.layer, self.raw, self.below = layer, raw, below

    def run(self, warn: Warn) -> _Remake | None:
        layer = self.layer
        entry = layer.entry
        old_raw, old_inner = layer.installed, layer.installed_inner
        try:
            replacement, inner = _build(entry, self.below)
        except Exception as exc:  # Skip, PatchError: the patch cannot stand on what is there
            message = (
                f"{layer.path.text}: {who(entry)} was made from the patch reverted under it "
                f"and could not be made again over what is there now ({exc}); it still calls "
                "that patch's replacement until it is reverted too"
            )
            warn(message)  # in the report of the patcher reverting, and in the layer's own
            entry.record.warnings.append(message)
            return None
        with layers_lock:
            slot = layer.slot
            if slot is None or slot.raw is not self.raw or layer.installed is not old_raw:
                return None  # reverted or spliced again meanwhile: that undo made it right
            new_raw = adapt_to_descriptor(self.raw, inner) if slot.kind == "class" else inner
            above = layer.above
            if above is None and slot.current() is old_raw:
                slot.install(new_raw)
            layer.installed_now(slot, new_raw, inner, module_ids())
            if layer is entry:
                entry.replacement, entry.new_inner = replacement, inner
            for module, name, _ in layer.rebinds or ():
                if vars(module).get(name) is old_inner:
                    setattr(module, name, inner)
            if above is None:
                return None
            return _stand_on(above, new_raw, True, inner, old_inner, {})


def _build(entry: Any, original: Any) -> tuple[Any, Any]:
    """(replacement, what goes in the slot) for ``entry``'s patch over ``original``."""
    from .replacement import build_replacement

    record = entry.record
    replacement, inner = build_replacement(entry.patch, original, record.counters)
    if entry.patch.runtime_check is None and record.counters is not None:
        from .counting import counted  # it was counted when it went in

        inner = counted(inner, record)
    return replacement, inner
