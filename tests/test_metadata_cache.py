"""The on-disk metadata cache survives unrelated writes and notices new distributions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


PROBE = (
    "import ascend_patch_core, sys\n"
    "from ascend_patch_core._metadata import metadata\n"
    "ascend_patch_core.apply(autoload=True)\n"
    "print(metadata.hit, 'packaging' in sys.modules)\n"
)


def _probe(site: Path, cache: Path, cwd: Path) -> tuple[bool, bool]:
    env = dict(os.environ, ASCEND_PATCH_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    hit, packaging = out.stdout.split()
    return hit == "True", packaging == "True"


def _dist(site: Path, name: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")


def test_cache_survives_unrelated_writes_and_sees_new_distributions(tmp_path: Path) -> None:
    """Files written next to the program (checkpoints, logs) keep the cache warm; a new dist-info misses it."""
    site, cache, work = tmp_path / "site", tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    _dist(site, "apx-cache-a")
    assert _probe(site, cache, work)[0] is False  # first run fills the cache
    assert _probe(site, cache, work) == (True, False)  # warm: no packaging import
    (work / "checkpoint.pt").write_bytes(b"x")  # the program writes into its working directory
    (site / "unrelated.txt").write_text("x")
    assert _probe(site, cache, work)[0] is True
    _dist(site, "apx-cache-b")  # a new distribution is installed
    assert _probe(site, cache, work)[0] is False


def test_cache_is_shared_by_programs_in_different_directories(tmp_path: Path) -> None:
    """sys.path[0] is the program's directory: without metadata there, it must not change the key."""
    site, cache = tmp_path / "site", tmp_path / "cache"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    _dist(site, "apx-cache-c")
    assert _probe(site, cache, one)[0] is False
    assert _probe(site, cache, two) == (True, False)
    assert _probe(site, cache, one) == (True, False)
    _dist(two, "apx-cache-d")  # a distribution next to the program does count
    assert _probe(site, cache, two)[0] is False


def _site_on_path(site: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])


def test_unchanged_directory_is_not_listed_again(tmp_path: Path, monkeypatch: Any) -> None:
    """A directory whose time is old and unchanged costs one stat: its listing is reused."""
    from ascend_patch_core import _metadata

    site = tmp_path / "site"
    _dist(site, "apx-cache-e")
    _site_on_path(site, monkeypatch)
    # The directory was just written; the racy-clean rule would not trust its times yet.
    monkeypatch.setattr(_metadata, "_RACY_NS", -(10**12))
    key, paths = _metadata.MetadataCache.fingerprint()
    assert paths[str(site)][0] is not None

    listed: list[str] = []
    real = _metadata._listing
    monkeypatch.setattr(
        _metadata, "_listing", lambda entry, *a: listed.append(entry) or real(entry, *a)
    )
    assert _metadata.MetadataCache.fingerprint(paths)[0] == key
    assert str(site) not in listed


def test_a_distribution_added_within_the_same_clock_tick_is_seen(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A recent directory time is not trusted (racy clean): a coarse clock cannot hide an install."""
    from ascend_patch_core import _metadata

    site = tmp_path / "site"
    _dist(site, "apx-cache-f")
    _site_on_path(site, monkeypatch)
    key, paths = _metadata.MetadataCache.fingerprint()
    stamp = os.stat(site).st_mtime_ns
    _dist(site, "apx-cache-g")
    os.utime(site, ns=(stamp, stamp))  # as if the clock had not ticked since the first listing
    assert _metadata.MetadataCache.fingerprint(paths)[0] != key


def test_a_non_persistent_view_neither_reads_nor_writes_the_disk_cache(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """MetadataCache(persistent=False) (what doctor uses) answers from what is installed now."""
    from ascend_patch_core._metadata import MetadataCache

    monkeypatch.setenv("ASCEND_PATCH_CACHE_DIR", str(tmp_path / "cache"))
    warm = MetadataCache()
    warm.version("pluggy")
    warm.save()
    [cache_file] = (tmp_path / "cache").iterdir()
    before = cache_file.read_bytes()

    fresh = MetadataCache(persistent=False)
    assert fresh.version("pluggy") == warm.version("pluggy")
    assert fresh.hit is False
    fresh.version("apx-never-installed-dist")
    fresh.save()
    assert cache_file.read_bytes() == before


def test_an_egg_info_rewritten_in_place_changes_the_key(tmp_path: Path, monkeypatch: Any) -> None:
    """setup.py develop adds entry_points.txt inside an existing egg-info: the parent's time stays."""
    from ascend_patch_core import _metadata

    site = tmp_path / "site"
    egg = site / "apx_develop.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: apx-develop\nVersion: 1.0\n")
    _site_on_path(site, monkeypatch)
    monkeypatch.setattr(_metadata, "_RACY_NS", -(10**12))  # trust the fresh times
    key, paths = _metadata.MetadataCache.fingerprint()
    parent = os.stat(site)
    (egg / "entry_points.txt").write_text("[ascend_patch]\nx = apx_develop\n")
    later = time.time_ns() + 10**9
    os.utime(egg, ns=(later, later))  # a coarse clock could have kept it; make sure it moved
    assert os.stat(site).st_mtime_ns == parent.st_mtime_ns
    assert _metadata.MetadataCache.fingerprint(paths)[0] != key


def test_non_string_sys_path_entries_are_ignored(tmp_path: Path, monkeypatch: Any) -> None:
    """A pathlib.Path entry on sys.path (the PathFinder ignores it) breaks nothing."""
    from ascend_patch_core._metadata import MetadataCache

    monkeypatch.setenv("ASCEND_PATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", [tmp_path, *sys.path])
    cache = MetadataCache()
    assert cache.version("pluggy")
    cache.save()
    assert list((tmp_path / "cache").iterdir())


def test_a_moved_directory_is_listed_once_then_remembered(tmp_path: Path, monkeypatch: Any) -> None:
    """The working directory's times move when a program writes there: listed again once, then not."""
    from ascend_patch_core import _metadata

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(sys, "path", [str(work), *sys.path])
    monkeypatch.setattr(_metadata, "_RACY_NS", -(10**12))  # trust the fresh times
    key, paths = _metadata.MetadataCache.fingerprint()
    (work / "checkpoint-1.pt").write_bytes(b"x")
    listed: list[str] = []
    real = _metadata._listing
    monkeypatch.setattr(
        _metadata, "_listing", lambda path, *a: listed.append(path) or real(path, *a)
    )
    moved_key, moved = _metadata.MetadataCache.fingerprint(paths)
    assert moved_key == key and listed == [str(work)]
    cache = _metadata.MetadataCache()
    cache._data = {"paths": paths}
    cache._note_paths(moved)  # kept with the cache ...
    assert cache._dirty
    listed.clear()
    assert _metadata.MetadataCache.fingerprint(moved)[0] == key
    assert listed == []  # ... so the next run does not list it again
