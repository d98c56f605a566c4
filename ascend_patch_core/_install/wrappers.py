"""The only code that ever sits on a patched call path: the runtime_check wrapper.

A patch without ``runtime_check`` installs the replacement object itself (zero
overhead). With one, a wrapper decides per call between the replacement and the
original. A generic ``*args, **kwargs`` wrapper costs ~130 ns per call over the
replacement, so when the replacement, the original and the check accept the same
parameters the wrapper takes exactly those parameters instead (plain positional
forwarding, no tuple/dict packing): ~55 ns (docs/benchmarks.md).

Finding that out means reading both functions' parameters and defaults, and the
check's signature. apply() installs hundreds of patches and most of them are never
called in a given program, so that work is done on a wrapper's first call, not at
apply(): apply() makes the wrapper from a factory compiled once (one call: five
closure cells and a function), and its first call chooses the code it keeps -- the
exact-signature code of its shape, or the generic one -- by assigning ``__code__``.
Every wrapper code is built from one template and so has the same closure layout,
which is what makes the assignment valid; the exact-signature code is compiled once
per shape (parameter names and kinds) and shared by every wrapper of that shape,
each with its own default values. The first call itself runs the generic way.
Assigning ``__code__`` is atomic under the GIL; a thread already inside the first
code finishes the generic way, which behaves the same.
"""

from __future__ import annotations

import builtins
import inspect
import keyword
import types
import weakref
from collections.abc import Callable
from typing import Any

from .._model.patch import shared_signature
from .._model.patch import signature_of
from .._model.report import CallCounters


__all__ = ["make_runtime_check_wrapper", "retarget"]

_P = inspect.Parameter
_FUNCTION = types.FunctionType
_VARARGS = inspect.CO_VARARGS
_VARKEYWORDS = inspect.CO_VARKEYWORDS


def make_runtime_check_wrapper(
    check: Callable[..., object],
    replacement: Callable[..., Any],
    original: Callable[..., Any],
    counters: CallCounters,
) -> Callable[..., Any]:
    """Return a function calling ``replacement`` when ``check(*args)`` is truthy, else ``original``.

    A check that raises counts as False: the original runs, and the replacement's own
    exceptions propagate unchanged.
    """
    wrapper: types.FunctionType = _make_first(
        check, replacement, original, counters.replacements, counters.fallbacks
    )
    extra: dict[str, Any] | None
    # What functools.wraps copies, in fewer steps; and the original, for tools.
    if type(replacement) is _FUNCTION:
        wrapper.__module__, wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = (
            replacement.__module__,
            replacement.__name__,
            replacement.__qualname__,
            replacement.__doc__,
        )
        extra = replacement.__dict__
    else:
        # None where the replacement has no module, as functools.wraps would leave it.
        wrapper.__module__ = getattr(replacement, "__module__", None)  # type: ignore[assignment]
        wrapper.__name__ = getattr(replacement, "__name__", "runtime_checked")
        wrapper.__qualname__ = getattr(replacement, "__qualname__", wrapper.__name__)
        wrapper.__doc__ = getattr(replacement, "__doc__", None)
        extra = getattr(replacement, "__dict__", None)
    wrapper.__dict__ = (
        {**extra, "__wrapped__": replacement, "__ascend_patch_original__": original}
        if extra
        else {"__wrapped__": replacement, "__ascend_patch_original__": original}
    )
    return wrapper


def retarget(wrapper: Any, original: Callable[..., Any]) -> bool:
    """Make a runtime_check wrapper fall back to ``original`` from now on, in place.

    For a patch whose original was another patch, reverted since (docs/core.md,
    "Reverting"): the wrapper stays the object in the slot and in every module that
    imported it. It runs the generic code until its next call chooses again: the
    exact-signature code was chosen for the old original's parameters and defaults.
    False when ``wrapper`` is not one of ours.
    """
    closure = getattr(wrapper, "__closure__", None)
    if (
        type(wrapper) is not _FUNCTION
        or wrapper.__code__.co_freevars != _FREEVARS
        or closure is None
        or "__ascend_patch_original__" not in wrapper.__dict__
    ):
        return False
    cells = dict(zip(_FREEVARS, closure, strict=True))
    wrapper.__code__ = _GENERIC_CODE  # ignores the defaults: they can go next
    wrapper.__defaults__ = wrapper.__kwdefaults__ = None
    cells["_ap_original"].cell_contents = original
    wrapper.__dict__["__ascend_patch_original__"] = original
    cells["_ap_self"].cell_contents = wrapper
    wrapper.__code__ = _FIRST_CODE
    return True


def _specialize(
    wrapper: types.FunctionType,
    check: Callable[..., object],
    replacement: Callable[..., Any],
    original: Callable[..., Any],
) -> None:
    """Give ``wrapper`` the code it keeps: its shape's exact-signature code, or the generic one.

    Runs on the wrapper's first call, in the patched program: it must not raise.
    """
    code = _GENERIC_CODE
    try:
        found = _same_shape(replacement, original)
        # The check must accept what the replacement receives (defaults filled in);
        # otherwise keep exact call-through semantics with the generic code.
        if found is not None:
            shape, defaults, kwdefaults = found
            if shape.usable and _check_accepts(check, shape):
                code = shape.code or _compile(shape)
                # Defaults first: the generic code running meanwhile ignores them.
                wrapper.__defaults__ = defaults or None
                wrapper.__kwdefaults__ = dict(kwdefaults) if kwdefaults else None
    except Exception:  # an odd callable inspect cannot read: stay generic
        code = _GENERIC_CODE
    wrapper.__code__ = code


# ----------------------------------------------------------------------------- shapes

#: A parameter list: (name, kind) pairs, in order.
_Parameters = tuple[tuple[str, Any], ...]
_STARS = _VARARGS | _VARKEYWORDS


class _Shape:
    """What is known about one signature shape: its parameters and, once asked, its code."""

    __slots__ = ("accepts", "code", "parameters", "usable")

    def __init__(self, parameters: _Parameters) -> None:
        self.parameters = parameters
        # Names the generated code could not use as parameters.
        self.usable = not any(keyword.iskeyword(n) or n.startswith("_ap_") for n, _ in parameters)
        #: The code of a runtime_checked taking exactly these parameters (compiled
        #: when first needed; its closure has the layout of every wrapper's).
        self.code: types.CodeType | None = None
        #: Whether a check can be called with this shape's arguments, by id(check);
        #: forgotten when the check is collected.
        self.accepts: dict[int, bool] = {}


#: Shapes by the key of a Python function (see _function_key) or by parameter list.
_shapes: dict[Any, _Shape] = {}


#: How many of *args and **kwargs the star flags of a code object say there are.
_STAR_COUNT = {0: 0, _VARARGS: 1, _VARKEYWORDS: 1, _STARS: 2}


def _function_key(code: types.CodeType) -> tuple[tuple[str, ...], int]:
    """A key equal for two functions exactly when their parameters are: (names, counts).

    Read from the code object: these are the parameters the function really takes
    (``inspect.signature`` follows ``__wrapped__`` to another function's). The
    counts are packed into one int (argument count, positional-only count, star flags);
    the keyword-only count follows from the number of names. ``co_varnames`` is built
    anew on every read (Python 3.11+): read once.
    """
    argcount, kwonly, flags = code.co_argcount, code.co_kwonlyargcount, code.co_flags & _STARS
    names = code.co_varnames
    named = argcount + kwonly + _STAR_COUNT[flags] if flags or kwonly else argcount
    if len(names) != named:  # other locals follow the parameters
        names = names[:named]
    return names, argcount | code.co_posonlyargcount << 24 | flags << 48


def _function_shape(key: tuple[tuple[str, ...], int], code: types.CodeType) -> _Shape:
    shape = _shapes.get(key)
    if shape is None:
        positional, posonly, kwonly = (
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
        )
        names = key[0]
        params: list[tuple[str, Any]] = [
            (names[i], _P.POSITIONAL_ONLY if i < posonly else _P.POSITIONAL_OR_KEYWORD)
            for i in range(positional)
        ]
        index = positional + kwonly
        if code.co_flags & _VARARGS:
            params.append((names[index], _P.VAR_POSITIONAL))
            index += 1
        params.extend((name, _P.KEYWORD_ONLY) for name in names[positional : positional + kwonly])
        if code.co_flags & _VARKEYWORDS:
            params.append((names[index], _P.VAR_KEYWORD))
        parameters = tuple(params)
        # One shape per parameter list, whether found from code or from a signature.
        shape = _shapes.get(parameters)
        if shape is None:
            shape = _shapes[parameters] = _Shape(parameters)
        _shapes[key] = shape
    return shape


def _signature_shape(func: Any) -> tuple[_Shape, tuple[Any, ...], dict[str, Any]] | None:
    """(shape, positional defaults, keyword-only defaults) of any callable (slow: inspect)."""
    signature = signature_of(func)
    if signature is None:
        return None
    params: list[tuple[str, Any]] = []
    defaults: list[Any] = []
    kwdefaults: dict[str, Any] = {}
    for p in signature.parameters.values():
        params.append((p.name, p.kind))
        if p.default is not _P.empty:
            if p.kind is _P.KEYWORD_ONLY:
                kwdefaults[p.name] = p.default
            else:
                defaults.append(p.default)
    key = tuple(params)
    shape = _shapes.get(key)
    if shape is None:
        shape = _shapes[key] = _Shape(key)
    return shape, tuple(defaults), kwdefaults


def _shape_of(func: Any) -> tuple[_Shape, tuple[Any, ...], dict[str, Any]] | None:
    if type(func) is types.FunctionType:
        code = func.__code__
        return (
            _function_shape(_function_key(code), code),
            func.__defaults__ or (),
            func.__kwdefaults__ or {},
        )
    return _signature_shape(func)


def _same_default(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and type(a) in _SIMPLE and a == b)


def _check_accepts(check: Callable[..., object], shape: _Shape) -> bool:
    """Whether ``check`` can be called with what a function of ``shape`` receives (cached)."""
    known = shape.accepts.get(id(check))
    if known is not None:
        return known
    signature = shared_signature(check)
    accepted = signature is not None
    if accepted:
        params = shape.parameters
        args = [
            object() for _, kind in params if kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
        ]
        kwargs = {name: object() for name, kind in params if kind is _P.KEYWORD_ONLY}
        try:
            signature.bind(*args, **kwargs)  # type: ignore[union-attr]
        except TypeError:
            accepted = False
    try:
        weakref.finalize(check, shape.accepts.pop, id(check), None)
    except TypeError:  # not weakly referenceable (a builtin): not cached
        return accepted
    shape.accepts[id(check)] = accepted
    return accepted


_SIMPLE = (int, float, str, bool, bytes)
#: (shape, positional defaults, keyword-only defaults) of a replacement.
_Found = tuple[_Shape, tuple[Any, ...], dict[str, Any]]


def _same_shape(replacement: Any, original: Any) -> _Found | None:
    """The shape both callables have, with the replacement's defaults; None if they differ.

    Defaults are passed explicitly to whichever function runs, so both must have the
    very same ones (identical objects, or equal numbers, strings, bytes) or the fallback
    would change behaviour.
    """
    ours, other = _shape_of(replacement), _shape_of(original)
    if ours is None or other is None or ours[0] is not other[0]:  # one shape per parameter list
        return None
    _, defaults, kwdefaults = ours
    theirs, their_kw = other[1], other[2]
    if len(defaults) != len(theirs) or kwdefaults.keys() != their_kw.keys():
        return None
    if not all(map(_same_default, defaults, theirs)):
        return None
    if not all(_same_default(v, their_kw[k]) for k, v in kwdefaults.items()):
        return None
    return ours


def _compile(shape: _Shape) -> types.CodeType:
    """The exact-signature code of ``shape`` (defaults come per wrapper)."""
    definition: list[str] = []
    call: list[str] = []
    seen_positional_only = False
    star_written = False
    for name, kind in shape.parameters:
        if kind is _P.POSITIONAL_ONLY:
            definition.append(name)
            call.append(name)
            seen_positional_only = True
            continue
        if seen_positional_only:
            definition.append("/")
            seen_positional_only = False
        if kind is _P.POSITIONAL_OR_KEYWORD:
            definition.append(name)
            call.append(name)
        elif kind is _P.VAR_POSITIONAL:
            definition.append("*" + name)
            call.append("*" + name)
            star_written = True
        elif kind is _P.KEYWORD_ONLY:
            if not star_written:
                definition.append("*")
                star_written = True
            definition.append(name)
            call.append(f"{name}={name}")
        else:  # VAR_KEYWORD
            definition.append("**" + name)
            call.append("**" + name)
    if seen_positional_only:
        definition.append("/")
    code = _wrapper_code(", ".join(definition), ", ".join(call))
    shape.code = code
    return code


# One template for every wrapper code, so that all have the same closure layout (the
# free variables, sorted by name) and ``__code__`` can be assigned between them. The
# exact-signature and generic codes name ``_ap_self`` once, unreachable, for that
# reason alone; the first-call code uses it to find its own function, then clears it
# (no reference cycle is left once a wrapper was called). Builtins are reached under
# reserved names: a parameter may be called ``next`` or ``Exception``.
_TEMPLATE = """\
def make(_ap_check, _ap_replacement, _ap_original, _ap_replacements, _ap_fallbacks):
    _ap_self = None

    def runtime_checked({definition}):
{prologue}\
        try:
            use = _ap_check({call})
        except _ap_Exception:
            use = False
        if use:
            _ap_next(_ap_replacements)
            return _ap_replacement({call})
        _ap_next(_ap_fallbacks)
        return _ap_original({call})
        _ap_self  # unreachable: keeps the closure layout

    _ap_self = runtime_checked
    return runtime_checked
"""

_FIRST_CALL = """\
        nonlocal _ap_self
        _ap_wrapper, _ap_self = _ap_self, None
        if _ap_wrapper is not None:
            _ap_specialize(_ap_wrapper, _ap_check, _ap_replacement, _ap_original)
"""

_NAMESPACE: dict[str, Any] = {
    "__name__": __name__,
    "_ap_next": builtins.next,
    "_ap_Exception": Exception,
    "_ap_specialize": _specialize,
}


#: Arguments for making a wrapper only to read its code.
_DUMMIES = (None,) * 5


def _factory(definition: str, call: str, prologue: str = "") -> Callable[..., Any]:
    source = _TEMPLATE.format(definition=definition, call=call, prologue=prologue)
    namespace = dict(_NAMESPACE)
    exec(compile(source, "<ascend-patch runtime_check>", "exec"), namespace)
    make: Callable[..., Any] = namespace["make"]
    return make


def _wrapper_code(definition: str, call: str) -> types.CodeType:
    code: types.CodeType = _factory(definition, call)(*_DUMMIES).__code__
    if code.co_freevars != _FREEVARS:  # pragma: no cover - a template edit gone wrong
        raise AssertionError(f"closure layout {code.co_freevars} != {_FREEVARS}")
    return code


#: make(check, replacement, original, replacement counter, fallback counter): a wrapper
#: whose first call specializes it. Runs at apply(), once per runtime_check patch.
_make_first = _factory("*args, **kwargs", "*args, **kwargs", _FIRST_CALL)
_FREEVARS: tuple[str, ...] = _make_first(*_DUMMIES).__code__.co_freevars
_GENERIC_CODE = _wrapper_code("*args, **kwargs", "*args, **kwargs")
_FIRST_CODE: types.CodeType = _make_first(*_DUMMIES).__code__
