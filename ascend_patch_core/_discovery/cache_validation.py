"""What a metadata cache may say: every field checked, every answer tied to an installed distribution.

A cache that fails here is discarded and rebuilt (docs/security.md). Three checks:

* :func:`stream_problem` -- before ``marshal`` reads the bytes: they hold one object
  of the types the writer uses (mappings, lists, tuples, strings, integers, None,
  booleans) and every list or tuple announces no more items than bytes follow.
  ``marshal`` allocates an announced list before reading it, so 100 kB of ``[``
  bytes (each a list of 1.5 billion items, nested) cost it minutes; this walk is
  linear in the file's size and allocates nothing per announced item;
* :func:`shape_problem` -- every field has the type and form the writer gives it, so
  no malformed inner field can reach ``apply()``;
* :func:`binding_problem` -- every answer names the metadata directory (``*.dist-info``,
  ``*.egg-info``) it was read from: that directory must be one the fingerprint lists,
  exist now with the listed time, be the named distribution at the named version, and,
  for an entry point, declare it in its ``entry_points.txt``. A forged row cannot name
  a distribution that is not installed nor a module its distribution does not
  declare; a forged version cannot make a distribution installed.

Cheap on purpose (it runs on every cache hit): a ``stat`` per answer and a read of the
few plugin distributions' ``entry_points.txt``; importlib.metadata, which the cache
exists to avoid importing, is not used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from typing import TypeGuard

from .cache_file import MAX_BYTES
from .cache_file import open_regular
from .fingerprint import METADATA_SUFFIXES


__all__ = [
    "ROW_FIELDS",
    "binding_problem",
    "metadata_name",
    "normalize_name",
    "origin",
    "requirement_names",
    "shape_problem",
    "stream_problem",
]

#: name, value, group, distribution, version, sys.path entry, metadata directory name.
ROW_FIELDS = 7
# What a distribution name is made of (PEP 508); no regular expression: this module is
# imported by every ``import ascend_patch_core``.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


# -- the marshal stream ------------------------------------------------------------------

# What ``stream_problem`` does with each type byte (the FLAG_REF bit, 0x80, aside).
_BAD, _PLAIN, _STR1, _STR4, _INT, _LIST, _SMALL_TUPLE, _DICT, _LONG, _REF, _NULL = range(11)
_TYPE_ACTIONS = (
    (b"NFT", _PLAIN),  # None, False, True
    (b"zZ", _STR1),  # short ASCII strings: a 1-byte length
    (b"auAt", _STR4),  # other strings: a 4-byte length
    (b"i", _INT),
    (b"[(", _LIST),  # list, tuple: a 4-byte item count
    (b")", _SMALL_TUPLE),  # a 1-byte item count
    (b"{", _DICT),  # key, value, ... ended by '0'
    (b"l", _LONG),  # a 4-byte signed count of 2-byte digits
    (b"r", _REF),  # a 4-byte index of an earlier object
    (b"0", _NULL),  # the end of a mapping
)
_ACTIONS: bytes | None = None
#: No cache nests deeper than ~5 levels; marshal itself allows 2000.
_MAX_DEPTH = 32
#: The largest integer a cache holds is a time in nanoseconds (5 digits of 15 bits).
_MAX_LONG_DIGITS = 16
#: Objects in one cache: ~4 per installed distribution, ~15,000 for 3,000 of them. The
#: walk stops beyond this, so a file of one-byte objects costs no more than a scan.
_MAX_OBJECTS = 100_000


def _actions() -> bytes:
    global _ACTIONS
    if _ACTIONS is None:  # built on first use: import time is budgeted
        table = bytearray(256)
        for codes, action in _TYPE_ACTIONS:
            for code in codes:
                table[code] = table[code | 0x80] = action
        _ACTIONS = bytes(table)
    return _ACTIONS


def stream_problem(data: bytes) -> str | None:
    """Why ``data`` is not one marshalled object of the cache's types, or None.

    One pass over the bytes, without recursion; strings are skipped by their length.
    Each open list, tuple or mapping is one entry on a stack: the items it still
    needs (a mapping: -1 when a key or its end comes next, -2 for a value).
    """
    actions = _actions()
    from_bytes = int.from_bytes
    end = len(data)
    pos = refs = 0
    stack: list[int] = []
    left = 1  # items still needed by the innermost open container: the top level needs one
    budget = _MAX_OBJECTS
    while True:
        if left == 0:
            if not stack:
                break
            left = stack.pop()
            continue
        if pos >= end:
            return "the file ends inside an object"
        budget -= 1
        if budget < 0:
            return f"it holds more than {_MAX_OBJECTS} objects, more than any cache"
        code = data[pos]
        action = actions[code]
        pos += 1
        if code & 0x80:
            refs += 1
        if left > 0:
            left -= 1
        elif left == -1:
            if action == _NULL:
                left = 0
                continue
            left = -2
        else:
            left = -1
        if action == _STR1:
            if pos >= end:
                return "the file ends inside a string"
            pos += 1 + data[pos]
        elif action == _STR4:
            pos += 4 + from_bytes(data[pos : pos + 4], "little")
        elif action == _PLAIN:
            pass
        elif action == _INT:
            pos += 4
        elif action in (_LIST, _SMALL_TUPLE):
            if action == _LIST:
                count = from_bytes(data[pos : pos + 4], "little")
                pos += 4
            else:
                count = data[pos] if pos < end else 0
                pos += 1
            if count > end - pos:
                return (
                    f"a list at byte {pos - 5 if action == _LIST else pos - 2} announces {count} "
                    f"items, but only {max(end - pos, 0)} bytes follow"
                )
            if len(stack) >= _MAX_DEPTH:
                return f"it is malformed, nested deeper than {_MAX_DEPTH} levels"
            stack.append(left)
            left = count
        elif action == _DICT:
            if len(stack) >= _MAX_DEPTH:
                return f"it is malformed, nested deeper than {_MAX_DEPTH} levels"
            stack.append(left)
            left = -1
        elif action == _LONG:
            digits = from_bytes(data[pos : pos + 4], "little", signed=True)
            if not -_MAX_LONG_DIGITS <= digits <= _MAX_LONG_DIGITS:
                return f"an integer at byte {pos - 1} announces {abs(digits)} digits"
            pos += 4 + 2 * abs(digits)
        elif action == _REF:
            if from_bytes(data[pos : pos + 4], "little") >= refs:
                return f"a reference at byte {pos - 1} names no earlier object"
            pos += 4
        else:
            what = "the end of a mapping" if action == _NULL else f"type byte {code:#04x}"
            return f"it holds {what} at byte {pos - 1}, which no cache holds there"
    if pos > end:
        return "the file ends inside an object"
    if pos < end:
        return f"{end - pos} bytes follow the cache"
    return None


def normalize_name(name: str) -> str:
    """PEP 503: runs of ``-_.`` become one ``-``, lower case."""
    name = name.lower().replace("_", "-").replace(".", "-")
    while "--" in name:
        name = name.replace("--", "-")
    return name


def _str(value: object) -> bool:
    return isinstance(value, str)


def _opt_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def _seq(value: object, length: int | None = None) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(value, (list, tuple)) and (length is None or len(value) == length)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Listing names that stand for no directory entry: a zip or egg file on sys.path
#: (itself), and a directory that could not be read.
_SPECIAL_NAMES = frozenset({"", "-"})


def metadata_name(name: object) -> bool:
    """Whether ``name`` is a metadata directory's own name, inside its sys.path entry.

    One path component, nothing else: a name with a separator or ``..`` would let a
    forged listing point the binding at a directory outside sys.path, which then
    vouches for whatever entry point it declares.
    """
    return (
        isinstance(name, str)
        and name.endswith(METADATA_SUFFIXES)
        and name not in (".", "..")
        and os.sep not in name
        and (os.altsep is None or os.altsep not in name)
        and "\0" not in name
    )


def _listing_item(item: object) -> bool:
    return _seq(item, 2) and (item[0] in _SPECIAL_NAMES or metadata_name(item[0])) and _int(item[1])


def _paths_problem(paths: object) -> str | None:
    if not isinstance(paths, dict):
        return "paths is not a mapping"
    for entry, item in paths.items():
        if not (_str(entry) and _seq(item, 2)):
            return f"paths[{entry!r}] is malformed"
        stamp, listing = item
        if not (stamp is None or (_seq(stamp, 3) and all(map(_int, stamp)))):
            return f"paths[{entry!r}] has a malformed stamp"
        if not (_seq(listing) and all(map(_listing_item, listing))):
            return f"paths[{entry!r}] has a malformed listing"
    return None


def _row_problem(group: str, row: object) -> str | None:
    if not (_seq(row, ROW_FIELDS) and all(map(_str, row[:5])) and all(map(_opt_str, row[5:]))):
        return f"an entry point of {group!r} is malformed: {row!r:.200}"
    if row[2] != group:
        return f"entry point {row[0]!r} is filed under {group!r} but names group {row[2]!r}"
    return None


def shape_problem(data: Mapping[str, Any]) -> str | None:
    """Why ``data`` is not a well-formed cache, or None."""
    if not _str(data.get("fingerprint")):
        return "fingerprint is not a string"
    problem = _paths_problem(data.get("paths"))
    if problem:
        return problem
    for field in ("groups", "shadowed"):
        groups = data.get(field)
        if not isinstance(groups, dict):
            return f"{field} is not a mapping"
        for group, rows in groups.items():
            if not (_str(group) and _seq(rows)):
                return f"{field}[{group!r}] is malformed"
            for row in rows:
                problem = _row_problem(group, row)
                if problem:
                    return problem
    versions = data.get("versions")
    if not isinstance(versions, dict):
        return "versions is not a mapping"
    for key, found in versions.items():
        if not (
            _str(key)
            and (found is None or (_seq(found, 3) and _str(found[0]) and all(map(_opt_str, found))))
        ):
            return f"versions[{key!r}] is malformed: {found!r:.200}"
    requirements = data.get("requirements")
    if not isinstance(requirements, dict):
        return "requirements is not a mapping"
    for text, answer in requirements.items():
        if not (
            _str(text)
            and _seq(answer, 3)
            and isinstance(answer[0], bool)
            and _str(answer[1])
            and _seq(answer[2])
            and all(_seq(p, 2) and _str(p[0]) and _opt_str(p[1]) for p in answer[2])
        ):
            return f"requirements[{text!r}] is malformed: {answer!r:.200}"
    return None


# -- binding --------------------------------------------------------------------------


def _project(metadata_name: str) -> str:
    """'Torch_NPU-2.1.0.dist-info' -> 'torch-npu': the distribution a metadata directory is for.

    The rule importlib.metadata applies: the name is what precedes the first dash.
    """
    stem = metadata_name.rpartition(".")[0] if "." in metadata_name else metadata_name
    return normalize_name(stem.partition("-")[0])


def origin(path: object, entries: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``(sys.path entry, metadata directory name)`` of a distribution's metadata ``path``.

    ``entries`` maps each normalized sys.path entry to the entry as written. ``(None,
    None)`` when the distribution was not found in a sys.path directory (a zip file):
    such answers fail the binding check, so they are looked up again on every run.
    """
    if path is None or not hasattr(path, "parent") or not hasattr(path, "name"):
        return None, None
    entry = entries.get(os.path.normpath(str(path.parent) or "."))
    return (entry, str(path.name)) if entry is not None else (None, None)


def requirement_names(text: str) -> list[str]:
    """The normalized distribution names of a requirement's alternatives ("a>=1 | b")."""
    names = []
    for alternative in text.split("|"):
        head = alternative.lstrip()
        end = 0
        while end < len(head) and head[end] in _NAME_CHARS:
            end += 1
        if end and head[0].isalnum():
            names.append(normalize_name(head[:end]))
    return names


def _header_version(path: str) -> str | None:
    """The ``Version:`` header of a metadata directory (or single-file egg-info)."""
    candidates = (
        [os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO")]
        if os.path.isdir(path)
        else [path]
    )
    for candidate in candidates:
        try:
            fd, _ = open_regular(candidate)  # a FIFO named METADATA must not block apply()
            with open(fd, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if not line.strip():
                        return None  # end of the headers
                    if line.lower().startswith("version:"):
                        return line.partition(":")[2].strip()
        except OSError:
            continue
    return None


def _declares(text: str, group: str, name: str, value: str) -> bool:
    """Whether an ``entry_points.txt`` declares ``name = value`` in ``[group]``.

    importlib.metadata's reading of the format: sections, ``#`` comments, ``name =
    value`` split at the first ``=``, both sides stripped.
    """
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group:
            key, sep, found = line.partition("=")
            if sep and key.strip() == name and found.strip() == value:
                return True
    return False


class _Binder:
    """Checks answers against the metadata directories the fingerprint lists."""

    def __init__(self, paths: Mapping[str, Any]) -> None:
        self.paths = paths
        self.listings: dict[str, dict[str, int]] = {}
        self.checked: dict[tuple[str, str, str], str | None] = {}
        self.entry_points: dict[str, str] = {}

    def located(
        self, entry: str | None, name: str | None, project: str, version: str
    ) -> str | None:
        """Why ``project`` ``version`` is not what ``entry``/``name`` holds, or None."""
        if entry is None or name is None:
            return f"{project} is not tied to a metadata directory on sys.path"
        key = (entry, name, version)
        if key not in self.checked:
            self.checked[key] = self._located(entry, name, project, version)
        return self.checked[key]

    def _located(self, entry: str, name: str, project: str, version: str) -> str | None:
        if not metadata_name(name):
            return f"{name!r} is not the name of a metadata directory"
        listed = self.paths.get(entry)
        if listed is None:
            return f"{entry!r} is not on sys.path"
        listing = self.listings.get(entry)
        if listing is None:
            listing = self.listings[entry] = {n: m for n, m in listed[1]}
        path = os.path.join(entry or ".", name)
        if name not in listing:
            return f"{path} is not among the installed distributions"
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return f"{path} does not exist"
        if mtime != listing[name]:
            return f"{path} is not the one listed (modified since)"
        if _project(name) != normalize_name(project):
            return f"{path} is not {project}'s metadata"
        named = name.rpartition(".")[0].partition("-")[2] if name.endswith(".dist-info") else ""
        if named != version and _header_version(path) != version:
            return f"{path} is not {project} {version}"
        return None

    def declared(self, row: Any) -> str | None:
        name, value, group, distribution, version, entry, meta = row
        problem = self.located(entry, meta, distribution, version)
        if problem:
            return f"entry point {name!r} of {group!r}: {problem}"
        path = os.path.join(entry or ".", meta, "entry_points.txt")
        if path not in self.entry_points:
            try:
                fd, st = open_regular(path)
                with open(fd, encoding="utf-8", errors="replace") as fh:
                    # Bounded: a huge file declares nothing a plugin would.
                    self.entry_points[path] = fh.read(MAX_BYTES) if st.st_size <= MAX_BYTES else ""
            except OSError:
                self.entry_points[path] = ""
        if not _declares(self.entry_points[path], group, name, value):
            return f"{path} does not declare '{name} = {value}' in [{group}]"
        return None


def binding_problem(data: Mapping[str, Any], paths: Mapping[str, Any]) -> str | None:
    """Why an answer in ``data`` (well-formed) is not backed by what is installed, or None.

    ``paths`` is the fresh fingerprint's ``{entry: [stamp, listing]}``.
    """
    binder = _Binder(paths)
    for field in ("groups", "shadowed"):
        for rows in data[field].values():
            for row in rows:
                problem = binder.declared(row)
                if problem:
                    return problem
    versions = data["versions"]
    for key, found in versions.items():
        if found is not None:
            version, entry, name = found
            problem = binder.located(entry, name, key, version)
            if problem:
                return f"version of {key}: {problem}"
    for text, (satisfied, _, consulted) in data["requirements"].items():
        names = requirement_names(text)
        for key, version in consulted:
            found = versions.get(key, False)
            if key not in names or found is False or (found and found[0]) != version:
                return f"the answer to {text!r} does not follow from the cached versions"
        if satisfied and not any(v is not None for _, v in consulted) and ";" not in text:
            return (
                f"the answer to {text!r} says satisfied, but no distribution it names is installed"
            )
    return None
