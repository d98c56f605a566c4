"""The contract check for ``mx_driving`` calls: the name is public, the call binds.

The recorded Python API of each mx-driving version (``_mx_data``) says what each
public name is and what it takes. A call binds as :meth:`inspect.Signature.bind`
binds it (placeholders for the arguments; with ``*args`` or ``**kwargs`` in the call
only what is known is checked, as ``bind_partial`` would):

* ``mx_driving.f(...)`` for a function, an ``apply`` name or a callable instance:
  its signature; for an ``nn.Module`` or other class: its ``__init__``;
* ``mx_driving.SomeFunction.apply(...)``: ``forward`` without ``ctx``;
  ``mx_driving.SomeFunction.forward(...)``: ``forward`` with it;
* ``mx_driving.SomeFunction(...)`` is reported: an autograd Function is used
  through ``apply``.

Through an autograd Function's ``apply`` (an ``apply`` name, or ``.apply(...)``) a
keyword after a skipped parameter is reported as well: torch hands ``apply``'s
arguments to ``forward`` in order without filling the defaults of skipped ones, so
``scatter_add(src, index, dim=1)`` fails (measured with torch 2.13: "forward()
missing required argument: 'out' (position 2)"), while ``scatter_add(src, index,
None, 1)`` works.
"""

from __future__ import annotations

import difflib
import inspect

from ._mx_data import MxName
from ._mx_data import available_mx_versions
from ._mx_data import load_mx_api
from ._scan import OpCall


__all__ = ["mx_call_problem", "supported_mx_versions"]

_APPLY_KINDS = frozenset({"apply"})


def supported_mx_versions(spec: str | None = None) -> list[str]:
    """The mx-driving versions with data that satisfy ``spec`` (``">=26"``), oldest first."""
    versions = available_mx_versions()
    if not spec or not spec.strip():
        return versions
    from packaging.specifiers import InvalidSpecifier
    from packaging.specifiers import SpecifierSet

    try:
        specifier = SpecifierSet(spec.strip())
    except InvalidSpecifier:
        raise ValueError(
            f"invalid mx-driving version specifier {spec!r}; write it like '>=26.2'"
        ) from None
    return [v for v in versions if specifier.contains(v, prereleases=True)]


def _bind(signature: inspect.Signature, call: OpCall) -> str | None:
    """Why ``call`` does not bind to ``signature`` (None when it does)."""
    positional = [object()] * (call.positional or 0)
    keywords = {name: object() for name in call.keywords}
    partial = call.positional is None or call.more_keywords
    try:
        if partial:
            signature.bind_partial(*positional, **keywords)
        else:
            signature.bind(*positional, **keywords)
    except TypeError as error:
        return f"{error} (signature {signature})"
    return None


def _with_ctx(signature: inspect.Signature) -> inspect.Signature:
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return signature.replace(parameters=[ctx, *signature.parameters.values()])


def _keywords_through_apply(signature: inspect.Signature, call: OpCall, through: str) -> str | None:
    """Torch hands ``apply``'s arguments to ``forward`` in order: no gap may precede a keyword."""
    if not call.keywords or call.positional is None:
        return None
    names = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    covered = set(range(call.positional)) | {names.index(k) for k in call.keywords if k in names}
    if not covered:
        return None
    skipped = [names[i] for i in range(max(covered)) if i not in covered]
    if not skipped:
        return None
    listed = ", ".join(f"'{n}'" for n in skipped)
    return (
        f"{listed} skipped before a keyword through {through}: torch's Function.apply does "
        f"not fill skipped defaults (forward() missing required argument); pass them by "
        f"position"
    )


def _missing(name: str, version: str) -> str:
    api = load_mx_api(version)
    elsewhere = [v for v in available_mx_versions() if name in load_mx_api(v)]
    if elsewhere:
        return f"no such public name (it exists in {', '.join(elsewhere)})"
    close = difflib.get_close_matches(name, sorted(api), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"not a public name of mx_driving (not in its __all__){hint}"


def _problem(entry: MxName, attribute: str, call: OpCall) -> str | None:
    """What is wrong with calling ``entry`` (``.attribute``), or None."""
    if not attribute:
        if entry.kind == "autograd_function":
            return f"is an autograd Function class: call mx_driving.{entry.name}.apply(...)"
        signature = entry.call_signature
        if signature is None:
            return None
        problem = _bind(signature, call)
        if problem is None and entry.kind in _APPLY_KINDS:
            return _keywords_through_apply(
                signature, call, f"{entry.function_class}.apply (mx_driving.{entry.name})"
            )
        return problem
    if entry.kind != "autograd_function" or entry.signature is None:
        return None
    if attribute == "apply":
        return _bind(entry.signature, call) or _keywords_through_apply(
            entry.signature, call, f"{entry.name}.apply"
        )
    if attribute == "forward":
        return _bind(_with_ctx(entry.signature), call)
    return None


def mx_call_problem(call: OpCall, version: str) -> str | None:
    """What is wrong with ``call`` (an mx_driving use) in ``version``, or None."""
    name, _, attribute = call.op.partition(".")
    entry = load_mx_api(version).get(name)
    if entry is None:
        return f"{call.target}: {_missing(name, version)}"
    if not call.called:
        return None
    problem = _problem(entry, attribute, call)
    return f"{call.target}: {problem}" if problem else None
