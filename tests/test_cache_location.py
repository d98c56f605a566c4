"""Where the metadata cache goes: the XDG rules, no usable home, and links in shared directories.

Each case runs ``apply()`` (and doctor) in a fresh process, as users do:

* a relative ``ASCEND_PATCH_CACHE_DIR`` or ``XDG_CACHE_HOME`` was resolved against the
  working directory (``./rel-cache/``); now a relative ``XDG_CACHE_HOME`` is ignored
  (the XDG base directory specification calls it invalid) and a relative
  ``ASCEND_PATCH_CACHE_DIR`` keeps the cache in memory, and doctor says so;
* ``HOME`` unset without a passwd entry wrote under a directory literally named
  ``./~/``, ``HOME=`` wrote ``/.cache``: now no cache on disk, and doctor says why;
* with ``XDG_CACHE_HOME`` on a shared sticky directory, another user's symbolic link
  made ``apply()`` chmod the victim's directory to 0700 and write into it: a link is
  now followed only when this user or root owns it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


BIN = Path(sys.executable).parent
#: A uid with no passwd entry here, standing for another user.
STRANGER = 54321
# This uid has no passwd entry (a container's uid): what pwd, and expanduser, then see.
NO_PASSWD = """
import os
if os.environ.get("APX_NO_PASSWD"):
    import pwd
    def getpwuid(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")
    pwd.getpwuid = getpwuid
"""
APPLY = """
import json, sys
import ascend_patch_core
from ascend_patch_core._discovery.metadata import metadata
ascend_patch_core.apply()
print(json.dumps({"hit": metadata.hit, "refused": metadata.refused, "path": metadata._path(),
                  "unplaced": getattr(metadata, "unplaced", None),
                  "ignored": getattr(metadata, "ignored", None)}))
"""
PROBE = NO_PASSWD + APPLY


def _env(home: Path | str | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ASCEND_PATCH_", "PYTHON", "XDG_")) and k != "HOME"
    }
    if home is not None:
        env["HOME"] = str(home)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env.update(extra)
    return env


def _apply(work: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _doctor(work: Path, env: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    # `ascend-patch doctor --json`, in an interpreter that may lack a passwd entry.
    doctor = (
        NO_PASSWD + "import sys\nfrom ascend_patch_core._cli.commands import main\nsys.exit(main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", doctor, "doctor", "--json"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout, done.stderr
    result = json.loads(done.stdout)
    findings = {f["code"]: f["message"] for f in result["findings"]}
    return result["metadata_cache"], findings


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty working directory: whatever the cache leaves in it shows."""
    path = tmp_path / "work"
    path.mkdir()
    return path


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ---------------------------------------------------------------------------- relative values


def test_a_relative_cache_dir_keeps_the_cache_in_memory_and_doctor_says_so(
    tmp_path: Path, work: Path
) -> None:
    env = _env(tmp_path / "home", ASCEND_PATCH_CACHE_DIR="rel-cache")

    first, second = _apply(work, env), _apply(work, env)

    assert _tree(work) == []  # no ./rel-cache
    assert not (tmp_path / "home").exists()  # nor a cache somewhere the user did not choose
    assert first["path"] is None and second["hit"] is False
    assert "ASCEND_PATCH_CACHE_DIR='rel-cache' is not an absolute path" in first["unplaced"]
    info, findings = _doctor(work, env)
    assert info["state"] == "memory-only"
    message = findings["cache-memory-only"]
    assert "ASCEND_PATCH_CACHE_DIR='rel-cache' is not an absolute path" in message
    assert "kept in memory only" in message and "absolute path" in message
    assert _tree(work) == []


def test_a_relative_xdg_cache_home_is_ignored_as_the_spec_says(tmp_path: Path, work: Path) -> None:
    """XDG_CACHE_HOME=rel-xdg: ignored, so the cache is in $HOME/.cache/ascend-patch; doctor notes it."""
    home = tmp_path / "home"
    env = _env(home, XDG_CACHE_HOME="rel-xdg")

    assert _apply(work, env)["hit"] is False
    result = _apply(work, env)

    assert _tree(work) == []
    assert result["hit"] is True
    assert result["path"].startswith(str(home / ".cache" / "ascend-patch") + os.sep)
    assert "XDG_CACHE_HOME='rel-xdg' is not an absolute path, so it is ignored" in result["ignored"]
    info, findings = _doctor(work, env)
    assert info["state"] == "valid"
    assert "XDG_CACHE_HOME='rel-xdg'" in findings["cache-setting-ignored"]


def test_an_absolute_xdg_cache_home_is_used(tmp_path: Path, work: Path) -> None:
    env = _env(tmp_path / "home", XDG_CACHE_HOME=str(tmp_path / "xdg"))

    _apply(work, env)

    assert _apply(work, env)["hit"] is True
    assert (tmp_path / "xdg" / "ascend-patch").is_dir() and not (tmp_path / "home").exists()


# ---------------------------------------------------------------------------- no usable home


@pytest.mark.parametrize(
    ("home", "why"),
    [
        ("", "HOME is empty"),
        ("rel-home", "HOME ('rel-home') is not an absolute path"),
        (None, "HOME is unset and uid"),
    ],
    ids=["empty", "relative", "unset-without-passwd-entry"],
)
def test_without_a_usable_home_the_cache_stays_in_memory(
    work: Path, home: str | None, why: str
) -> None:
    """HOME= wrote /.cache, HOME=rel-home wrote ./rel-home, HOME unset without a passwd
    entry wrote ./~/.cache: nothing is written now, the program runs, doctor says why."""
    root_cache = Path("/.cache/ascend-patch")
    before = _tree(root_cache) if root_cache.is_dir() else None
    stamps = {p: p.stat().st_mtime_ns for p in root_cache.glob("*")} if before else {}
    env = _env(home, APX_NO_PASSWD="1")

    result = _apply(work, env)

    assert _tree(work) == []  # no ./~ and no ./rel-home
    assert (_tree(root_cache) if root_cache.is_dir() else None) == before
    assert {p: p.stat().st_mtime_ns for p in root_cache.glob("*")} == stamps
    assert result["path"] is None and why in result["unplaced"]
    info, findings = _doctor(work, env)
    assert info["state"] == "memory-only" and why in findings["cache-memory-only"]
    assert _tree(work) == []


def test_home_unset_uses_the_passwd_entry() -> None:
    """HOME unset, this uid has a passwd entry: its home directory (not ./~)."""
    import pwd

    from ascend_patch_core._discovery.cache_file import cache_location

    home = pwd.getpwuid(os.getuid()).pw_dir
    assert cache_location({})[:3] == (os.path.join(home, ".cache", "ascend-patch"), True, None)


# ---------------------------------------------------------------------------- links


def _chown_or_skip(path: Path, uid: int) -> None:
    try:
        os.chown(path, uid, uid, follow_symlinks=False)
    except PermissionError:
        pytest.skip("needs root, to give a file to another uid")


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A directory every user may write in, sticky, like /tmp."""
    path = tmp_path / "shared"
    path.mkdir()
    path.chmod(0o1777)
    return path


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A directory of this user's that others may read, with a file in it."""
    path = tmp_path / "victim"
    path.mkdir()
    (path / "notes.txt").write_text("mine\n")
    path.chmod(0o775)
    return path


def test_another_users_link_in_a_shared_directory_is_not_followed(
    tmp_path: Path, work: Path, shared: Path, victim: Path
) -> None:
    """XDG_CACHE_HOME on a sticky shared directory, where another user planted
    ascend-patch -> the victim's directory: the victim keeps its mode and contents
    (it used to be chmod-ed 0700 and to receive the cache); doctor names the link."""
    link = shared / "ascend-patch"
    link.symlink_to(victim)
    _chown_or_skip(link, STRANGER)
    env = _env(tmp_path / "home", XDG_CACHE_HOME=str(shared))

    result = _apply(work, env)

    assert stat.S_IMODE(victim.stat().st_mode) == 0o775
    assert _tree(victim) == ["notes.txt"]
    assert result["hit"] is False
    assert f"{link} is a symbolic link owned by uid {STRANGER}" in result["refused"]
    assert "it is not followed" in result["refused"]
    info, findings = _doctor(work, env)
    assert info["state"] == "refused" and f"{link} is a symbolic link" in findings["cache-refused"]
    assert link.is_symlink() and _tree(victim) == ["notes.txt"]


def test_another_users_link_higher_up_the_path_is_not_followed(
    tmp_path: Path, work: Path, shared: Path, victim: Path
) -> None:
    """The planted link is a parent of the cache directory (XDG_CACHE_HOME=shared/cache)."""
    link = shared / "cache"
    link.symlink_to(victim)
    _chown_or_skip(link, STRANGER)

    result = _apply(work, _env(tmp_path / "home", XDG_CACHE_HOME=str(link)))

    assert _tree(victim) == ["notes.txt"] and stat.S_IMODE(victim.stat().st_mode) == 0o775
    assert f"{link} is a symbolic link owned by uid {STRANGER}" in result["refused"]


def test_another_users_directory_in_a_shared_directory_is_refused_unchanged(
    tmp_path: Path, work: Path, shared: Path
) -> None:
    planted = shared / "ascend-patch"
    planted.mkdir()
    planted.chmod(0o777)
    _chown_or_skip(planted, STRANGER)

    result = _apply(work, _env(tmp_path / "home", XDG_CACHE_HOME=str(shared)))

    assert f"is owned by uid {STRANGER}, not by this user" in result["refused"]
    assert stat.S_IMODE(planted.stat().st_mode) == 0o777 and _tree(planted) == []


def test_your_own_links_are_followed(tmp_path: Path, work: Path) -> None:
    """~/.cache a link to another disk, as users set it up: the cache lives there."""
    home, elsewhere = tmp_path / "home", tmp_path / "scratch"
    home.mkdir()
    elsewhere.mkdir()
    (home / ".cache").symlink_to(elsewhere)
    env = _env(home)

    _apply(work, env)
    result = _apply(work, env)

    assert result["hit"] is True and result["refused"] is None
    assert [p.name for p in (elsewhere / "ascend-patch").iterdir()] == [Path(result["path"]).name]
    assert stat.S_IMODE((elsewhere / "ascend-patch").stat().st_mode) == 0o700


def test_a_chosen_directory_reached_through_another_users_link_is_refused(
    tmp_path: Path, work: Path, shared: Path, victim: Path
) -> None:
    link = shared / "cache"
    link.symlink_to(victim)
    _chown_or_skip(link, STRANGER)

    result = _apply(work, _env(tmp_path / "home", ASCEND_PATCH_CACHE_DIR=str(link / "sub")))

    assert f"{link} is a symbolic link owned by uid {STRANGER}" in result["refused"]
    assert _tree(victim) == ["notes.txt"]


# ---------------------------------------------------------------------------- the rules, in-process


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"ASCEND_PATCH_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, ("/c", False)),
        ({"ASCEND_PATCH_CACHE_DIR": "c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, (None, False)),
        ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, ("/x/ascend-patch", True)),
        ({"XDG_CACHE_HOME": "x", "HOME": "/h"}, ("/h/.cache/ascend-patch", True)),
        ({"XDG_CACHE_HOME": "", "HOME": "/h"}, ("/h/.cache/ascend-patch", True)),
        ({"ASCEND_PATCH_CACHE_DIR": "", "HOME": "/h"}, ("/h/.cache/ascend-patch", True)),
        ({"HOME": ""}, (None, True)),
        ({"HOME": "~"}, (None, True)),
        ({"HOME": "/"}, ("/.cache/ascend-patch", True)),  # explicitly / (a container's root)
    ],
)
def test_location_rules(environ: dict[str, str], expected: tuple[str | None, bool]) -> None:
    from ascend_patch_core._discovery.cache_file import cache_location

    directory, ours, why, _ = cache_location(environ)
    assert (directory, ours) == expected
    assert (why is None) == (directory is not None)
