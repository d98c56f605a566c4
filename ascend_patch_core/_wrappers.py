"""The only code that ever sits on a patched call path: the runtime_check wrapper.

A patch without ``runtime_check`` installs the replacement object itself (zero
overhead). With one, a wrapper decides per call between the replacement and the
original. A generic ``*args, **kwargs`` closure costs ~240 ns per call on the
reference machine, so when the replacement, the original and the check accept the
same parameters the wrapper is generated with that exact signature instead (plain
positional forwarding, no tuple/dict packing) -- see docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import inspect
import keyword
from collections.abc import Callable
from typing import Any

from ._patch import shared_signature
from ._patch import signature_of
from ._report import CallCounters


__all__ = ["make_runtime_check_wrapper"]

_P = inspect.Parameter


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
    wrapper = _fixed_signature_wrapper(check, replacement, original, counters)
    if wrapper is None:
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
    tick_replacement = counters.replacement_tick
    tick_fallback = counters.fallback_tick

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


def _same_parameters(a: inspect.Signature, b: inspect.Signature) -> bool:
    pa, pb = list(a.parameters.values()), list(b.parameters.values())
    if len(pa) != len(pb):
        return False
    for x, y in zip(pa, pb, strict=True):
        if x.name != y.name or x.kind != y.kind:
            return False
        # Defaults are passed explicitly to whichever function runs, so both must
        # have the very same default or the fallback would change behaviour.
        if x.default is not y.default and not (
            type(x.default) is type(y.default)
            and type(x.default) in (int, float, str, bool, bytes)
            and x.default == y.default
        ):
            return False
    return True


def _fixed_signature_wrapper(
    check: Callable[..., object],
    replacement: Callable[..., Any],
    original: Callable[..., Any],
    counters: CallCounters,
) -> Callable[..., Any] | None:
    sig_r, sig_o, sig_c = signature_of(replacement), signature_of(original), shared_signature(check)
    if sig_r is None or sig_o is None or sig_c is None or not _same_parameters(sig_r, sig_o):
        return None
    params = list(sig_r.parameters.values())
    if any(keyword.iskeyword(p.name) or p.name.startswith("_ap_") for p in params):
        return None
    # The check must accept what the replacement receives (defaults filled in);
    # otherwise keep exact call-through semantics with the generic wrapper.
    probe_args = [
        object() for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
    ]
    probe_kwargs = {p.name: object() for p in params if p.kind is _P.KEYWORD_ONLY}
    try:
        sig_c.bind(*probe_args, **probe_kwargs)
    except TypeError:
        return None

    namespace: dict[str, Any] = {
        "_ap_check": check,
        "_ap_replacement": replacement,
        "_ap_original": original,
        "_ap_tick_replacement": counters.replacement_tick,
        "_ap_tick_fallback": counters.fallback_tick,
    }
    definition: list[str] = []
    call: list[str] = []
    seen_positional_only = False
    star_written = False
    for index, p in enumerate(params):
        default = ""
        if p.default is not _P.empty:
            namespace[f"_ap_d{index}"] = p.default
            default = f"=_ap_d{index}"
        if p.kind is _P.POSITIONAL_ONLY:
            definition.append(p.name + default)
            call.append(p.name)
            seen_positional_only = True
            continue
        if seen_positional_only:
            definition.append("/")
            seen_positional_only = False
        if p.kind is _P.POSITIONAL_OR_KEYWORD:
            definition.append(p.name + default)
            call.append(p.name)
        elif p.kind is _P.VAR_POSITIONAL:
            definition.append("*" + p.name)
            call.append("*" + p.name)
            star_written = True
        elif p.kind is _P.KEYWORD_ONLY:
            if not star_written:
                definition.append("*")
                star_written = True
            definition.append(p.name + default)
            call.append(f"{p.name}={p.name}")
        else:  # VAR_KEYWORD
            definition.append("**" + p.name)
            call.append("**" + p.name)
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
    exec(
        compile(
            source,
            f"<ascend-patch runtime_check {getattr(replacement, '__qualname__', '?')}>",
            "exec",
        ),
        namespace,
    )
    wrapper: Callable[..., Any] = namespace["runtime_checked"]
    return wrapper
