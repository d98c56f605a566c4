"""The runtime_check wrapper chooses its code on its first call (see ascend_patch_core/_install/wrappers.py).

apply() makes every wrapper the same cheap way; the first call reads the parameters
and picks the exact-signature code or the generic one. These tests pin what that
must not change: call results and counts from the very first call, the signature a
called wrapper has, no reference cycle left behind, and concurrent first calls.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any

import pytest

from ascend_patch_core._install.wrappers import _GENERIC_CODE
from ascend_patch_core._install.wrappers import make_runtime_check_wrapper
from ascend_patch_core._model.report import CallCounters


def original(x, y=1, *, scale=2):  # type: ignore[no-untyped-def]
    return ("original", x, y, scale)


def replacement(x, y=1, *, scale=2):  # type: ignore[no-untyped-def]
    return ("replacement", x, y, scale)


def positive(x, y=1, *, scale=2):  # type: ignore[no-untyped-def]
    return x > 0


def wrap(check: Any = positive, new: Any = replacement, old: Any = original) -> Any:
    counters = CallCounters()
    return make_runtime_check_wrapper(check, new, old, counters), counters


def test_first_call_routes_and_counts_like_every_later_call() -> None:
    wrapper, counters = wrap()
    assert wrapper(1) == ("replacement", 1, 1, 2)  # the first call (generic code)
    assert wrapper(-1, 5, scale=3) == ("original", -1, 5, 3)
    assert wrapper(x=4) == ("replacement", 4, 1, 2)
    assert (counters.replacement_calls, counters.fallback_calls) == (2, 1)


def test_a_called_wrapper_has_the_exact_signature_and_keeps_it() -> None:
    wrapper, _ = wrap()
    wrapper(1)
    assert inspect.signature(wrapper, follow_wrapped=False) == inspect.signature(original)
    code = wrapper.__code__
    wrapper(2)
    assert wrapper.__code__ is code
    with pytest.raises(TypeError, match="replacement"):  # named like the replacement
        wrapper(1, 2, 3)


def test_mismatched_parameters_keep_the_generic_code() -> None:
    def other_defaults(x, y=7, *, scale=2):  # type: ignore[no-untyped-def]
        return ("other", x, y, scale)

    wrapper, _ = wrap(new=other_defaults)
    assert wrapper(1) == ("other", 1, 7, 2)  # its own default, not the original's
    assert wrapper(-1) == ("original", -1, 1, 2)
    assert wrapper.__code__ is _GENERIC_CODE


def test_a_check_that_cannot_take_the_arguments_keeps_the_generic_code() -> None:
    wrapper, _ = wrap(check=lambda x: x > 0)
    assert wrapper(1) == ("replacement", 1, 1, 2)
    assert wrapper.__code__ is _GENERIC_CODE


def test_callables_inspect_cannot_read_keep_the_generic_code() -> None:
    class Opaque:
        @property
        def __signature__(self) -> Any:
            raise RuntimeError("no signature here")

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return ("opaque", args, kwargs)

    wrapper, _ = wrap(new=Opaque())
    assert wrapper(1) == ("opaque", (1,), {})
    assert wrapper.__code__ is _GENERIC_CODE


def test_parameters_named_like_builtins_the_wrapper_uses() -> None:
    def old(next, Exception=None):  # type: ignore[no-untyped-def]
        return ("old", next, Exception)

    def new(next, Exception=None):  # type: ignore[no-untyped-def]
        return ("new", next, Exception)

    wrapper, _ = wrap(check=lambda next, Exception=None: next > 0, new=new, old=old)
    for _ in range(2):  # first (generic) and exact-signature code
        assert wrapper(1) == ("new", 1, None)
        assert wrapper(next=-1, Exception=3) == ("old", -1, 3)
    assert wrapper.__code__ is not _GENERIC_CODE


def test_no_reference_cycle_is_left_once_called() -> None:
    wrapper, _ = wrap()
    wrapper(1)
    alive = weakref.ref(wrapper)
    del wrapper
    assert alive() is None, "a called wrapper is freed by reference counting alone"


def test_concurrent_first_calls_all_route_correctly() -> None:
    for _ in range(20):
        wrapper, counters = wrap()
        barrier = threading.Barrier(8)
        results: list[Any] = []

        def call(
            x: int, wrapper: Any = wrapper, barrier: Any = barrier, results: Any = results
        ) -> None:
            barrier.wait()
            results.append(wrapper(x))

        threads = [threading.Thread(target=call, args=(x,)) for x in range(-4, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == sorted(
            ("replacement" if x > 0 else "original", x, 1, 2) for x in range(-4, 4)
        )
        assert counters.replacement_calls + counters.fallback_calls == 8
        assert inspect.signature(wrapper, follow_wrapped=False) == inspect.signature(original)


def test_metadata_is_the_replacements_before_and_after_the_first_call() -> None:
    @functools.wraps(replacement)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        return replacement(*args, **kwargs)

    decorated.marker = "kept"  # type: ignore[attr-defined]
    wrapper, _ = wrap(new=decorated)
    for _ in range(2):
        assert (wrapper.__name__, wrapper.__qualname__, wrapper.__module__) == (
            "replacement",
            "replacement",
            __name__,
        )
        assert wrapper.__wrapped__ is decorated
        assert wrapper.__ascend_patch_original__ is original
        assert wrapper.marker == "kept"
        wrapper(1)
