"""Installed-distribution facts (entry points, versions), cached across processes.

``import importlib.metadata`` alone costs ~27 ms in a fresh interpreter here and a
scan of ~150 distributions another 4-13 ms, more than the whole start-up budget of
``apply()`` (docs/benchmarks.md). Like stevedore, the answers are cached on disk,
keyed by the interpreter and by the name and modification time of every
distribution metadata directory (``*.dist-info``, ``*.egg-info``) on ``sys.path``:
installing, upgrading, reinstalling or removing a distribution changes that key.
Checking the key costs one ``stat`` per ``sys.path`` directory while nothing was
installed (see :meth:`MetadataCache.fingerprint`).
A cache hit imports neither importlib.metadata nor packaging. The cache is a ``marshal`` file: no import cost.

Controls: ``ASCEND_PATCH_CACHE=0`` disables it; ``ASCEND_PATCH_CACHE_DIR`` moves it
(default ``$XDG_CACHE_HOME/ascend-patch`` or ``~/.cache/ascend-patch``).
"""

from __future__ import annotations

import binascii
import contextlib
import marshal
import os
import stat
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from ._value import Value


__all__ = ["EntryPointInfo", "MetadataCache", "metadata", "normalize_name"]

_FORMAT = 5
#: Directory times this close to now (ns) are re-listed on the next check.
_RACY_NS = 2_000_000_000
# Directories and files that carry a distribution's metadata (entry points, version).
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
# Written in place by `setup.py develop` / legacy editable installs: re-checked each time.
_IN_PLACE_SUFFIXES = (".egg-info", ".egg-link")


def normalize_name(name: str) -> str:
    """PEP 503 normalization: 'Ascend_Patch.Core' -> 'ascend-patch-core'."""
    out = []
    previous_dash = False
    for ch in name.lower():
        if ch in "-_.":
            if not previous_dash:
                out.append("-")
            previous_dash = True
        else:
            out.append(ch)
            previous_dash = False
    return "".join(out)


class EntryPointInfo(Value):
    """One entry point, as the cache stores it."""

    __slots__ = ("distribution", "group", "name", "value", "version")
    _fields = ("name", "value", "group", "distribution", "version")

    def __init__(self, name: str, value: str, group: str, distribution: str, version: str) -> None:
        self.name = name
        self.value = value
        self.group = group
        self.distribution = distribution
        self.version = version

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self) -> Any:
        """Import the entry point's object (what ``EntryPoint.load`` does, without importlib.metadata)."""
        import importlib

        module, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module.strip())
        attr = attr.split("[")[0].strip()  # extras are irrelevant to loading
        if attr:
            for part in attr.split("."):
                obj = getattr(obj, part)
        return obj


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ascend-patch")


class MetadataCache:
    """Entry points and distribution versions of this interpreter's ``sys.path``."""

    def __init__(self, *, persistent: bool = True) -> None:
        #: False: answers are computed fresh and never read from or written to disk
        #: (``ascend-patch doctor`` reports what is installed now, not what was cached).
        self.persistent = persistent
        self._lock = threading.RLock()
        self._fingerprint: str | None = None
        self._data: dict[str, Any] | None = None
        self._dirty = False
        #: Whether the last load came from the disk cache (for benchmarks and doctor).
        self.hit = False

    # -- fingerprint & storage ----------------------------------------------------

    @staticmethod
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
        parts = [sys.executable, sys.prefix, str(_FORMAT)]
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

    def _enabled(self) -> bool:
        from ._env_flags import env_flag

        return self.persistent and env_flag("ASCEND_PATCH_CACHE", True)

    def _path(self) -> str:
        directory = os.environ.get("ASCEND_PATCH_CACHE_DIR") or _default_cache_dir()
        # One file per interpreter; a CRC is enough to keep them apart (the key inside
        # names the interpreter again, so a collision costs a miss, never a wrong answer).
        interpreter = f"{sys.executable}\0{sys.prefix}".encode("utf-8", "surrogatepass")
        key = f"{binascii.crc32(interpreter):08x}"
        return os.path.join(directory, f"metadata-{key}.marshal")

    def _load(self, *, check: bool = False) -> dict[str, Any]:
        """The cached data; ``check`` re-reads what is installed (the fingerprint).

        Only plugin discovery checks -- once per apply(): the many version and
        requirement lookups of one apply() would otherwise repeat it for every patch.
        """
        with self._lock:
            if self._data is not None:
                if not check:
                    return self._data
                fingerprint, paths = self.fingerprint(self._data.get("paths"))
                if fingerprint == self._fingerprint:
                    self._note_paths(paths)
                    return self._data
            disk = self._read()
            known = disk.get("paths") if disk is not None else None
            fingerprint, paths = self.fingerprint(known if isinstance(known, dict) else None)
            self._fingerprint = fingerprint
            if disk is not None and disk.get("fingerprint") == fingerprint:
                self._data = disk
                self.hit = True
                self._note_paths(paths)
            else:
                self.hit = False
                self._data = {
                    "format": _FORMAT,
                    "interpreter": [sys.executable, sys.prefix],
                    "fingerprint": fingerprint,
                    "paths": paths,
                    "groups": {},
                    "versions": {},
                    "requirements": {},
                }
                self._dirty = True
            return self._data

    def _read(self) -> dict[str, Any] | None:
        if not self._enabled():
            return None
        try:
            with open(self._path(), "rb") as fh:
                data = marshal.load(fh)
        except (OSError, EOFError, ValueError, TypeError):
            return None
        # Another format or interpreter (a CRC collision in the file name): not ours.
        if (
            not isinstance(data, dict)
            or data.get("format") != _FORMAT
            or data.get("interpreter") != [sys.executable, sys.prefix]
        ):
            return None
        return data

    def _note_paths(self, paths: dict[str, list[Any]]) -> None:
        """Remember directory stamps that moved without changing the key.

        Saved with the cache, so that the next run need not list those directories
        again. A program that writes into its own directory on every run (checkpoints,
        logs) therefore lists it once per launch -- as the interpreter's own path
        finder does for that directory anyway -- and rewrites the small cache file.
        """
        assert self._data is not None
        if self._data.get("paths") != paths:
            self._data["paths"] = paths
            self._dirty = True

    def save(self) -> None:
        """Write the cache if anything new was learned. Failures are silent: it is a cache."""
        with self._lock:
            if not self._dirty or self._data is None or not self._enabled():
                return
            path = self._path()
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                # Unique even across hosts sharing a home directory.
                tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
                with open(tmp, "wb") as fh:
                    marshal.dump(self._data, fh)
                os.replace(tmp, path)
                self._dirty = False
            except (OSError, ValueError, TypeError):  # ValueError: unmarshallable data
                with contextlib.suppress(OSError, UnboundLocalError):
                    os.remove(tmp)

    def clear(self) -> None:
        with self._lock:
            self._data = None
            self._fingerprint = None
            with contextlib.suppress(OSError):
                os.remove(self._path())

    # -- queries ------------------------------------------------------------------

    def entry_points(self, group: str, *, fresh: bool = False) -> list[EntryPointInfo]:
        """Entry points of ``group``, one per entry-point name (first on sys.path wins), sorted by name."""
        with self._lock:
            data = self._load(check=True)
            rows = None if fresh else data["groups"].get(group)
            if rows is None:
                rows, shadowed = _scan_group(group)
                data["groups"][group] = rows
                data.setdefault("shadowed", {})[group] = shadowed
                self._dirty = True
            return [EntryPointInfo(*row) for row in rows]

    def entry_point(self, group: str, name: str) -> EntryPointInfo | None:
        """The entry point ``name`` of ``group`` (the one that wins), or None."""
        return next((info for info in self.entry_points(group) if info.name == name), None)

    def shadowed_entry_points(self, group: str) -> list[EntryPointInfo]:
        """Entry points of ``group`` dropped because an earlier distribution has the same name."""
        with self._lock:
            if group not in self._load()["groups"]:
                self.entry_points(group)
            rows = self._load().get("shadowed", {}).get(group, [])
            return [EntryPointInfo(*row) for row in rows]

    def version(self, distribution: str) -> str | None:
        """Installed version of ``distribution``, or None when it is not installed."""
        key = normalize_name(distribution)
        with self._lock:
            data = self._load()
            versions: dict[str, str | None] = data["versions"]
            if key not in versions:
                from importlib import metadata as importlib_metadata

                try:
                    versions[key] = importlib_metadata.version(key)
                except importlib_metadata.PackageNotFoundError:
                    versions[key] = None
                self._dirty = True
            return versions[key]

    def cached_requirement(self, text: str) -> tuple[bool, str] | None:
        with self._lock:
            found = self._load()["requirements"].get(text)
            return None if found is None else (bool(found[0]), str(found[1]))

    def store_requirement(self, text: str, result: tuple[bool, str]) -> None:
        with self._lock:
            self._load()["requirements"][text] = result
            self._dirty = True


_Row = tuple[str, str, str, str, str]


def _listing(path: str, st: os.stat_result) -> list[list[Any]]:
    """``[name, mtime_ns]`` of the metadata a sys.path entry holds; [] when none."""
    if not stat.S_ISDIR(st.st_mode):  # a zip or egg file on sys.path: itself
        return [["", st.st_mtime_ns]]
    try:
        with os.scandir(path) as entries:
            found = [
                [e.name, e.stat().st_mtime_ns]
                for e in entries
                if e.name.endswith(_METADATA_SUFFIXES)
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


def _scan_group(group: str) -> tuple[list[_Row], list[_Row]]:
    """(kept, shadowed) entry points of ``group``."""
    from importlib import metadata as importlib_metadata

    rows: dict[str, _Row] = {}
    shadowed: list[_Row] = []
    for dist in importlib_metadata.distributions():
        try:
            # Most distributions name no entry point of ours: a substring test on the
            # file is enough to pass them over without parsing it.
            text = dist.read_text("entry_points.txt")
            if not text or group not in text:
                continue
            eps = [ep for ep in dist.entry_points if ep.group == group]
        except Exception:  # a broken distribution must not stop discovery
            continue
        if not eps:
            continue
        name = dist.metadata["Name"] or "?"
        version = dist.version or "?"
        for ep in eps:
            # pluggy's rule: the first distribution on sys.path wins a name.
            row = (ep.name, ep.value, group, name, version)
            if ep.name in rows:
                if rows[ep.name][3] != name:  # the same dist seen twice is no conflict
                    shadowed.append(row)
            else:
                rows[ep.name] = row
    return [rows[n] for n in sorted(rows)], shadowed


#: The process-wide cache.
metadata = MetadataCache()
