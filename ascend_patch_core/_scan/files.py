"""The files ``ascend-patch scan`` reads: the tree walk, and reading one file safely.

Only regular files are read. A name ending in ``.py`` may be a FIFO (opening it for
reading waits for a writer forever), a device (``/dev/zero`` never ends) or a socket,
directly or through a symlink: such an entry is listed as not scanned, with what it
is, and never opened. The check is made before opening (``os.stat``, which follows a
symlink to see what it points at) and again on the opened descriptor (``os.fstat``),
and the file is opened non-blocking, so an entry swapped for a FIFO in between
cannot make the scan wait either.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import tokenize
from collections.abc import Iterable
from collections.abc import Iterator


__all__ = ["NotARegularFile", "cuda_sources", "python_files", "read_source", "relative"]

_SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "__pycache__",
    "node_modules",
    "site-packages",
    "build",
    "dist",
}

#: What a file that is not a regular file is, by its stat mode test.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


class NotARegularFile(OSError):
    """A ``.py`` entry that is a FIFO, a device, a socket...: never read."""

    def __init__(self, mode: int) -> None:
        kind = next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")
        super().__init__(f"not a regular file ({kind})")


def read_source(path: str) -> str:
    """The text of the regular file ``path``, decoded as Python decodes a source file.

    Raises NotARegularFile for anything else (never opened, or closed unread), OSError
    when it cannot be read, SyntaxError for a bad coding cookie, UnicodeDecodeError.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotARegularFile(mode)
    descriptor = os.open(path, _OPEN_FLAGS)
    with open(descriptor, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):  # replaced between the two looks
            raise NotARegularFile(mode)
        data = fh.read()
    # What tokenize.open() does, on the bytes already read.
    buffer = io.BytesIO(data)
    encoding, _ = tokenize.detect_encoding(buffer.readline)
    buffer.seek(0)
    return io.TextIOWrapper(buffer, encoding, line_buffering=True).read()


def python_files(root: str, exclude: Iterable[str]) -> Iterator[str]:
    """Every ``.py`` entry under ``root`` (whatever it is: the reader decides), or ``root``
    itself when it is not a directory."""
    patterns = list(exclude)
    if not os.path.isdir(root):
        yield root
        return
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(
            d
            for d in subdirs
            if d not in _SKIP_DIRS
            and not d.startswith(".venv")
            and not d.endswith(".egg-info")
            and not _excluded(os.path.join(directory, d), root, patterns)
        )
        for name in sorted(files):
            path = os.path.join(directory, name)
            if name.endswith(".py") and not _excluded(path, root, patterns):
                yield path


def cuda_sources(root: str, exclude: Iterable[str]) -> list[str]:
    """``.cu``/``.cuh`` files under the directory ``root``, relative to it (only counted)."""
    if not os.path.isdir(root):
        return []
    patterns = list(exclude)
    out = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS and not d.startswith(".venv"))
        for name in sorted(files):
            path = os.path.join(directory, name)
            if name.endswith((".cu", ".cuh")) and not _excluded(path, root, patterns):
                out.append(relative(path, root))
    return out


def _excluded(path: str, root: str, patterns: list[str]) -> bool:
    rel = relative(path, root)
    return any(
        fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(os.path.basename(path), p) for p in patterns
    )


def relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` (a directory, or a file: then its directory), with ``/``."""
    base = root if os.path.isdir(root) else os.path.dirname(root)
    return os.path.relpath(path, base or ".").replace(os.sep, "/")
