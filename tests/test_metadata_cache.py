"""The on-disk metadata cache: survives unrelated writes, notices new distributions, and is no way in.

The second half runs each attack of docs/security.md's threat model against it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


PROBE = (
    "import ascend_patch_core, sys\n"
    "from ascend_patch_core._discovery.metadata import metadata\n"
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
    from ascend_patch_core._discovery import fingerprint as _fingerprint
    from ascend_patch_core._discovery import metadata as _metadata

    site = tmp_path / "site"
    _dist(site, "apx-cache-e")
    _site_on_path(site, monkeypatch)
    # The directory was just written; the racy-clean rule would not trust its times yet.
    monkeypatch.setattr(_fingerprint, "_RACY_NS", -(10**12))
    key, paths = _metadata.MetadataCache.fingerprint()
    assert paths[str(site)][0] is not None

    listed: list[str] = []
    real = _fingerprint._listing
    monkeypatch.setattr(
        _fingerprint, "_listing", lambda entry, *a: listed.append(entry) or real(entry, *a)
    )
    assert _metadata.MetadataCache.fingerprint(paths)[0] == key
    assert str(site) not in listed


def test_a_distribution_added_within_the_same_clock_tick_is_seen(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A recent directory time is not trusted (racy clean): a coarse clock cannot hide an install."""
    from ascend_patch_core._discovery import metadata as _metadata

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
    from ascend_patch_core._discovery.metadata import MetadataCache

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
    from ascend_patch_core._discovery import fingerprint as _fingerprint
    from ascend_patch_core._discovery import metadata as _metadata

    site = tmp_path / "site"
    egg = site / "apx_develop.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: apx-develop\nVersion: 1.0\n")
    _site_on_path(site, monkeypatch)
    monkeypatch.setattr(_fingerprint, "_RACY_NS", -(10**12))  # trust the fresh times
    key, paths = _metadata.MetadataCache.fingerprint()
    parent = os.stat(site)
    (egg / "entry_points.txt").write_text("[ascend_patch]\nx = apx_develop\n")
    later = time.time_ns() + 10**9
    os.utime(egg, ns=(later, later))  # a coarse clock could have kept it; make sure it moved
    assert os.stat(site).st_mtime_ns == parent.st_mtime_ns
    assert _metadata.MetadataCache.fingerprint(paths)[0] != key


def test_non_string_sys_path_entries_are_ignored(tmp_path: Path, monkeypatch: Any) -> None:
    """A pathlib.Path entry on sys.path (the PathFinder ignores it) breaks nothing."""
    from ascend_patch_core._discovery.metadata import MetadataCache

    monkeypatch.setenv("ASCEND_PATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", [tmp_path, *sys.path])
    cache = MetadataCache()
    assert cache.version("pluggy")
    cache.save()
    assert list((tmp_path / "cache").iterdir())


def test_a_moved_directory_is_listed_once_then_remembered(tmp_path: Path, monkeypatch: Any) -> None:
    """The working directory's times move when a program writes there: listed again once, then not."""
    from ascend_patch_core._discovery import fingerprint as _fingerprint
    from ascend_patch_core._discovery import metadata as _metadata

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(sys, "path", [str(work), *sys.path])
    monkeypatch.setattr(_fingerprint, "_RACY_NS", -(10**12))  # trust the fresh times
    key, paths = _metadata.MetadataCache.fingerprint()
    (work / "checkpoint-1.pt").write_bytes(b"x")
    listed: list[str] = []
    real = _fingerprint._listing
    monkeypatch.setattr(
        _fingerprint, "_listing", lambda path, *a: listed.append(path) or real(path, *a)
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


# --------------------------------------------------------------------------- the cache is not a way in
#
# Each attack of the issue ("the metadata cache must not be a way in"), run the way a user
# runs: apply(), `ascend-patch run` and a start-hook child in fresh processes, doctor
# through its CLI. The real first-party plugins are installed in the test environment, so
# a forged "torch-npu is installed" would queue the torch plugin's NPU patches.

BIN = Path(sys.executable).parent
APPLY_PROBE = """
import json, os, sys
import ascend_patch_core
from ascend_patch_core._discovery.metadata import metadata
report = ascend_patch_core.apply()
print(json.dumps({
    "hit": metadata.hit, "rejected": metadata.rejected, "refused": metadata.refused,
    "pending": sum(r.status.value == "pending" for r in report.records),
    "plugins": sorted(r.name for r in report.records if r.kind == "plugin"),
    "evil": "apx_evil_mod" in sys.modules,
}))
"""
FORGE = """
import marshal, os, sys
from ascend_patch_core._discovery.fingerprint import fingerprint
from ascend_patch_core._discovery.metadata import MetadataCache
path = MetadataCache()._path()
with open(path, "rb") as fh:
    data = marshal.load(fh)
site = sys.argv[1]
exec(sys.argv[2])
if sys.argv[3] == "rekey":  # a forger who also forges the listings recomputes the key
    data["fingerprint"] = fingerprint(data["paths"])[0]
with open(path, "wb") as fh:
    marshal.dump(data, fh)
"""
# Imported, it leaves a mark: nothing may import it.
EVIL = "import os\nopen(os.environ['APX_EVIL_MARK'], 'w').close()\n"


class Box:
    """A site directory on PYTHONPATH, a private cache directory, a working directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.site, self.cache, self.work = tmp_path / "site", tmp_path / "cache", tmp_path / "work"
        self.work.mkdir()
        self.mark = tmp_path / "evil-was-imported"
        install(self.site, "apx-box", "1.0", "[console_scripts]\napx_evil = apx_evil_mod\n")
        (self.site / "apx_evil_mod.py").write_text(EVIL)
        import compileall

        # As pip does: a first run's __pycache__ would otherwise move the site's times.
        compileall.compile_dir(str(self.site), quiet=1)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
        env.update(
            PYTHONPATH=str(self.site),
            ASCEND_PATCH_CACHE_DIR=str(self.cache),
            APX_EVIL_MARK=str(self.mark),
            TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        )
        env.update(extra)
        return env

    def run(self, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self.env(**extra),
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def apply(self, **extra: str) -> dict[str, Any]:
        done = self.run(sys.executable, "-c", APPLY_PROBE, **extra)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result

    def forge(self, code: str, *, rekey: bool = False) -> None:
        if rekey:
            # Forged listings are reused only for a directory whose times the cache
            # trusts: wait out the racy-clean window, and let a run record them.
            settled = self.site.stat().st_ctime + 2.2 - time.time()
            if settled > 0:
                time.sleep(settled)
            self.apply()
        done = self.run(sys.executable, "-c", FORGE, str(self.site), code, "rekey" if rekey else "")
        assert done.returncode == 0, done.stderr

    def doctor(self) -> dict[str, Any]:
        done = self.run(str(BIN / "ascend-patch"), "doctor", "--json")
        assert done.stdout, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def cache_file(self) -> Path:
        [path] = self.cache.iterdir()
        return path


def install(
    site: Path, dist: str, version: str, entry_points: str = "", module: str | None = None
) -> Path:
    """A distribution as pip lays one out: ``<name>-<version>.dist-info`` on the path."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)
    if module:
        (site / f"{module}.py").write_text("")
    return info


def cache_findings(result: dict[str, Any]) -> dict[str, str]:
    return {f["code"]: f["message"] for f in result["findings"] if f["code"].startswith("cache-")}


@pytest.fixture
def box(tmp_path: Path) -> Box:
    made = Box(tmp_path)
    first = made.apply()
    assert first["hit"] is False and first["rejected"] is None
    assert made.apply()["hit"] is True  # a warm, honest cache
    return made


MALFORMED = {
    "row-of-numbers": "data['groups']['ascend_patch'][0] = (1, 2)",
    "row-field-not-text": "r = data['groups']['ascend_patch'][0]; data['groups']['ascend_patch'][0] = (r[0], 7, *r[2:])",
    "group-not-a-list": "data['groups']['ascend_patch'] = 5",
    "shadowed-missing": "del data['shadowed']",
    "version-not-text": "data['versions']['torch-npu'] = (2, None, None)",
    "version-wrong-arity": "data['versions']['torch-npu'] = ['2.1.0']",
    "requirement-truncated": "data['requirements']['torch-npu'] = (True,)",
    "requirement-not-bool": "data['requirements']['torch-npu'] = ('yes', 'x', ())",
    "listing-malformed": "e = next(iter(data['paths'])); data['paths'][e] = [None, [['x']]]",
    "stamp-malformed": "e = next(iter(data['paths'])); data['paths'][e] = [['a', 'b', 'c'], []]",
    "fingerprint-not-text": "data['fingerprint'] = 3",
}


@pytest.mark.parametrize("forgery", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_inner_field_is_discarded_and_rewritten(box: Box, forgery: str) -> None:
    """A cache that unmarshals but has a malformed field never crashes apply(): it is rebuilt and rewritten."""
    box.forge(forgery)

    discarded = box.apply()
    rewritten = box.apply()

    assert discarded["hit"] is False and discarded["rejected"], discarded
    assert "torch" in discarded["plugins"]
    assert rewritten == dict(discarded, hit=True, rejected=None)


@pytest.mark.parametrize("launcher", ["run", "start-hook"])
@pytest.mark.parametrize("forgery", ["row-of-numbers", "requirement-truncated"])
def test_run_and_start_hook_children_survive_a_malformed_cache(
    box: Box, launcher: str, forgery: str
) -> None:
    """`ascend-patch run` and a child started by the start hook each meet a malformed cache and run."""
    box.forge(MALFORMED[forgery])
    forged = box.work / "forged.marshal"
    forged.write_bytes(box.cache_file().read_bytes())
    script = box.work / "prog.py"
    script.write_text(
        "import subprocess, sys\n"
        "print('parent ran', flush=True)\n"
        "# The parent's start-up rewrote the cache: malform it again for the child.\n"
        f"open({str(box.cache_file())!r}, 'wb').write(open({str(forged)!r}, 'rb').read())\n"
        "sys.exit(subprocess.run([sys.executable, '-c', 'print(\"child ran\")']).returncode)\n"
    )
    if launcher == "run":
        done = box.run(str(BIN / "ascend-patch"), "run", str(script))
    else:  # what every process below `ascend-patch run` does at start-up
        done = box.run(sys.executable, str(script), ASCEND_PATCH_RUN="1")

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["parent", "ran", "child", "ran"]
    assert "Traceback" not in done.stderr
    assert box.apply()["hit"] is True  # the child rewrote it


def test_doctor_reports_a_malformed_cache_and_removes_it(box: Box) -> None:
    """doctor loads the cache as apply() would: a malformed one is a finding, and is removed."""
    box.forge(MALFORMED["row-of-numbers"])

    result = box.doctor()

    found = cache_findings(result)
    assert set(found) == {"cache-invalid"}, result["findings"]
    assert (
        "malformed: (1, 2)" in found["cache-invalid"]
        and "Doctor removed it" in found["cache-invalid"]
    )
    assert result["metadata_cache"]["state"] == "invalid"
    assert not list(box.cache.iterdir())
    assert box.apply()["hit"] is False


# A distribution the forger installs outside sys.path, declaring the evil entry point.
OUTSIDE = (
    "ev = os.path.join(os.path.dirname(site), 'outside', 'apx_evil-1.0.dist-info');"
    "os.makedirs(ev, exist_ok=True);"
    "open(os.path.join(ev, 'METADATA'), 'w').write("
    "'Metadata-Version: 2.1\\nName: apx-evil\\nVersion: 1.0\\n');"
    "open(os.path.join(ev, 'entry_points.txt'), 'w').write("
    "'[ascend_patch]\\napx_evil = apx_evil_mod\\n');"
)
LIST_AND_ROW = (
    "data['paths'][site][1].append([name, os.stat(ev).st_mtime_ns]);"
    "data['paths'][site][1].sort();"
    "data['groups']['ascend_patch'].append(('apx_evil', 'apx_evil_mod', 'ascend_patch', "
    "'apx-evil', '1.0', site, name))"
)

FORGED_ROWS = {
    # An installed distribution that declares this entry point, but as a console script.
    "undeclared": (
        "data['groups']['ascend_patch'].append(('apx_evil', 'apx_evil_mod', 'ascend_patch', "
        "'apx-box', '1.0', site, 'apx_box-1.0.dist-info'))",
        False,
        "does not declare 'apx_evil = apx_evil_mod' in [ascend_patch]",
    ),
    # A distribution that is not installed, the listings forged to name it and the key recomputed.
    "not-installed": (
        "data['groups']['ascend_patch'].append(('apx_evil', 'apx_evil_mod', 'ascend_patch', "
        "'apx-ghost', '1.0', site, 'apx_ghost-1.0.dist-info'));"
        "data['paths'][site][1].append(['apx_ghost-1.0.dist-info', 1]);"
        "data['paths'][site][1].sort()",
        True,
        "apx_ghost-1.0.dist-info does not exist",
    ),
    "unbound": (
        "data['groups']['ascend_patch'].append(('apx_evil', 'apx_evil_mod', 'ascend_patch', "
        "'apx-box', '1.0', None, None))",
        False,
        "not tied to a metadata directory",
    ),
    # A real distribution the forger made outside sys.path, reached from a listing of the
    # site by a relative path (an absolute one below); the key recomputed to match.
    "outside-by-relative-path": (
        OUTSIDE + "name = os.path.relpath(ev, site);" + LIST_AND_ROW,
        True,
        "has a malformed listing",
    ),
    "outside-by-absolute-path": (
        OUTSIDE + "name = ev;" + LIST_AND_ROW,
        True,
        "has a malformed listing",
    ),
    # The listing honest, the row's metadata name a path: refused by name.
    "row-names-a-path": (
        OUTSIDE
        + "data['groups']['ascend_patch'].append(('apx_evil', 'apx_evil_mod', 'ascend_patch', "
        "'apx-evil', '1.0', site, os.path.relpath(ev, site)))",
        False,
        "is not the name of a metadata directory",
    ),
}


@pytest.mark.parametrize(
    ("forgery", "rekey", "why"), list(FORGED_ROWS.values()), ids=list(FORGED_ROWS)
)
def test_a_forged_row_cannot_make_apply_import_a_module(
    box: Box, forgery: str, rekey: bool, why: str
) -> None:
    """A row naming an arbitrary module is rejected (nothing imported) and doctor shows it."""
    box.forge(forgery, rekey=rekey)

    result = box.apply()

    assert box.mark.exists() is False and result["evil"] is False
    assert "apx_evil" not in result["plugins"]
    assert result["hit"] is False and why in result["rejected"]
    box.forge(forgery, rekey=rekey)  # the run rewrote it; forge it again for doctor
    found = cache_findings(box.doctor())
    assert why in found["cache-invalid"]
    assert box.mark.exists() is False


FORGED_VERSIONS = {
    "no-such-dist-info": (
        "data['versions']['torch-npu'] = ('2.13.0', site, 'torch_npu-2.13.0.dist-info');"
        "data['requirements']['torch-npu'] = (True, 'torch-npu 2.13.0', (('torch-npu', '2.13.0'),))",
        "is not among the installed distributions",
    ),
    "listed-but-absent": (
        "data['versions']['torch-npu'] = ('2.13.0', site, 'torch_npu-2.13.0.dist-info');"
        "data['paths'][site][1].append(['torch_npu-2.13.0.dist-info', 1]);"
        "data['paths'][site][1].sort();"
        "data['requirements']['torch-npu'] = (True, 'torch-npu 2.13.0', (('torch-npu', '2.13.0'),))",
        "does not exist",
    ),
    "another-distribution": (
        "data['versions']['torch-npu'] = ('1.0', site, 'apx_box-1.0.dist-info');"
        "data['requirements']['torch-npu'] = (True, 'torch-npu 1.0', (('torch-npu', '1.0'),))",
        "is not torch-npu's metadata",
    ),
    "answer-without-version": (
        "data['requirements']['torch-npu'] = (True, 'torch-npu 2.13.0', ())",
        "no distribution it names is installed",
    ),
    "answer-against-its-version": (
        "data['requirements']['torch-npu'] = (True, 'torch-npu 2.13.0', (('torch-npu', '2.13.0'),))",
        "does not follow from the cached versions",
    ),
}


@pytest.mark.parametrize(
    ("forgery", "why"), list(FORGED_VERSIONS.values()), ids=list(FORGED_VERSIONS)
)
def test_a_forged_version_cannot_queue_npu_patches(box: Box, forgery: str, why: str) -> None:
    """ "torch-npu is installed", forged on a CPU box, is rejected: exactly the honest patches queue."""
    honest = box.apply()
    rekey = "data['paths']" in forgery
    box.forge(forgery, rekey=rekey)

    result = box.apply()

    assert result["hit"] is False and why in result["rejected"], result
    assert result["pending"] == honest["pending"]


def test_a_forged_version_of_an_installed_distribution_is_checked_against_its_metadata(
    box: Box,
) -> None:
    """A real dist-info named with another version is not that version."""
    install(box.site, "apx-versioned", "1.0")
    box.apply()
    box.apply()
    box.forge("data['versions']['apx-versioned'] = ('1.0', site, 'apx_versioned-1.0.dist-info')")
    assert box.apply()["hit"] is True  # the honest binding passes
    box.forge("data['versions']['apx-versioned'] = ('9.9', site, 'apx_versioned-1.0.dist-info')")

    result = box.apply()

    assert result["hit"] is False
    assert "apx_versioned-1.0.dist-info is not apx-versioned 9.9" in result["rejected"]


def test_doctor_reports_a_cache_that_disagrees_with_a_fresh_scan(box: Box) -> None:
    """Well-formed, bound, and wrong (plugins hidden, an installed distribution called absent): a mismatch."""
    box.forge(
        "data['groups']['ascend_patch'] = [];"
        "data['versions']['pluggy'] = None;"
        "data['requirements']['pluggy'] = (False, 'pluggy is not installed', (('pluggy', None),))"
    )
    assert box.apply()["hit"] is True  # nothing in it is unbacked: only a fresh scan tells
    box.forge("data['groups']['ascend_patch'] = []; data['versions']['pluggy'] = None")

    result = box.doctor()

    found = cache_findings(result)
    assert set(found) == {"cache-mismatch"}, result["findings"]
    message = found["cache-mismatch"]
    assert "entry points of 'ascend_patch': cached none, installed [" in message
    assert "pluggy: cached not installed, installed " in message
    assert "Doctor removed it" in message
    assert result["metadata_cache"]["state"] == "mismatch"
    assert not list(box.cache.iterdir())
    assert box.doctor()["metadata_cache"]["state"] == "absent"


def test_a_healthy_cache_is_valid_for_doctor(box: Box) -> None:
    result = box.doctor()
    assert cache_findings(result) == {}
    assert result["metadata_cache"]["state"] == "valid"
    assert box.apply()["hit"] is True  # doctor left it in place


# --------------------------------------------------------------------------- modes and ownership

UMASK_PROBE = "import os; os.umask(0)\n" + APPLY_PROBE


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("where", ["default", "chosen"])
def test_private_modes_under_umask_000(tmp_path: Path, where: str) -> None:
    """Under umask 000 the directories made are 0700 and the file 0600, also missing parents."""
    made = Box(tmp_path)
    if where == "default":
        made.cache = tmp_path / "xdg" / "ascend-patch"
        extra = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
        env_cache = {"ASCEND_PATCH_CACHE_DIR": ""}
    else:
        made.cache = tmp_path / "a" / "b"
        extra, env_cache = {}, {}
    made_env = dict(extra, **env_cache)
    done = subprocess.run(
        [sys.executable, "-c", UMASK_PROBE],
        env={k: v for k, v in made.env(**made_env).items() if v},
        cwd=made.work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

    assert _mode(made.cache) == 0o700
    assert _mode(made.cache.parent) == 0o700
    assert _mode(made.cache_file()) == 0o600
    assert [p.name for p in made.cache.iterdir()] == [made.cache_file().name]  # no temp file left


def _fresh(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> Any:
    from ascend_patch_core._discovery.metadata import MetadataCache

    monkeypatch.setenv("ASCEND_PATCH_CACHE_DIR", str(cache_dir))
    return MetadataCache


def _warm(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> Path:
    cache_type = _fresh(monkeypatch, cache_dir)
    cache = cache_type()
    cache.entry_points("ascend_patch")
    cache.version("pluggy")
    cache.save()
    again = cache_type()
    again.entry_points("ascend_patch")
    assert again.hit is True
    [path] = cache_dir.iterdir()
    return path


def _doctor_cache_findings() -> dict[str, str]:
    from ascend_patch_core._cli.doctor_checks import cache_check

    return {f.code: f.message for f in cache_check()[1]}


def test_a_cache_directory_owned_by_someone_else_is_neither_read_nor_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another uid's directory (as when root runs with a user's HOME) is refused; doctor says so."""
    from ascend_patch_core._discovery import cache_file as _cache_file

    path = _warm(monkeypatch, tmp_path / "cache")
    before = path.read_bytes(), path.stat().st_mtime_ns
    me = os.getuid()
    monkeypatch.setattr(_cache_file, "_uid", lambda: me + 1)
    cache = _fresh(monkeypatch, tmp_path / "cache")()

    assert cache.entry_points("ascend_patch")  # answers come from a fresh scan
    cache.version("apx-not-installed-zz")
    cache.save()

    assert cache.hit is False
    assert f"is owned by uid {me}, not by this user (uid {me + 1})" in cache.refused
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    found = _doctor_cache_findings()
    assert set(found) == {"cache-refused"} and "chmod 700" in found["cache-refused"]


def test_a_cache_file_owned_by_someone_else_is_not_read_and_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A foreign-owned file in a private directory is not unmarshalled; this user's file replaces it."""
    from ascend_patch_core._discovery import cache_file as _cache_file

    path = _warm(monkeypatch, tmp_path / "cache")
    real_fstat = os.fstat

    def foreign_fstat(fd: int) -> os.stat_result:
        fields = list(real_fstat(fd))
        fields[stat.ST_UID] += 1
        return os.stat_result(fields)

    monkeypatch.setattr(_cache_file.os, "fstat", foreign_fstat)
    cache = _fresh(monkeypatch, tmp_path / "cache")()
    cache.entry_points("ascend_patch")
    assert (
        cache.hit is False and "the cache file" in cache.refused and "owned by uid" in cache.refused
    )
    assert "cache-refused" in _doctor_cache_findings()
    cache.save()
    monkeypatch.undo()

    again = _fresh(monkeypatch, tmp_path / "cache")()
    again.entry_points("ascend_patch")
    assert again.hit is True and _mode(path) == 0o600


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_group_or_world_writable_cache_file_is_not_read_and_is_rewritten_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    path = _warm(monkeypatch, tmp_path / "cache")
    path.chmod(mode)

    cache = _fresh(monkeypatch, tmp_path / "cache")()
    cache.entry_points("ascend_patch")
    assert cache.hit is False and "is writable by" in cache.refused
    cache.save()

    assert _mode(path) == 0o600
    again = _fresh(monkeypatch, tmp_path / "cache")()
    again.entry_points("ascend_patch")
    assert again.hit is True and again.refused is None


def test_a_writable_directory_the_user_chose_is_refused_and_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ASCEND_PATCH_CACHE_DIR writable by others: not read, not written, its mode kept; doctor says why."""
    chosen = tmp_path / "shared"
    path = _warm(monkeypatch, chosen)
    chosen.chmod(0o777)
    before = path.read_bytes(), path.stat().st_mtime_ns

    cache = _fresh(monkeypatch, chosen)()
    cache.entry_points("ascend_patch")
    cache.version("apx-not-installed-zz")
    cache.save()

    assert cache.hit is False and "writable by its group and others (mode 0777)" in cache.refused
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert _mode(chosen) == 0o777
    assert "cache-refused" in _doctor_cache_findings()


def test_the_default_directory_left_open_by_an_older_release_is_made_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~/.cache/ascend-patch made 0775 under umask 002: tightened to 0700; the file in it is rewritten first."""
    monkeypatch.delenv("ASCEND_PATCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from ascend_patch_core._discovery.metadata import MetadataCache

    first = MetadataCache()
    first.entry_points("ascend_patch")
    first.save()
    directory = tmp_path / "xdg" / "ascend-patch"
    directory.chmod(0o775)

    found = _doctor_cache_findings()
    assert "made it private (0700)" in found["cache-repaired"]
    assert "is not read, and is replaced" in found["cache-repaired"]  # the file it held
    # Repaired is the whole story: no warning that says to chmod what was just fixed.
    assert "cache-refused" not in found
    assert _mode(directory) == 0o700
    cache = MetadataCache()
    cache.entry_points("ascend_patch")
    cache.save()
    again = MetadataCache()
    again.entry_points("ascend_patch")
    assert again.hit is True and again.refused is None


def test_an_open_default_directory_without_a_file_is_repaired_without_talk_of_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0777 ~/.cache/ascend-patch and no cache file yet: one note, that it was made private."""
    monkeypatch.delenv("ASCEND_PATCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    directory = tmp_path / "xdg" / "ascend-patch"
    directory.mkdir(parents=True)
    directory.chmod(0o777)

    found = _doctor_cache_findings()

    assert "made it private (0700)" in found["cache-repaired"]
    assert "file" not in found["cache-repaired"] and "cache-refused" not in found
    assert _mode(directory) == 0o700


def test_a_symbolic_link_in_place_of_the_cache_file_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _warm(monkeypatch, tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere.marshal"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)

    cache = _fresh(monkeypatch, tmp_path / "cache")()
    cache.entry_points("ascend_patch")

    assert cache.hit is False and "cannot be opened safely" in cache.refused


def test_unreadable_and_absurd_files_are_rejected_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes that do not unmarshal, and nesting too deep to print, are reasons, never exceptions."""
    import marshal

    path = _warm(monkeypatch, tmp_path / "cache")
    good = marshal.loads(path.read_bytes())
    nested: list[Any] = []
    for _ in range(1500):
        nested = [nested]
    for content, why in (
        (b"\x00garbage\xff" * 10, ("does not unmarshal",)),
        (marshal.dumps([1, 2]), ("does not hold a mapping",)),
        # Too deep to check on 3.10-3.12; Python 3.13 gets further and names the bad field.
        (
            marshal.dumps(dict(good, groups={"ascend_patch": [nested]})),
            ("cannot be checked", "is malformed"),
        ),
    ):
        path.write_bytes(content)
        cache = _fresh(monkeypatch, tmp_path / "cache")()
        assert cache.entry_points("ascend_patch") is not None
        assert cache.hit is False and any(w in (cache.rejected or "") for w in why), cache.rejected
