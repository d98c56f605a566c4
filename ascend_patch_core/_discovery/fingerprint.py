"""The key of the metadata cache: the metadata directories on ``sys.path`` and their times.

Kept apart from the cache itself (:mod:`.metadata`): what the answers depend on,
computed afresh on every check, versus the answers.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Mapping
from typing import Any


__all__ = ["METADATA_SUFFIXES", "fingerprint"]

#: Directory times this close to now (ns) are re-listed on the next check.
_RACY_NS = 2_000_000_000
# Directories and files that carry a distribution's metadata (entry points, version).
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
# Written in place by `setup.py develop` / legacy editable installs: re-checked each time.
_IN_PLACE_SUFFIXES = (".egg-info", ".egg-link")


def fingerprint(known: Mapping[str, Any] | None = None) -> tuple[str, dict[str, list[Any]]]:
    """What the answers depend on: every distribution's metadata on sys.path.

    Returns the key and, per ``sys.path`` entry, ``[stamp, listing]``: the
    directory's ``[mtime_ns, ctime_ns, inode]`` and the ``[name, mtime_ns]`` of each
    metadata entry (``*.dist-info``, ``*.egg-info``, ``*.egg-link``) it holds.
    ``known`` is that map from the cache: a directory whose stamp has not changed
    is not listed again (one ``stat`` instead of a scan of ~150 entries: installing,
    upgrading, reinstalling or removing a distribution adds or removes a metadata
    directory and so changes its parent's times). Egg-info entries, which
    ``setup.py develop`` rewrites in place, are re-stat'ed every time.

    The stamp is ``None`` when the directory changed within :data:`_RACY_NS` of
    now, as in git's "racy clean" check: file-system clocks tick coarser than
    nanoseconds, so a directory changed again within the same tick would keep its
    times; such a directory is listed again next time. The ctime (which no program
    can set back) and the inode keep a restored or different directory with the
    same mtime -- ``''`` is whatever the working directory is -- from passing.

    Not the directories' times themselves: those change whenever anything is
    written there (a training script's checkpoints in the working directory),
    which would make the cache miss on almost every run. Nor the names of
    directories that hold no metadata: ``sys.path[0]`` is the script's directory
    (or ``''`` for ``python -c``), and naming it made every program, and every
    working directory, overwrite the cache the previous one had written.
    """
    known = known or {}
    now = time.time_ns()
    parts = [sys.executable, sys.prefix]
    paths: dict[str, list[Any]] = {}
    for entry in sys.path:
        if not isinstance(entry, str):
            continue  # the PathFinder ignores such entries too
        path = entry or "."
        try:
            st = os.stat(path)
        except OSError:
            continue  # absent now: contributes nothing, as it lists nothing
        stamp = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        listing = _reusable_listing(known.get(entry), stamp, path)
        if listing is None:
            listing = _listing(path, st)
        racy = now - max(st.st_mtime_ns, st.st_ctime_ns) <= _RACY_NS
        paths[entry] = [None if racy else stamp, listing]
        if listing:
            parts.append(entry)
            parts.extend(f"{name}\0{mtime}" for name, mtime in listing)
    # The text itself is the key (a few kB): hashing it would cost more than the
    # comparison, and hashlib more than that to import (~3 ms, OpenSSL).
    return "\n".join(parts), paths


def _listing(path: str, st: os.stat_result) -> list[list[Any]]:
    """``[name, mtime_ns]`` of the metadata a sys.path entry holds; [] when none."""
    if not stat.S_ISDIR(st.st_mode):  # a zip or egg file on sys.path: itself
        return [["", st.st_mtime_ns]]
    try:
        with os.scandir(path) as entries:
            found = [
                [e.name, e.stat().st_mtime_ns]
                for e in entries
                if e.name.endswith(METADATA_SUFFIXES)
            ]
    except OSError:
        return [["-", 0]]  # unreadable: a listing of its own, so a later read differs
    found.sort()
    return found


def _reusable_listing(previous: object, stamp: list[int], path: str) -> list[list[Any]] | None:
    """The cached listing of a directory, if its stamp and its egg-info entries are unchanged."""
    if not (
        isinstance(previous, list)
        and len(previous) == 2
        and previous[0] == stamp
        and isinstance(previous[1], list)
    ):
        return None
    listing: list[list[Any]] = previous[1]
    for item in listing:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            return None
        name, mtime = item
        if name.endswith(_IN_PLACE_SUFFIXES):
            try:
                if os.stat(os.path.join(path, name)).st_mtime_ns != mtime:
                    return None
            except OSError:
                return None
    return listing
