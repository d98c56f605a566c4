"""Who may have written the metadata cache: owner and mode checks, private creation.

The cache decides which modules ``apply()`` imports (plugin entry points) and which
patches it queues (installed versions), so a file that someone else could have
written is never read (docs/security.md). The checks are made on the open file
descriptor and its directory *before* ``marshal`` sees a byte: marshal is not meant
for data an adversary wrote. Creation uses 0700 directories and 0600 files whatever
the umask (a umask only clears bits, so these modes cannot come out looser).
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import BinaryIO


__all__ = ["MAX_BYTES", "open_private", "prepare_directory", "untrusted", "write_private"]

#: Larger than any honest cache by far (a few kB to a few hundred kB): not read.
MAX_BYTES = 16 * 1024 * 1024
_LOOSE = stat.S_IWGRP | stat.S_IWOTH
#: Fresh random names tried for a temporary file before giving up.
_TEMP_ATTEMPTS = 8


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)  # absent on Windows: no owner to compare
    return None if getuid is None else int(getuid())


def untrusted(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this ``stat`` may hold someone else's writing, or None."""
    uid = _uid()
    if uid is not None and st.st_uid != uid:
        return f"{what} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    loose = st.st_mode & _LOOSE
    if loose:
        who = " and ".join(
            w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if loose & bit
        )
        return f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def prepare_directory(directory: str, *, ours: bool) -> tuple[str | None, str | None]:
    """Create ``directory`` (and missing parents) private: ``(why it is not trusted, what was repaired)``.

    ``ours``: the default location, which only this program creates -- one left
    group- or other-writable by an older release (made under the umask) is made
    private again, and trusted from then on. A directory the user chose
    (``ASCEND_PATCH_CACHE_DIR``) is never changed: it is refused and doctor says why.
    """
    missing: list[str] = []
    path = directory
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)  # intermediate ones too: os.makedirs gives them the umask's mode
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory", None
    problem = untrusted(st, f"the cache directory {directory}")
    if problem and ours and st.st_uid == _uid():
        os.chmod(directory, 0o700)
        return None, f"{problem}; made it private (0700)"
    return problem, None


def open_private(path: str, *, ours: bool) -> tuple[BinaryIO | None, str | None, str | None]:
    """The cache file opened for reading when only this user can have written it.

    Returns ``(file, None, None)``; ``(None, None, None)`` when there is no cache file
    (yet); ``(None, why, repaired)`` when there is one that is not read -- ``repaired``
    says what :func:`prepare_directory` changed to make the next one trusted.
    """
    directory = os.path.dirname(path)
    try:
        dir_stat = os.stat(directory)
    except FileNotFoundError:
        return None, None, None
    problem = untrusted(dir_stat, f"the cache directory {directory}")
    if problem:
        if ours and dir_stat.st_uid == _uid():
            # Repaired, the directory is trusted from now on: a note, not a refusal. A
            # file written while it was open is not read; this run writes a new one.
            _, repaired = prepare_directory(directory, ours=True)
            if repaired and os.path.lexists(path):
                repaired += (
                    "; the cache file written while it was open is not read, and is replaced"
                )
            return None, None, repaired
        return None, f"{problem}; the cache in it is neither read nor written", None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:  # ELOOP: a symbolic link, which O_NOFOLLOW refuses
        return None, f"the cache file {path} cannot be opened safely ({exc.strerror})", None
    st = os.fstat(fd)
    problem = untrusted(st, f"the cache file {path}")
    if problem is None and not stat.S_ISREG(st.st_mode):
        problem = f"the cache file {path} is not a regular file"
    if problem is None and st.st_size > MAX_BYTES:
        problem = f"the cache file {path} is {st.st_size} bytes, more than any cache"
    if problem:
        os.close(fd)
        return None, f"{problem}; it is not read, and is replaced", None
    return os.fdopen(fd, "rb"), None, None


def write_private(path: str, data: bytes, mode: int = 0o600) -> None:
    """Atomically replace ``path`` with a file holding ``data``. Raises OSError.

    The temporary file has a random name, created with ``O_EXCL | O_NOFOLLOW``: nobody
    can plant it (or a link at it) in a shared directory. ``mode`` is its creation
    mode, which the umask may narrow: 0600 for the cache, 0666 for a run report.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    for attempt in range(_TEMP_ATTEMPTS):
        # Unique even across hosts sharing a home directory.
        tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:
            if attempt == _TEMP_ATTEMPTS - 1:
                raise
            continue
        break
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
