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

The cache says which modules ``apply()`` imports, so it is guarded (docs/security.md):
it lives in a 0700 directory as a 0600 file, is read only when this user owns both
and nobody else can write them (:mod:`.cache_file`), its bytes are checked before
marshal reads them, and every field of it is checked, every answer tied to an
installed distribution's metadata directory (:mod:`.cache_validation`). A cache that
fails a check is discarded and rebuilt.

Controls: ``ASCEND_PATCH_CACHE=0`` disables it; ``ASCEND_PATCH_CACHE_DIR`` (an absolute
path) moves it (default ``$XDG_CACHE_HOME/ascend-patch`` or ``~/.cache/ascend-patch``;
where neither is usable the answers are kept in memory only, see :attr:`MetadataCache.unplaced`).
"""

from __future__ import annotations

import binascii
import marshal
import os
import sys
import threading
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from .._model.value import Value
from . import cache_file as _cache_file
from . import cache_validation as _cache_validation
from .cache_validation import normalize_name
from .fingerprint import fingerprint


__all__ = ["EntryPointInfo", "MetadataCache", "metadata", "normalize_name"]

_FORMAT = 6


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

    def failure_file(self, exc: BaseException) -> str | None:
        """The file where :meth:`load` failed with ``exc``: the plugin's own file nearest the error.

        The innermost traceback frame inside the plugin's top-level package (for an
        error in a dependency, the plugin line that imported it); the file of a
        syntax error there; else the entry point's module file; None when that module
        does not exist. Nothing is imported to find it.
        """
        import importlib.util

        top = self.module.partition(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except Exception:  # a broken parent, a module without __spec__: no place to name
            spec = None
        if spec is None or spec.origin is None:
            return None
        roots = list(spec.submodule_search_locations or [spec.origin])
        roots = [os.path.normpath(os.path.abspath(r)) for r in roots]

        def inside(path: str | None) -> bool:
            if not path:
                return False
            path = os.path.normpath(os.path.abspath(path))
            return any(path == root or path.startswith(root + os.sep) for root in roots)

        if isinstance(exc, SyntaxError) and inside(exc.filename):
            return exc.filename
        found = None
        tb = exc.__traceback__
        while tb is not None:
            if inside(tb.tb_frame.f_code.co_filename):
                found = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
        if found is not None:
            return found
        if not spec.submodule_search_locations:
            return spec.origin if os.path.exists(spec.origin) else None
        relative = self.module.split(".")[1:]
        for root in roots:
            base = os.path.join(root, *relative)
            for candidate in (os.path.join(base, "__init__.py"), base + ".py"):
                if os.path.isfile(candidate):
                    return candidate
        return None


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
        #: Why the disk cache was not read or written (its owner or modes), or None.
        self.refused: str | None = None
        #: Why the disk cache was read but discarded (a malformed or unbacked field), or None.
        self.rejected: str | None = None
        #: What was made private again (a directory an older release left open), or None.
        self.repaired: str | None = None
        #: Why there is no place for the disk cache (a relative ASCEND_PATCH_CACHE_DIR, no
        #: usable home directory): the answers are kept in memory only. Or None.
        self.unplaced: str | None = None
        #: A location setting that was skipped (a relative XDG_CACHE_HOME), or None.
        self.ignored: str | None = None

    # -- fingerprint & storage ----------------------------------------------------

    #: What the answers depend on (see :func:`._fingerprint.fingerprint`).
    fingerprint = staticmethod(fingerprint)

    def _enabled(self) -> bool:
        from .._model.env_flags import env_flag

        return self.persistent and env_flag("ASCEND_PATCH_CACHE", True)

    def _where(self) -> tuple[str | None, str, bool]:
        """``(cache directory or None, file name, ours)``; notes why there is no directory."""
        directory, ours, self.unplaced, self.ignored = _cache_file.cache_location()
        # One file per interpreter; a CRC is enough to keep them apart (the key inside
        # names the interpreter again, so a collision costs a miss, never a wrong answer).
        interpreter = f"{sys.executable}\0{sys.prefix}".encode("utf-8", "surrogatepass")
        return directory, f"metadata-{binascii.crc32(interpreter):08x}.marshal", ours

    def _path(self) -> str | None:
        """The cache file, or None when there is no place for one (see :attr:`unplaced`)."""
        directory, name, _ = self._where()
        return None if directory is None else os.path.join(directory, name)

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
            if disk is not None:
                self.rejected = _problem(_cache_validation.shape_problem, disk)
                if self.rejected is not None:
                    disk = None
            fingerprint, paths = self.fingerprint(disk["paths"] if disk is not None else None)
            if disk is not None and disk["fingerprint"] == fingerprint:
                self.rejected = _problem(_cache_validation.binding_problem, disk, paths)
                if self.rejected is not None:
                    disk = None
                    # Its listings may be what is wrong: list every directory again.
                    fingerprint, paths = self.fingerprint()
            self._fingerprint = fingerprint
            if disk is not None and disk["fingerprint"] == fingerprint:
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
                    "shadowed": {},
                    "versions": {},
                    "requirements": {},
                }
                self._dirty = True
            return self._data

    def _read(self) -> dict[str, Any] | None:
        """The disk cache when only this user can have written it and it unmarshals to ours."""
        self.refused = self.rejected = None
        if not self._enabled():
            return None
        directory, name, ours = self._where()
        if directory is None:
            return None
        try:
            raw, self.refused, repaired = _cache_file.read_private(directory, name, ours=ours)
            self.repaired = self.repaired or repaired
        except OSError as exc:
            self.refused = f"the cache cannot be checked: {exc}"
            return None
        if raw is None:
            return None
        # Before marshal sees it: marshal's cost on hostile bytes is not linear.
        problem = _cache_validation.stream_problem(raw)
        if problem is not None:
            self.rejected = f"the cache file does not unmarshal as a cache: {problem}"
            return None
        try:
            data = marshal.loads(raw)
        except Exception as exc:  # EOFError, ValueError, TypeError: not a marshal file
            self.rejected = f"the cache file does not unmarshal ({type(exc).__name__})"
            return None
        if not isinstance(data, dict):
            self.rejected = "the cache file does not hold a mapping"
            return None
        # Another format (an older release) or interpreter (a CRC collision): not ours.
        if data.get("format") != _FORMAT or data.get("interpreter") != [sys.executable, sys.prefix]:
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
            directory, name, ours = self._where()
            if directory is None:
                return
            try:
                problem, repaired = _cache_file.save_private(
                    directory, name, marshal.dumps(self._data), ours=ours
                )
                self.repaired = self.repaired or repaired
                if problem is not None:
                    self.refused = problem
                    return
                self._dirty = False
            except (OSError, ValueError, TypeError):  # ValueError: unmarshallable data
                pass

    def audit(self) -> tuple[str | None, dict[str, Any] | None]:
        """``(cache file, its answers)`` as ``apply()`` would load them, for doctor.

        The answers are None when the disk cache was not used (absent, stale,
        :attr:`refused` or :attr:`rejected`); the file is None when the cache is off
        or has no place (:attr:`unplaced`).
        """
        with self._lock:
            if not self._enabled():
                return None, None
            self._data = None
            data = self._load(check=True)
            return self._path(), (data if self.hit else None)

    def clear(self) -> None:
        with self._lock:
            self._data = None
            self._fingerprint = None
            directory, name, _ = self._where()
            if directory is not None:
                _cache_file.remove_private(directory, name)

    # -- queries ------------------------------------------------------------------

    def entry_points(
        self, group: str, *, fresh: bool = False, also: tuple[str, ...] = ()
    ) -> list[EntryPointInfo]:
        """Entry points of ``group``, one per entry-point name (first on sys.path wins), sorted by name.

        ``also``: groups to read in the same pass when ``group`` has to be read (each
        read walks every distribution: a few ms for 150 on a cache miss).
        """
        with self._lock:
            data = self._load(check=True)
            rows = None if fresh else data["groups"].get(group)
            if rows is None:
                wanted = [group, *(g for g in also if fresh or g not in data["groups"])]
                for name, (kept, shadowed) in _scan_groups(wanted, data["paths"]).items():
                    data["groups"][name] = kept
                    data["shadowed"][name] = shadowed
                rows = data["groups"][group]
                self._dirty = True
            return [EntryPointInfo(*row[:5]) for row in rows]

    def entry_point(self, group: str, name: str) -> EntryPointInfo | None:
        """The entry point ``name`` of ``group`` (the one that wins), or None."""
        return next((info for info in self.entry_points(group) if info.name == name), None)

    def shadowed_entry_points(self, group: str) -> list[EntryPointInfo]:
        """Entry points of ``group`` dropped because an earlier distribution has the same name."""
        with self._lock:
            if group not in self._load()["groups"]:
                self.entry_points(group)
            rows = self._load()["shadowed"].get(group, [])
            return [EntryPointInfo(*row[:5]) for row in rows]

    def version(self, distribution: str) -> str | None:
        """Installed version of ``distribution``, or None when it is not installed."""
        key = normalize_name(distribution)
        with self._lock:
            data = self._load()
            versions: dict[str, tuple[str, str | None, str | None] | None] = data["versions"]
            if key not in versions:
                from importlib import metadata as importlib_metadata

                try:
                    dist = importlib_metadata.distribution(key)
                except importlib_metadata.PackageNotFoundError:
                    versions[key] = None
                else:
                    where = _cache_validation.origin(
                        getattr(dist, "_path", None), _entries(data["paths"])
                    )
                    versions[key] = None if dist.version is None else (dist.version, *where)
                self._dirty = True
            found = versions[key]
            return None if found is None else found[0]

    def cached_requirement(self, text: str) -> tuple[bool, str] | None:
        with self._lock:
            found = self._load()["requirements"].get(text)
            return None if found is None else (found[0], found[1])

    def store_requirement(self, text: str, result: tuple[bool, str]) -> None:
        """Remember the answer to ``text``, with the versions it was computed from (its binding)."""
        with self._lock:
            data = self._load()
            versions = data["versions"]
            consulted = tuple(
                (key, None if versions[key] is None else versions[key][0])
                for key in _cache_validation.requirement_names(text)
                if key in versions
            )
            data["requirements"][text] = (bool(result[0]), str(result[1]), consulted)
            self._dirty = True


def _problem(check: Callable[..., str | None], *args: Any) -> str | None:
    """What ``check`` finds wrong with a cache; a check that cannot be made is a failed check."""
    try:
        return check(*args)
    except Exception as exc:  # RecursionError on absurd nesting, and whatever else
        return f"the cache cannot be checked ({type(exc).__name__})"


def _entries(paths: Mapping[str, Any]) -> dict[str, str]:
    """Normalized sys.path entry -> the entry as written (the first one, as the path finder)."""
    out: dict[str, str] = {}
    for entry in paths:
        out.setdefault(os.path.normpath(entry or "."), entry)
    return out


_Row = tuple[str, str, str, str, str, "str | None", "str | None"]


def _scan_groups(
    groups: list[str], paths: Mapping[str, Any]
) -> dict[str, tuple[list[_Row], list[_Row]]]:
    """Per group, (kept, shadowed) entry points, each with the metadata directory it came from."""
    from importlib import metadata as importlib_metadata

    entries = _entries(paths)
    rows: dict[str, dict[str, _Row]] = {group: {} for group in groups}
    shadowed: dict[str, list[_Row]] = {group: [] for group in groups}
    for dist in importlib_metadata.distributions():
        try:
            # Most distributions name no entry point of ours: a substring test on the
            # file is enough to pass them over without parsing it.
            text = dist.read_text("entry_points.txt")
            if not text or not any(group in text for group in groups):
                continue
            eps = [ep for ep in dist.entry_points if ep.group in rows]
        except Exception:  # a broken distribution must not stop discovery
            continue
        if not eps:
            continue
        name = dist.metadata["Name"] or "?"
        version = dist.version or "?"
        where = _cache_validation.origin(getattr(dist, "_path", None), entries)
        for ep in eps:
            # pluggy's rule: the first distribution on sys.path wins a name.
            row = (ep.name, ep.value, ep.group, name, version, *where)
            kept = rows[ep.group]
            if ep.name in kept:
                if kept[ep.name][3] != name:  # the same dist seen twice is no conflict
                    shadowed[ep.group].append(row)
            else:
                kept[ep.name] = row
    return {
        group: ([kept[n] for n in sorted(kept)], shadowed[group]) for group, kept in rows.items()
    }


#: The process-wide cache.
metadata = MetadataCache()
