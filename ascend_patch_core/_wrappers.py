"""The only code that ever sits on a patched call path: the runtime_check wrapper.

A patch without ``runtime_check`` installs the replacement object itself (zero
overhead). With one, a wrapper decides per call between the replacement and the
original. A generic ``*args, **kwargs`` closure costs ~130 ns per call over the
replacement, so when the replacement, the original and the check accept the same
parameters the wrapper is generated with that exact signature instead (plain
positional forwarding, no tuple/dict packing): ~55 ns (docs/benchmarks.md).

Generating one costs a ``compile``; a plugin's patches share a handful of
signature shapes, so the code is compiled once per shape (parameter names and
kinds), and each patch gets a function made of that code with globals of its own
(its check, replacement, original and counters) and its own default values. Globals,
not closure cells: a call reads them through the interpreter's cached global loads,
as fast as a hand-written wrapper. The shape of a Python function is read from its
code object; ``inspect.signature`` is asked only for other callables.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import keyword
import types
import weakref
from collections.abc import Callable
from typing import Any

from ._patch import shared_signature
from ._patch import signature_of
from ._report import CallCounters


__all__ = ["make_runtime_check_wrapper"]

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
    if type(replacement) is _FUNCTION and type(original) is _FUNCTION:
        found = _same_function_shape(replacement, original)
    else:
        found = _same_callable_shape(replacement, original)
    # The check must accept what the replacement receives (defaults filled in);
    # otherwise keep exact call-through semantics with the generic wrapper.
    if found is not None:
        shape = found[0]
        if shape.usable and (shape.accepts.get(id(check)) or _check_accepts(check, shape)):
            return _fixed_signature_wrapper(found, check, replacement, original, counters)
    wrapper = _generic_wrapper(check, replacement, original, counters)
    functools.update_wrapper(wrapper, replacement)
    wrapper.__ascend_patch_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _generic_wrapper(
    check: Callable[..., object],
    replacement: Callable[..., Any],
    original: Callable[..., Any],
    counters: CallCounters,
) -> Callable[..., Any]:
    tick_replacement = counters.replacements.__next__
    tick_fallback = counters.fallbacks.__next__

    def runtime_checked(*args: Any, **kwargs: Any) -> Any:
        try:
            use = check(*args, **kwargs)
        except Exception:
            use = False
        if use:
            tick_replacement()
            return replacement(*args, **kwargs)
        tick_fallback()
        return original(*args, **kwargs)

    return runtime_checked


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
        self.code: types.CodeType | None = None
        #: Whether a check can be called with this shape's arguments, by id(check);
        #: forgotten when the check is collected.
        self.accepts: dict[int, bool] = {}


#: Shapes by the key of a Python function (see _function_key) or by parameter list.
_shapes: dict[Any, _Shape] = {}


#: How many of *args and **kwargs the star flags of a code object say there are.
_STAR_COUNT = {0: 0, _VARARGS: 1, _VARKEYWORDS: 1, _STARS: 2}


def _function_key(func: types.FunctionType) -> tuple[Any, ...]:
    """A key equal for two functions exactly when their parameters (and default positions) are.

    Read from the code object in a few attribute loads: no ``inspect.signature``.
    """
    code = func.__code__
    stars = code.co_flags & _STARS
    named = code.co_argcount + code.co_kwonlyargcount + _STAR_COUNT[stars]
    defaults, kwdefaults = func.__defaults__, func.__kwdefaults__
    return (
        code.co_varnames[:named],
        code.co_argcount,
        code.co_posonlyargcount,
        stars,
        len(defaults) if defaults else 0,
        tuple(kwdefaults) if kwdefaults else (),
    )


def _function_shape(key: tuple[Any, ...], func: types.FunctionType) -> _Shape:
    shape = _shapes.get(key)
    if shape is None:
        code = func.__code__
        positional, posonly, kwonly = (
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
        )
        names = code.co_varnames
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
        shape = _shapes[key] = _Shape(tuple(params))
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
        return (
            _function_shape(_function_key(func), func),
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
_NO_KWDEFAULTS: dict[str, Any] = {}
#: (shape, positional defaults, keyword-only defaults) of a replacement.
_Found = tuple[_Shape, tuple[Any, ...], dict[str, Any]]


def _same_function_shape(
    replacement: types.FunctionType, original: types.FunctionType
) -> _Found | None:
    """The shape both functions have, with the replacement's defaults; None if they differ.

    Defaults are passed explicitly to whichever function runs, so both must have the
    very same ones (identical objects, or equal numbers, strings, bytes) or the fallback
    would change behaviour. The original is compared field by field against the
    replacement's key (no second key is built: this runs once per patch).
    """
    key = _function_key(replacement)
    names, argcount, posonly, stars, n_defaults, kw_names = key
    code = original.__code__
    theirs = original.__defaults__
    their_kw = original.__kwdefaults__
    if (
        code.co_argcount != argcount
        or code.co_posonlyargcount != posonly
        or code.co_flags & _STARS != stars
        or code.co_kwonlyargcount + argcount + _STAR_COUNT[stars] != len(names)
        or (len(theirs) if theirs else 0) != n_defaults
        or (tuple(their_kw) if their_kw else ()) != kw_names
        or code.co_varnames[: len(names)] != names
    ):
        return None
    defaults = replacement.__defaults__
    if defaults is not theirs and defaults:
        for a, b in zip(defaults, theirs or (), strict=True):  # same length: checked above
            if a is not b and not (type(a) is type(b) and type(a) in _SIMPLE and a == b):
                return None
    kwdefaults = replacement.__kwdefaults__
    if kwdefaults and not all(_same_default(v, their_kw[k]) for k, v in kwdefaults.items()):  # type: ignore[index]
        return None
    shape = _shapes.get(key) or _function_shape(key, replacement)
    return shape, defaults or (), kwdefaults or _NO_KWDEFAULTS


def _same_callable_shape(replacement: Any, original: Any) -> _Found | None:
    """The same for callables that are not plain functions (through inspect.signature)."""
    ours, other = _shape_of(replacement), _shape_of(original)
    if ours is None or other is None or ours[0] is not other[0]:
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


def _fixed_signature_wrapper(
    found: _Found,
    check: Callable[..., object],
    replacement: Callable[..., Any],
    original: Callable[..., Any],
    counters: CallCounters,
) -> Callable[..., Any]:
    """A ``runtime_checked`` with exactly the replacement's parameters and defaults."""
    shape, defaults, kwdefaults = found
    code = shape.code
    if code is None:
        code = shape.code = _compile(shape.parameters)
    module: str | None
    extra: dict[str, Any] | None
    if type(replacement) is _FUNCTION:
        module, name, qualname = (
            replacement.__module__,
            replacement.__name__,
            replacement.__qualname__,
        )
        doc, extra = replacement.__doc__, replacement.__dict__
    else:
        module = getattr(replacement, "__module__", None)
        name = getattr(replacement, "__name__", "runtime_checked")
        qualname = getattr(replacement, "__qualname__", name)
        doc, extra = getattr(replacement, "__doc__", None), getattr(replacement, "__dict__", None)
    namespace = {
        # A function's __module__ is its globals' __name__: the replacement's, as
        # functools.wraps would set it.
        "__name__": module,
        "__builtins__": builtins,
        "_ap_check": check,
        "_ap_replacement": replacement,
        "_ap_original": original,
        "_ap_tick_replacement": counters.replacements.__next__,
        "_ap_tick_fallback": counters.fallbacks.__next__,
    }
    wrapper = _FUNCTION(code, namespace, name, defaults or None)
    if kwdefaults:
        wrapper.__kwdefaults__ = dict(kwdefaults)
    # What functools.wraps copies, in fewer steps; and the original, for tools.
    wrapper.__qualname__, wrapper.__doc__ = qualname, doc
    wrapper.__dict__ = (
        {**extra, "__wrapped__": replacement, "__ascend_patch_original__": original}
        if extra
        else {"__wrapped__": replacement, "__ascend_patch_original__": original}
    )
    return wrapper


def _compile(parameters: _Parameters) -> types.CodeType:
    """The code of a ``runtime_checked`` taking exactly ``parameters`` (defaults come per patch)."""
    definition: list[str] = []
    call: list[str] = []
    seen_positional_only = False
    star_written = False
    for name, kind in parameters:
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
    args = ", ".join(call)
    source = (
        f"def runtime_checked({', '.join(definition)}):\n"
        f"    try:\n"
        f"        use = _ap_check({args})\n"
        f"    except Exception:\n"
        f"        use = False\n"
        f"    if use:\n"
        f"        _ap_tick_replacement()\n"
        f"        return _ap_replacement({args})\n"
        f"    _ap_tick_fallback()\n"
        f"    return _ap_original({args})\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<ascend-patch runtime_check>", "exec"), namespace)
    code: types.CodeType = namespace["runtime_checked"].__code__
    return code
