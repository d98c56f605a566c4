"""Aliases: the other paths a patched object is reachable by (re-exports), patched too.

Each alias is a site of its own, installed when its module is imported (at once if
it is) and reported in ``record.aliases``. One that already holds the replacement --
it was imported from the patched target after the patch -- needs nothing; one that
holds the same original gets the same replacement; another original gets a
replacement built for it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .._model.report import APPLIED
from .entries import Entry
from .entries import Site
from .entries import push_layer
from .replacement import build_replacement
from .stale import module_ids
from .target import ABSENT
from .target import Missing
from .target import Waiting
from .target import adapt_to_descriptor
from .target import candidate_modules
from .target import engine_owned
from .target import initializing_prefixes
from .target import inner_callable
from .target import resolve
from .target import settle_initializing
from .watches import look_again
from .watches import unwatch
from .watches import watch


if TYPE_CHECKING:
    from .entries import InstallState

__all__ = ["advance_alias"]


def advance_alias(installer: InstallState, entry: Entry, site: Site) -> None:
    """Install ``entry``'s replacement at alias ``site`` if it can be now; else watch its module."""
    path = site.path.text
    if site.slot is not None or entry.status is not APPLIED:
        return
    settle_initializing(site.path)
    found = resolve(site.path, create=entry.patch.create)
    aliases = entry.record.aliases
    # A package re-exporting the target (``torch.load`` from ``torch.serialization``)
    # is still running its __init__ when the target's module is imported from there:
    # the name comes later in that body, so look again when the package is done.
    unfinished = initializing_prefixes(site.path) if isinstance(found, Missing) else []
    if isinstance(found, Waiting) or unfinished:
        if isinstance(found, Waiting):
            modules = candidate_modules(site.path, found.module)
            aliases[path] = f"pending: waiting for import of {found.module}"
        else:
            modules = unfinished
            aliases[path] = f"pending: waiting for import of {unfinished[-1]}"
        then = functools.partial(advance_alias, installer, entry, site)
        with installer.ledger.lock:
            if entry.status is not APPLIED:
                return
            for candidate in modules:
                watch(entry, f"alias:{path}:{candidate}", candidate, installer.ledger, then)
        # An import of one that began before the watch calls no watch: wait it out.
        for candidate in modules:
            look_again(entry, f"alias:{path}:{candidate}", candidate, installer.ledger, then)
        return
    unwatch(entry, installer.ledger, f"alias:{path}:")
    if isinstance(found, Missing):
        aliases[path] = f"not found: {found.reason}"
        entry.record.warnings.append(f"alias {path} not found: {found.reason}")
        return
    primary = entry.slot
    if primary is not None and found.owner is primary.owner and found.key == primary.key:
        aliases[path] = "same slot as the target"
        return
    if found.raw is entry.installed or inner_callable(found.raw) is entry.new_inner:
        # Imported from the patched target after installation (a re-export): it
        # already holds the replacement, and revert() gives it the original back.
        aliases[path] = "applied"
        return
    try:
        if engine_owned(found.owner):
            from .engine_targets import refuse_slot

            refuse_slot(found, path)
        original = inner_callable(found.raw)
        if original is ABSENT:  # create=True: the alias slot is made too
            original = None
        if original is entry.original:
            new_inner = entry.new_inner
        else:
            new_inner = build_replacement(entry.patch, original, entry.record.counters)[1]
            if installer.count_calls and entry.patch.runtime_check is None:
                from .counting import counted

                new_inner = counted(new_inner, entry.record)
        new_raw = adapt_to_descriptor(found.raw, new_inner) if found.kind == "class" else new_inner
        modules_before = module_ids()
        # Put in and recorded as one step, under the lock (a fork() child sees both or
        # neither); not at all if revert() ran meanwhile.
        with installer.ledger.lock:
            if entry.status is not APPLIED or site.slot is not None:  # reverted, or in already
                return
            found.install(new_raw)
            site.installed_now(found, new_raw, new_inner, modules_before)
            push_layer(site)
            installer.log[site] = None
    except Exception as exc:
        aliases[path] = f"failed: {exc}"
        entry.record.warnings.append(f"alias {path} failed: {exc}")
        return
    aliases[path] = "applied"
