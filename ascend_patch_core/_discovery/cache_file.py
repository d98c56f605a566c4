"""Where the metadata cache lives, and who may have written it: location, owner and mode checks.

The cache decides which modules ``apply()`` imports (plugin entry points) and which
patches it queues (installed versions), so a file that someone else could have
written is never read (docs/security.md). The checks are made on open file
descriptors *before* ``marshal`` sees a byte: marshal is not meant for data an
adversary wrote.

* **Location** (:func:`cache_location`): ``ASCEND_PATCH_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/ascend-patch``, else ``$HOME/.cache/ascend-patch``. As the XDG
  base directory specification says, a relative value is invalid: a relative
  ``XDG_CACHE_HOME`` is ignored, a relative ``ASCEND_PATCH_CACHE_DIR`` -- or no usable
  home directory (``HOME`` empty, relative, or unset without a passwd entry) -- means
  no cache on disk (answers kept in memory), never a cache in the working directory
  or in ``/``.
* **Reaching the directory** (:func:`_open_directory`): one component at a time from
  ``/``, each opened with ``O_NOFOLLOW`` relative to the one before (``openat``); a
  symbolic link is followed only when you or root own it, so a link planted in a
  shared sticky directory (``/tmp``) cannot aim the cache at another directory.
  Everything after -- the owner and mode checks, a repair ``chmod``, reading,
  writing, removing -- acts on that directory's descriptor, never on its name again.
* **Creation**: missing directories 0700, the file 0600, whatever the umask.
* **Reading**: the file is opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO in its place
  does not block) and must be a regular file of at most :data:`MAX_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Mapping


__all__ = [
    "MAX_BYTES",
    "NotARegularFile",
    "cache_location",
    "file_kind",
    "open_regular",
    "read_private",
    "remove_private",
    "replace_file",
    "save_private",
    "untrusted",
]

#: A cache is a few kB to a few tens of kB (~60 bytes per installed distribution);
#: a larger file is not read (and not written): reading it would cost more than a scan.
MAX_BYTES = 1024 * 1024
_LOOSE = stat.S_IWGRP | stat.S_IWOTH
#: Fresh random names tried for a temporary file before giving up.
_TEMP_ATTEMPTS = 8
_REPLACED = "it is not read, and is replaced"
#: Symbolic links followed while reaching the cache directory (Linux's own limit).
_MAX_LINKS = 40
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
# Non-blocking: opening a FIFO for reading would otherwise wait for a writer forever.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | _CLOEXEC
#: openat() and friends: without them (Windows) the cache is kept in memory only.
_HAS_DIR_FD = {os.open, os.mkdir, os.stat, os.unlink, os.rename, os.readlink} <= os.supports_dir_fd
#: What a file that is not a regular file is, by its stat mode test.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _uid() -> int | None:
    geteuid = getattr(os, "geteuid", None)  # absent on Windows: no owner to compare
    return None if geteuid is None else int(geteuid())


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device'...: what a file of this ``st_mode`` is, for messages."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")


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


# ---------------------------------------------------------------------------- location


def cache_location(
    environ: Mapping[str, str] | None = None,
) -> tuple[str | None, bool, str | None, str | None]:
    """``(directory, ours, why none, what was ignored)``: where the cache lives.

    ``directory`` is None when there is no usable place (``why none`` says why: the
    cache is then kept in memory). ``ours``: the default location, which only this
    program creates (:func:`save_private` may repair its mode). ``what was ignored``:
    a setting skipped on the way (a relative ``XDG_CACHE_HOME``), or None.
    """
    env = os.environ if environ is None else environ
    chosen = env.get("ASCEND_PATCH_CACHE_DIR")
    if chosen:
        if os.path.isabs(chosen):
            return chosen, False, None, None
        return None, False, f"ASCEND_PATCH_CACHE_DIR={chosen!r} is not an absolute path", None
    ignored = None
    xdg = env.get("XDG_CACHE_HOME")
    if xdg:
        if os.path.isabs(xdg):
            return os.path.join(xdg, "ascend-patch"), True, None, None
        ignored = (
            f"XDG_CACHE_HOME={xdg!r} is not an absolute path, so it is ignored "
            "(the XDG base directory specification calls a relative one invalid)"
        )
    home, why = _home(env)
    if home is None:
        return None, True, why, ignored
    return os.path.join(home, ".cache", "ascend-patch"), True, None, ignored


def _home(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``(home directory, None)``, or ``(None, why there is none)``: never ``~`` or ``''``."""
    home = env.get("HOME")
    if home is None:
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError, AttributeError):  # no pwd (Windows), no entry
            return None, f"HOME is unset and uid {_uid()} has no passwd entry"
        where = "the passwd entry's home directory"
    else:
        where = "HOME"
    if not home:
        return None, f"{where} is empty"
    if not os.path.isabs(home):
        return None, f"{where} ({home!r}) is not an absolute path"
    return home, None


# ---------------------------------------------------------------------------- the directory


def _open_directory(directory: str, *, create: bool) -> tuple[int | None, str | None]:
    """A descriptor on ``directory``, reached without following others' symbolic links.

    Returns ``(fd, None)``; ``(None, None)`` when it does not exist and ``create`` is
    false; ``(None, why)`` when it cannot be reached safely. Missing directories are
    made 0700 when ``create``. Raises OSError for other failures.
    """
    if not _HAS_DIR_FD:
        return None, "this platform cannot open the cache directory safely (no openat)"
    if not os.path.isabs(directory):
        return None, f"{directory} is not an absolute path"
    me = _uid()
    parts = directory.split(os.sep)[::-1]  # a stack: the next component last
    fd = os.open(os.sep, _DIRECTORY_FLAGS)
    where = os.sep
    links = 0
    try:
        while parts:
            name = parts.pop()
            if name in ("", "."):
                continue
            try:
                next_fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None, None
                # Parents too (os.makedirs would give them the umask's mode). One made
                # meanwhile by someone else is looked at again, like any other.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                parts.append(name)
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                path = os.path.join(where, name)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    return None, f"{path} is {file_kind(st.st_mode)}, not a directory"
                if me is not None and st.st_uid not in (me, 0):
                    return None, (
                        f"{path} is a symbolic link owned by uid {st.st_uid}, not by this user "
                        f"(uid {me}) or root: it is not followed"
                    )
                links += 1
                if links > _MAX_LINKS:
                    return None, f"{directory}: too many levels of symbolic links"
                target = os.readlink(name, dir_fd=fd)
                if os.path.isabs(target):
                    os.close(fd)
                    fd = -1
                    fd = os.open(os.sep, _DIRECTORY_FLAGS)
                    where = os.sep
                parts.extend(target.split(os.sep)[::-1])
                continue
            os.close(fd)
            fd = next_fd
            where = os.path.join(where, name)
        done, fd = fd, -1
        return done, None
    finally:
        if fd >= 0:
            os.close(fd)


def _trusted_directory(
    directory: str, *, create: bool, ours: bool
) -> tuple[int | None, str | None, str | None]:
    """``(fd, why not trusted, what was repaired)`` for the cache directory.

    ``ours``: the default location, which only this program creates -- one left
    group- or other-writable by an older release (made under the umask) is made
    private again, and trusted from then on. A directory the user chose
    (``ASCEND_PATCH_CACHE_DIR``) is never changed: it is refused and doctor says why.
    """
    fd, problem = _open_directory(directory, create=create)
    if fd is None:
        return None, problem, None
    try:
        st = os.stat(fd)
        problem = untrusted(st, f"the cache directory {directory}")
        repaired = None
        if problem and ours and st.st_uid == _uid():
            os.fchmod(fd, 0o700)  # the descriptor: the directory checked, not a name
            problem, repaired = None, f"{problem}; made it private (0700)"
        if problem:
            return None, problem, None
        done, fd = fd, -1
        return done, None, repaired
    finally:
        if fd >= 0:
            os.close(fd)


# ---------------------------------------------------------------------------- the file


class NotARegularFile(OSError):
    """A FIFO, a device, a socket, a directory where a regular file was to be read."""

    def __init__(self, name: str, mode: int) -> None:
        #: What it is: 'a FIFO', 'a character device'...
        self.kind = file_kind(mode)
        super().__init__(errno.EINVAL, f"{self.kind}, not a regular file", name)


def open_regular(
    name: str, *, dir_fd: int | None = None, follow: bool = True
) -> tuple[int, os.stat_result]:
    """Open ``name`` for reading when it is a regular file: ``(blocking fd, its stat)``.

    Opened non-blocking, so that a FIFO does not wait for a writer, and checked on the
    descriptor. Raises OSError: ``errno.ELOOP`` for a link (``follow`` false),
    :class:`NotARegularFile` for anything but a regular file.
    """
    flags = _READ_FLAGS if follow else _READ_FLAGS | _NOFOLLOW
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(name, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_all(fd: int, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``fd``: one more than allowed tells a file that is too large."""
    chunks = []
    left = limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_private(
    directory: str, name: str, *, ours: bool
) -> tuple[bytes | None, str | None, str | None]:
    """The cache file's bytes, when only this user can have written them.

    Returns ``(data, None, None)``; ``(None, None, None)`` when there is no cache file
    (yet); ``(None, why, repaired)`` when there is one that is not read, and
    ``(None, None, repaired)`` when the directory was just made private (the file
    written while it was open is not read; this run writes a new one).
    """
    try:
        fd, problem = _open_directory(directory, create=False)
    except OSError as exc:
        return None, f"the cache directory {directory} cannot be opened ({exc.strerror})", None
    if fd is None:
        return None, problem and f"{problem}; the cache in it is neither read nor written", None
    try:
        st = os.stat(fd)
        problem = untrusted(st, f"the cache directory {directory}")
        if problem:
            if ours and st.st_uid == _uid():
                os.fchmod(fd, 0o700)
                repaired = f"{problem}; made it private (0700)"
                with contextlib.suppress(OSError):
                    os.stat(name, dir_fd=fd, follow_symlinks=False)
                    repaired += (
                        "; the cache file written while it was open is not read, and is replaced"
                    )
                return None, None, repaired
            return None, f"{problem}; the cache in it is neither read nor written", None
        return _read_file(fd, os.path.join(directory, name), name)
    finally:
        os.close(fd)


def _read_file(dir_fd: int, path: str, name: str) -> tuple[bytes | None, str | None, None]:
    try:
        fd, st = open_regular(name, dir_fd=dir_fd, follow=False)
    except FileNotFoundError:
        return None, None, None
    except NotARegularFile as exc:
        return None, f"the cache file {path} is {exc.kind}, not a regular file; {_REPLACED}", None
    except OSError as exc:  # ELOOP: a symbolic link
        return None, f"the cache file {path} cannot be opened safely ({exc.strerror})", None
    try:
        problem = untrusted(st, f"the cache file {path}")
        if problem is None and st.st_size > MAX_BYTES:
            problem = f"the cache file {path} is {st.st_size} bytes, more than any cache"
        if problem is None:
            data = _read_all(fd, MAX_BYTES)
            if len(data) <= MAX_BYTES:
                return data, None, None
            problem = f"the cache file {path} is more than {MAX_BYTES} bytes, more than any cache"
        return None, f"{problem}; {_REPLACED}", None
    finally:
        os.close(fd)


def save_private(
    directory: str, name: str, data: bytes, *, ours: bool
) -> tuple[str | None, str | None]:
    """Write the cache file (0600) in ``directory`` (made 0700): ``(why not, what was repaired)``.

    Raises OSError when the write itself fails.
    """
    if len(data) > MAX_BYTES:
        return f"the cache would be {len(data)} bytes, more than {MAX_BYTES}: not written", None
    fd, problem, repaired = _trusted_directory(directory, create=True, ours=ours)
    if fd is None:
        return problem, repaired
    try:
        replace_file(name, data, dir_fd=fd)
    finally:
        os.close(fd)
    return None, repaired


def remove_private(directory: str, name: str) -> None:
    """Remove the cache file, through a directory reached safely and owned by this user."""
    with contextlib.suppress(OSError):
        fd, _problem = _open_directory(directory, create=False)
        if fd is None:
            return
        try:
            if os.stat(fd).st_uid == _uid():
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)


def replace_file(path: str, data: bytes, *, dir_fd: int | None = None) -> None:
    """Atomically replace ``path`` with a private (0600) file holding ``data``. Raises OSError.

    The temporary file beside it has a random name, created with ``O_EXCL |
    O_NOFOLLOW``: nobody can plant it (or a link at it) in a shared directory. Its mode
    is set to 0600 on the descriptor, whatever the umask. ``path`` is relative to
    ``dir_fd`` when given. Whatever was at ``path`` (a link included) is replaced,
    never written into.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    for attempt in range(_TEMP_ATTEMPTS):
        # Unique even across hosts sharing a home directory.
        tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            if attempt == _TEMP_ATTEMPTS - 1:
                raise
            continue
        break
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), 0o600)  # a umask such as 0277 would leave it 0400
            fh.write(data)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
