"""Writing a report file (``ascend-patch run --report PATH``) without harming what is there.

The report only ever becomes a new regular file: the text goes to a temporary file
beside ``PATH``, created with a random name, ``O_EXCL`` and ``O_NOFOLLOW`` -- never
through a link someone planted under a name they could guess -- made private (0600,
whatever the umask: a report names the program's command line and environment-driven
options), and is then renamed over ``PATH``. A symbolic link at ``PATH`` is replaced
the same way, so a link planted at a predictable report path cannot aim the write at
another file.

``PATH`` itself is never opened. A FIFO there would make the run wait at exit for a
reader (or hand the report to whoever reads it); a device or a socket is no place for
a file either. :func:`target_problem` refuses them before the program runs, and
:func:`write_json` leaves one alone if it appears meanwhile (it is not replaced:
a run as root must not turn ``/dev/null`` into a regular file). The one exception is
this process's own stdout or stderr (``/dev/stdout``, ``/dev/fd/2``, whatever they
lead to): the report is appended to that stream after what the program wrote.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from typing import Any

from .._discovery.cache_file import file_kind
from .._discovery.cache_file import replace_file


__all__ = ["target_problem", "write_json"]


def target_problem(path: str) -> str | None:
    """Why the report cannot be written to ``path``, or None: said before the program runs."""
    if os.path.isdir(path):
        return (
            f"{path}: is a directory; give the file to write, "
            f"e.g. --report {os.path.join(path, 'run.json')}"
        )
    existing = os.path.dirname(path)  # the report's directory is created if missing
    while existing and not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if existing and os.path.exists(existing) and not os.path.isdir(existing):
        return f"{path}: {existing} is not a directory"
    target = _target(path)
    if target is None or stat.S_ISREG(target.st_mode) or _own_stream(target) is not None:
        return None
    through = " (through a symbolic link)" if os.path.islink(path) else ""
    return (
        f"{path}: is {file_kind(target.st_mode)}{through}, not a regular file; the report is "
        "written as a new regular file that replaces PATH, so give a file name "
        "(or /dev/stdout or /dev/stderr to print it)"
    )


def write_json(path: str, data: dict[str, Any], *, create_directory: bool = True) -> None:
    """Write ``data`` as indented JSON to ``path``. Raises OSError."""
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    payload = text.encode("utf-8")
    target = _target(path)
    stream = None if target is None else _own_stream(target)
    if stream is not None:
        fd, pystream = stream
        with contextlib.suppress(Exception):  # what the program printed goes first
            if pystream is not None:
                pystream.flush()
        _write_all(fd, payload)
        return
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise OSError(f"{path} is now {file_kind(mode)}, which is left alone: not written")
    if create_directory:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    replace_file(path, payload)


def _target(path: str) -> os.stat_result | None:
    """What ``path`` names, links followed; None when nothing (missing, a dangling link)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _own_stream(target: os.stat_result) -> tuple[int, Any] | None:
    """``(fd, Python stream)`` when ``target`` is this process's stdout or stderr."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return fd, stream
    return None


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
