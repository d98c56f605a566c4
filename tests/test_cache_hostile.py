"""A metadata cache file shaped by someone else: apply() and doctor neither block, crawl nor crash.

* A FIFO in place of the cache file blocked ``apply()`` and ``ascend-patch doctor``
  forever (it was opened without ``O_NONBLOCK`` before the regular-file check).
* 100 kB of ``[`` bytes made ``apply()`` run for minutes: marshal allocates every
  announced list (here 1.5 billion items, nested) before reading it. The bytes are
  now walked once before marshal sees them; a hostile cache costs what a missing one
  costs (compared as a ratio of whole processes, as users meet it).
* Fuzzed bytes -- random, mutated from a real cache, and built from marshal's own
  tokens -- never make the reader raise, and never make it wrong.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


BIN = Path(sys.executable).parent
APPLY_PROBE = """
import json
import ascend_patch_core
from ascend_patch_core._discovery.metadata import metadata
report = ascend_patch_core.apply()
print(json.dumps({
    "hit": metadata.hit, "rejected": metadata.rejected, "refused": metadata.refused,
    "plugins": sorted(r.name for r in report.records if r.kind == "plugin"),
}))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_PATCH_", "PYTHON"))}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


def _apply(tmp_path: Path, timeout: float = 120) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", APPLY_PROBE],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _cache_file(tmp_path: Path) -> Path:
    """The cache file's path, learned from a first run that writes it."""
    assert _apply(tmp_path)["hit"] is False
    [path] = (tmp_path / "cache").iterdir()
    return path


# ---------------------------------------------------------------------------- a FIFO


def test_a_fifo_in_place_of_the_cache_file_blocks_neither_apply_nor_doctor(
    tmp_path: Path,
) -> None:
    """apply() ends at once, saying the file is a FIFO, and replaces it with a real cache;
    doctor ends at once too and reports it (both used to wait for a writer forever)."""
    path = _cache_file(tmp_path)
    healthy = _apply(tmp_path)
    assert healthy["hit"] is True
    path.unlink()
    os.mkfifo(path, 0o600)

    result = _apply(tmp_path, timeout=60)

    assert result["hit"] is False and result["plugins"] == healthy["plugins"]
    assert "is a FIFO, not a regular file" in result["refused"], result
    assert stat.S_ISREG(path.lstat().st_mode)  # replaced by this run's cache
    assert _apply(tmp_path)["hit"] is True

    path.unlink()
    os.mkfifo(path, 0o600)
    done = subprocess.run(
        [str(BIN / "ascend-patch"), "doctor", "--json"],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = {f["code"]: f["message"] for f in json.loads(done.stdout)["findings"]}
    assert "is a FIFO, not a regular file" in findings["cache-refused"], findings
    assert stat.S_ISFIFO(path.lstat().st_mode)  # doctor looks, it does not rewrite


# ---------------------------------------------------------------------------- hostile bytes

_TIMED_APPLY = """
import sys, time
start = time.perf_counter()
import ascend_patch_core
ascend_patch_core.apply()
from ascend_patch_core._discovery.metadata import metadata
assert not metadata.hit, "a hostile cache was believed"
print(time.perf_counter() - start)
"""

#: Hostile files of ~100 kB: the issue's brackets, and files of valid marshal
#: grammar made of one-byte objects (the most work per byte for any reader).
HOSTILE = {
    "brackets": b"[" * 100_000,
    "tuples": b"(" * 100_000,
    "nested-one-item-lists": b"[\x01\x00\x00\x00" * 20_000 + b"N",
    "a-list-of-100k-nones": b"[" + (100_000).to_bytes(4, "little") + b"N" * 100_000,
    "a-mapping-of-50k-nones": b"{" + b"NN" * 50_000 + b"0",
    "announced-but-absent": b"{" + b"z\x0bfingerprint" + b"[\xff\xff\xff\x7f" * 1000,
}


def _timed(tmp_path: Path, path: Path, content: bytes | None) -> float:
    if content is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(content)
        path.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-c", _TIMED_APPLY],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # the brackets used to take minutes
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("content", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_cache_costs_what_a_missing_one_costs(tmp_path: Path, content: bytes) -> None:
    """import + apply() in a fresh process: with the hostile file in place of the cache it
    costs about what it costs with no cache at all (the best of three, interleaved)."""
    path = _cache_file(tmp_path)
    missing, hostile = [], []
    for _ in range(3):
        missing.append(_timed(tmp_path, path, None))
        hostile.append(_timed(tmp_path, path, content))
    assert min(hostile) <= 2.5 * min(missing), (hostile, missing)


def test_the_reason_names_what_is_wrong_and_the_cache_is_rebuilt(tmp_path: Path) -> None:
    path = _cache_file(tmp_path)
    path.write_bytes(b"[" * 100_000)

    result = _apply(tmp_path, timeout=120)

    assert result["hit"] is False
    announced = "a list at byte 0 announces 1532713819 items, but only 99995 bytes follow"
    assert announced in result["rejected"]
    assert _apply(tmp_path)["hit"] is True  # the run rewrote it


def test_a_file_larger_than_any_cache_is_not_read(tmp_path: Path) -> None:
    from ascend_patch_core._discovery.cache_file import MAX_BYTES

    path = _cache_file(tmp_path)
    path.write_bytes(b"N" * (MAX_BYTES + 1))

    result = _apply(tmp_path)

    assert result["hit"] is False and "more than any cache" in result["refused"]
    assert _apply(tmp_path)["hit"] is True


# ---------------------------------------------------------------------------- fuzzing

# Values of the types a cache holds, nested as deep as a cache nests them.
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.text(max_size=300)
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.lists(inner, max_size=6).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)

# marshal's own tokens, for streams that look right and announce what is not there.
_COUNTS = [
    (0).to_bytes(4, "little"),
    (1).to_bytes(4, "little"),
    (3).to_bytes(4, "little"),
    (0x7FFFFFFF).to_bytes(4, "little"),
    (0xFFFFFFFF).to_bytes(4, "little"),
    (0x5B5B5B5B).to_bytes(4, "little"),
]
_TOKENS = st.sampled_from(
    [
        *(b"[", b"(", b")", b"{", b"0", b"N", b"T", b"z\x02ab", b"\xfa\x01a", b"r", b"l", b"i"),
        *(b"\xdb", b"\xa8", b"u", b"a", b"<", b"c", b"g", b"\x01", b"\xff"),
        *_COUNTS,
    ]
)
_token_streams = st.lists(_TOKENS, max_size=60).map(b"".join)


@settings(max_examples=400, deadline=1000)
@given(st.one_of(st.binary(max_size=400), _token_streams))
def test_the_stream_check_is_quick_and_marshal_is_safe_after_it(data: bytes) -> None:
    """Any bytes: the check answers at once; bytes it accepts unmarshal without a huge
    allocation (at worst a ValueError/EOFError on a detail it leaves to marshal)."""
    from ascend_patch_core._discovery.cache_validation import stream_problem

    started = time.perf_counter()
    problem = stream_problem(data)
    assert time.perf_counter() - started < 0.5
    if problem is None:
        started = time.perf_counter()
        with contextlib.suppress(ValueError, EOFError, TypeError):
            marshal.loads(data)
        assert time.perf_counter() - started < 0.5


@settings(max_examples=300, deadline=None)
@given(_values)
def test_what_the_writer_writes_is_always_accepted(value: Any) -> None:
    """No false alarm: whatever marshal.dumps makes of the cache's types passes the check
    (shared objects and references included)."""
    from ascend_patch_core._discovery.cache_validation import stream_problem

    assert stream_problem(marshal.dumps(value)) is None
    assert stream_problem(marshal.dumps([value, value, {"k": value}])) is None


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, Any]:
    """A real cache file of this interpreter, and the answers of a fresh scan."""
    from ascend_patch_core._discovery.metadata import MetadataCache

    directory = tmp_path_factory.mktemp("fuzzed-cache")
    old = os.environ.get("ASCEND_PATCH_CACHE_DIR")
    os.environ["ASCEND_PATCH_CACHE_DIR"] = str(directory)
    try:
        cache = MetadataCache()
        answers = (cache.entry_points("ascend_patch"), cache.version("pluggy"))
        cache.save()
    finally:
        if old is None:
            del os.environ["ASCEND_PATCH_CACHE_DIR"]
        else:
            os.environ["ASCEND_PATCH_CACHE_DIR"] = old
    [path] = directory.iterdir()
    return path, path.read_bytes(), answers


@st.composite
def _mutated(draw: st.DrawFn, original: bytes) -> bytes:
    data = bytearray(original)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        where = draw(st.integers(min_value=0, max_value=len(data)))
        what = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if what == "flip" and where < len(data):
            data[where] = draw(st.integers(min_value=0, max_value=255))
        elif what == "insert":
            data[where:where] = draw(st.sampled_from([b"[", b"\xff\xff\xff\x7f", b"0", b"N"]))
        elif what == "delete":
            del data[where : where + draw(st.integers(min_value=1, max_value=8))]
        else:
            del data[where:]
    return bytes(data)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_a_fuzzed_cache_never_crashes_the_reader_nor_changes_its_answers(
    real_cache: tuple[Path, bytes, Any], monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    """Random bytes, or a real cache with a few bytes changed: loading never raises, and the
    answers are those of a fresh scan (a damaged cache is discarded, never believed)."""
    from ascend_patch_core._discovery.metadata import MetadataCache

    path, original, answers = real_cache
    content = data.draw(st.one_of(st.binary(max_size=2000), _mutated(original), _token_streams))
    monkeypatch.setenv("ASCEND_PATCH_CACHE_DIR", str(path.parent))
    path.write_bytes(content)
    path.chmod(0o600)

    cache = MetadataCache()
    found = (cache.entry_points("ascend_patch"), cache.version("pluggy"))

    assert found == answers
