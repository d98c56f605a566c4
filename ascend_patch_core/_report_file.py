"""Writing a report file (``ascend-patch run --report PATH``) without harming what is there.

A file is replaced atomically: the text goes to a temporary file beside it, created
with a random name, ``O_EXCL`` and ``O_NOFOLLOW`` -- never through a link someone
planted under a name they could guess -- and is then renamed over ``PATH``. A
symbolic link to a file (or to nothing) is replaced the same way, so a link planted
at a predictable report path cannot aim the write at another file. A FIFO or a
device, or a link to one, is written into, never replaced: a run as root cannot turn
``/dev/null`` into a regular file. When ``PATH`` is this process's own stdout or
stderr (``/dev/stdout``, ``/dev/fd/2``, whatever they lead to), the report is
appended to that stream after what the program wrote.

The temporary file is created with mode 0666 less the umask (0644 under umask 022),
as ``open(PATH, "w")`` would create the report; a report names the program's
command line, as ``ps`` shows it to every user anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from typing import Any

from ._cache_file import write_private


__all__ = ["write_json"]


def write_json(path: str, data: dict[str, Any], *, create_directory: bool = True) -> None:
    """Write ``data`` as indented JSON to ``path``. Raises OSError."""
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    payload = text.encode("utf-8")
    target = _target(path)
    if target is not None and _to_own_stream(target, payload):
        return
    if target is not None and not stat.S_ISREG(target.st_mode) and _into(path, payload):
        return
    if create_directory:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_private(path, payload, mode=0o666)  # a report, not a secret: the umask's mode


def _target(path: str) -> os.stat_result | None:
    """What ``path`` names, links followed; None when nothing (missing, a dangling link)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _to_own_stream(target: os.stat_result, payload: bytes) -> bool:
    """``/dev/stdout``, ``/dev/fd/2``...: append to that stream rather than reopen it."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        if _same_file(target, fd):
            with contextlib.suppress(Exception):  # what the program printed goes first
                if stream is not None:
                    stream.flush()
            _write_all(fd, payload)
            return True
    return False


def _into(path: str, payload: bytes) -> bool:
    """Write into a FIFO or a device (or through a link to one); False if it is a file after all."""
    # No O_CREAT: this never makes a file, and a link swapped for one meanwhile is not
    # written through (the caller replaces it instead).
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        _write_all(fd, payload)
        return True
    finally:
        os.close(fd)


def _same_file(target: os.stat_result, fd: int) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
