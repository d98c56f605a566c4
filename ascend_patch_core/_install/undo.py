"""Undoing: put back every original by identity, in reverse order.

The installer logs each site it fills; ``revert()`` replays that log backwards,
after giving the original back to the modules that imported a replacement while it
was installed (``from x import f`` after the patch). A slot another patcher patched
after us keeps that patch, which then stands on what we found (``_install.layers``); a slot
someone else changed after we patched it is left alone and reported, never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._model.report import APPLIED
from .._model.report import PENDING
from .._model.report import REVERTED
from .._model.report import SKIPPED
from ..imports._hub import hub
from .entries import NOT_APPLIED
from .entries import Site
from .late_holders import restore_late_holders
from .layers import take_out
from .watches import unwatch_all


if TYPE_CHECKING:
    from .entries import InstallState
    from .entries import Ledger
    from .settings import Session


__all__ = ["restore_site", "revert_all", "undo_entries"]


def restore_site(site: Site, warn: Callable[[str], None]) -> None:
    """Take ``site``'s installation out of its slot (and undo its rebinds).

    The slot gets back what the site found there -- or, when a later patch stands
    on it, that patch now stands on it instead (``_install.layers``).
    """
    take_out((site,), warn)


def revert_all(ledger: Ledger, installer: InstallState, sessions: list[Session]) -> None:
    """Undo every patch, hook, 1.0 patch and session of one patcher, newest first.

    Leaves their records saying so. (Import rules and environment variables are the
    Patcher's Activations to undo.)
    """
    with ledger.lock:
        log = installer.take_log()
        entries, hooks, legacy = ledger.clear()
        # Every entry leaves the game now, under the lock: a thread about to install
        # one (an import finishing right now) sees it reverted and stops, and one that
        # is installing undoes its own installation (see Installer._after_install).
        for entry in entries:
            if entry.status is APPLIED:
                entry.record.set(REVERTED, None)
            elif entry.status is PENDING:
                entry.record.set(REVERTED, "reverted before its target was imported")
            entry.claimed = True
            unwatch_all(entry)
    for hook in hooks:
        if hook.handle is not None:
            hub.unwatch(hook.handle)
            hook.handle = None
        if hook.record.status is APPLIED:
            hook.record.set(REVERTED, None)
    restore_late_holders(log, entries)
    take_out(reversed(log), ledger.warn)
    for state in legacy:
        if state.handle is not None:
            hub.unwatch(state.handle)
        if state.record.status is APPLIED:
            state.record.set(APPLIED, "a legacy patch function cannot be reverted")
            ledger.warn(f"legacy patch {state.patch.name!r} cannot be reverted; its changes remain")
    for session in reversed(sessions):
        session.undo()


def undo_entries(ledger: Ledger, installer: InstallState, names: set[str], reason: str) -> None:
    """Take back the live entries that ``names`` match (``disable()`` after apply()): skipped."""
    with ledger.lock:
        # A group's other names (legacy_name, "tensor_index") mean the group.
        names = names | {ledger.group_aliases[n] for n in names if n in ledger.group_aliases}
        victims = [e for e in ledger.named(names) if e.status not in NOT_APPLIED]
    for entry in reversed(victims):
        with ledger.lock:
            sites = [s for s in (entry, *entry.alias_sites) if s.slot is not None]
            for site in sites:
                installer.log.pop(site, None)
            was_applied = entry.status is APPLIED
            installer.finish(entry, SKIPPED, reason)
        if was_applied:
            take_out(reversed(sites), ledger.warn)
