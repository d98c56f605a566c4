"""How the processes of ``ascend-patch run --report`` hand their reports to the main one.

Children (DataLoader workers, torchrun ranks, anything the start hook patches) write
their report at exit as ``<pid>.json`` into a directory the main process reads, and
removes, at its own exit. The directory is *named* when the run starts (a random name
in the temporary directory, ``ascend-patch-run-<pid>-<random>``) but *made* only by
the first child that has a report to leave, 0700:

* a run whose main process ends without running exit handlers -- SIGTERM, SIGKILL,
  ``os._exit`` -- and had no reporting child leaves nothing behind, since nothing was
  made;
* the child that makes the directory also starts a watcher, a small detached process
  that waits for the main process to end, however it ends, and then removes the
  directory: reports nobody will read are not left in ``/tmp`` either;
* a child whose main process is already gone leaves no report (nobody would read it).

Only this user's directory is used: one that exists under the name but is not this
user's, or is open to others, is neither written to nor removed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from .._discovery.cache_file import open_regular
from .._discovery.cache_file import replace_file


__all__ = ["PREFIX", "collect", "deliver", "new_location"]

PREFIX = "ascend-patch-run-"
_DIRECTORY_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)

# Runs detached (its own session, stdio on /dev/null; -I -S: no site, so no start hook).
# It forks once more so that the child starting it can reap it at once: the watcher
# is nobody's child in the program. Waits on a pidfd where there is one, else polls.
_WATCHER = """
import os, shutil, sys, time
directory, pid = sys.argv[1], int(sys.argv[2])
if os.fork():
    os._exit(0)
try:
    fd = os.pidfd_open(pid)
except (AttributeError, OSError):
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except OSError:
            pass
        time.sleep(0.5)
else:
    import select
    select.select([fd], [], [])
try:
    st = os.lstat(directory)
except OSError:
    sys.exit(0)
if os.path.isdir(directory) and not os.path.islink(directory) and st.st_uid == os.geteuid():
    shutil.rmtree(directory, ignore_errors=True)
"""


def new_location() -> str:
    """A fresh, unguessable name for this run's children's reports (not created)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"{PREFIX}{os.getpid()}-{os.urandom(8).hex()}")


def deliver(directory: str, main_pid: int | None, entry: dict[str, Any]) -> None:
    """Leave this child's report for the main process. Raises OSError."""
    if main_pid is None or not _alive(main_pid):
        return  # the main process is gone: nobody would read it
    created = False
    try:
        os.mkdir(directory, 0o700)
        created = True
    except FileExistsError:
        pass
    fd = _own_directory(directory)
    if fd is None:
        return
    try:
        payload = json.dumps(entry, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
        replace_file(f"{os.getpid()}.json", payload, dir_fd=fd)
    finally:
        os.close(fd)
    if created:
        _start_watcher(directory, main_pid)


def collect(directory: str | None) -> list[dict[str, Any]]:
    """The children's reports, by pid; the directory is removed."""
    if not directory:
        return []
    try:
        fd = _own_directory(directory)
    except OSError:
        return []
    if fd is None:
        return []
    parts: list[dict[str, Any]] = []
    try:
        for name in sorted(os.listdir(fd)):
            if not name.endswith(".json"):
                continue
            try:
                part_fd, _ = open_regular(name, dir_fd=fd, follow=False)
                with open(part_fd, encoding="utf-8") as fh:
                    part = json.load(fh)
            except (OSError, ValueError):
                continue  # a child killed while writing
            if isinstance(part, dict):
                parts.append(part)
    finally:
        os.close(fd)
    import shutil

    shutil.rmtree(directory, ignore_errors=True)  # fd-based: no link inside is followed
    parts.sort(key=lambda p: p.get("pid", 0) if isinstance(p.get("pid"), int) else 0)
    return parts


def _own_directory(directory: str) -> int | None:
    """A descriptor on ``directory`` when it is this user's and private, else None."""
    try:
        fd = os.open(directory, _DIRECTORY_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # ELOOP: a symbolic link in its place
        return None
    st = os.stat(fd)
    geteuid = getattr(os, "geteuid", None)
    if (geteuid is not None and st.st_uid != geteuid()) or st.st_mode & 0o077:
        os.close(fd)
        return None
    return fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it exists
        return True
    return True


def _start_watcher(directory: str, main_pid: int) -> None:
    """Remove ``directory`` once the main process has ended, however it ends."""
    import subprocess

    try:
        starter = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHER, directory, str(main_pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
        )
        starter.wait(timeout=30)  # it forks the watcher and exits at once
    except (OSError, subprocess.SubprocessError):
        pass  # no watcher: the main process still removes it at a normal exit
