"""Building the object a patch installs: resolve, wrap, add the runtime check.

Order, as documented on :class:`~ascend_patch_core.AtomicPatch`: a dotted-string
replacement is imported; without one, ``target_wrapper(original)`` makes it;
``replacement_wrapper`` wraps the result; a ``runtime_check`` puts the per-call
choice between replacement and original around it last.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from .._model.errors import PatchError
from .._model.errors import SkipPatch
from .._model.patch import AtomicPatch
from .._model.report import CallCounters
from .._model.report import Record
from .entries import Skip
from .target import ABSENT
from .target import adapt_to_descriptor
from .target import inner_callable
from .target import resolve_string


__all__ = [
    "DESCRIPTORS",
    "build_replacement",
    "counter",
    "may_be_lazy",
    "replacement_for",
    "wrapper_maker",
]

#: Class attributes whose function is inside (the replacement goes back in the same kind).
DESCRIPTORS = (staticmethod, classmethod, property)


def replacement_for(
    patch: AtomicPatch, original_raw: Any, in_class: bool, record: Record, count_calls: bool
) -> tuple[Any, Any, Any, Any]:
    """``(original, replacement, new_inner, new_raw)`` for a slot holding ``original_raw``.

    Runs the precheck, builds the replacement (counted when ``count_calls`` and it has
    no runtime_check) and, for a class attribute, wraps it as the original was
    (``new_raw``, what goes in the slot). Raises :class:`Skip` or :class:`PatchError`.
    """
    original = inner_callable(original_raw) if type(original_raw) in DESCRIPTORS else original_raw
    if original is ABSENT:  # a slot that create=True will make
        original = None
    if patch.precheck is not None:
        _run_precheck(patch, original)
    if patch.plain:  # an object to install as it is: nothing to build
        replacement = new_inner = patch.replacement
    else:
        replacement, new_inner = build_replacement(patch, original, record.counters)
    if count_calls and patch.runtime_check is None:
        new_inner = counter()(new_inner, record)
    new_raw = adapt_to_descriptor(original_raw, new_inner) if in_class else new_inner
    return original, replacement, new_inner, new_raw


def _run_precheck(patch: AtomicPatch, original: Any) -> None:
    try:
        ok = patch.call_precheck(original)
    except SkipPatch as skip:
        raise Skip(str(skip) or "precheck skipped the patch") from skip
    except (Exception, SystemExit) as exc:  # a plugin's sys.exit() fails its patch only
        raise PatchError(f"precheck raised {type(exc).__name__}: {exc}") from exc
    if not ok:
        raise Skip("precheck returned False")


def counter() -> Callable[[Any, Any], Any]:
    """``counted`` (loaded when counting is on: off, the installer never needs it)."""
    from .counting import counted

    return counted


def build_replacement(
    patch: AtomicPatch, original: Any, counters: CallCounters | None
) -> tuple[Any, Any]:
    """Return (replacement, installed): the resolved replacement and what goes in the slot.

    ``installed`` is the replacement itself, or its runtime_check wrapper. Raises
    :class:`Skip` when the patch cannot apply here and :class:`PatchError` when it is broken.
    """
    replacement = patch.replacement
    if isinstance(replacement, str):
        try:
            replacement = resolve_string(replacement)
        except ModuleNotFoundError as exc:
            # Its library is not installed here: not applicable, like an absent target.
            if patch.target_wrapper is None:
                raise Skip(f"replacement {patch.replacement!r} is not importable: {exc}") from exc
            replacement = None
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit() fails its patch only
            # The module imports but the name is not in it (or its import raised): the
            # declaration is wrong for the code installed, a defect -- FAILED, not SKIPPED.
            raise PatchError(
                f"replacement {patch.replacement!r} cannot be resolved: {type(exc).__name__}: {exc}"
            ) from exc
    if replacement is None:
        if patch.target_wrapper is None:
            raise PatchError("no replacement")
        if original is None:
            raise Skip("target_wrapper has no original to wrap (the target is None)")
        try:
            replacement = patch.target_wrapper(original)
        except (Exception, SystemExit) as exc:
            raise PatchError(f"target_wrapper raised {type(exc).__name__}: {exc}") from exc
    if patch.replacement_wrapper is not None:
        try:
            replacement = patch.replacement_wrapper(replacement)
        except (Exception, SystemExit) as exc:
            raise PatchError(f"replacement_wrapper raised {type(exc).__name__}: {exc}") from exc
    if patch.runtime_check is None:
        return replacement, replacement
    descriptor = type(replacement) if isinstance(replacement, (staticmethod, classmethod)) else None
    function = inner_callable(replacement) if descriptor else replacement
    if not callable(function) or not callable(original):
        raise PatchError("runtime_check needs a callable replacement and a callable original")
    assert counters is not None
    wrapper = wrapper_maker()(patch.runtime_check, function, original, counters)
    return replacement, (descriptor(wrapper) if descriptor is not None else wrapper)


def wrapper_maker() -> Callable[..., Any]:
    """``make_runtime_check_wrapper``: its module loads on first use, not with every apply()."""
    from .wrappers import make_runtime_check_wrapper

    return make_runtime_check_wrapper


def may_be_lazy(inner: Any) -> bool:
    """Whether ``inner`` is a with_imports trampoline (a function with a marker in its __dict__).

    Seen through a staticmethod or classmethod; anything else (a class, a constant, a
    builtin) is not one.
    """
    if type(inner) in (staticmethod, classmethod):
        inner = inner.__func__
    return type(inner) is types.FunctionType and "__ascend_patch_with_imports__" in inner.__dict__
