"""mx_driving's public API, per mx-driving version, from committed data files.

Each ``data/mx_driving-<version>.json`` is generated from that version's wheel by
``tools/mx_driving_signatures.py``, which reads the wheel's Python sources with
``ast`` (the package cannot be imported without an NPU: it imports torch_npu and a
compiled ``_C``). Format (one public name per line, sorted)::

    {"format": 1, "mx_driving": "26.2.0.post2", "source": "<wheel>", "sha256": "<hex>",
     "names": [{"name": "scatter_add", "module": "mx_driving.ops.scatter_add",
                "kind": "apply", "function_class": "ScatterAddFunction",
                "signature": [{"name": "src", "kind": "POSITIONAL_OR_KEYWORD"},
                              {"name": "out", "kind": "POSITIONAL_OR_KEYWORD", "default": "None"},
                              ...]},
               ...]}

Kinds: ``function``, ``apply`` (``name = SomeFunction.apply``: binds to ``forward``
without ``ctx``), ``autograd_function`` (``signature`` is ``forward`` without ``ctx``),
``module`` (``init`` and ``forward`` without ``self``), ``class`` (``init``),
``instance`` (``signature`` is what calling it binds to) and ``object`` (nothing
recorded, e.g. a compiled function). Defaults and annotations are source text.

Plain data access: no torch import.
"""

from __future__ import annotations

import ast
import inspect
import json
from functools import cache
from pathlib import Path
from typing import Any
from typing import NamedTuple


__all__ = [
    "CALLABLE_KINDS",
    "DEFAULT_MX_VERSION",
    "MxName",
    "available_mx_versions",
    "load_mx_api",
    "mx_data_source",
    "signature_of",
]

_DATA = Path(__file__).resolve().parent / "data"
_PREFIX = "mx_driving-"
_FORMAT = 1

#: The mx-driving release the emulator serves by default (the newest with data).
DEFAULT_MX_VERSION = "26.2.0.post2"

#: Kinds whose call binds to ``signature`` directly.
CALLABLE_KINDS = frozenset({"function", "apply", "instance"})


class _SourceDefault:
    """A default that is not a literal: shown as its source text in signatures."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class MxName(NamedTuple):
    """One public name of ``mx_driving`` (in its ``__all__``)."""

    name: str
    kind: str
    #: The module that defines it in the wheel (``mx_driving.ops.scatter_add``).
    module: str
    #: What a call binds to (function, apply, instance) or ``forward`` without ``ctx``
    #: (autograd_function); ``None`` when unknown.
    signature: inspect.Signature | None
    #: ``__init__`` without ``self`` (module, class).
    init: inspect.Signature | None
    #: ``forward`` without ``self`` (module).
    forward: inspect.Signature | None
    #: The autograd Function class behind an ``apply`` name.
    function_class: str | None

    @property
    def call_signature(self) -> inspect.Signature | None:
        """What ``mx_driving.<name>(...)`` binds to (a class: its ``__init__``)."""
        if self.kind in CALLABLE_KINDS:
            return self.signature
        if self.kind in ("module", "class"):
            return self.init
        return None


def _default(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return _SourceDefault(text)


def signature_of(rows: list[dict[str, str]] | None) -> inspect.Signature | None:
    """An :class:`inspect.Signature` from the data's parameter rows (None stays None)."""
    if rows is None:
        return None
    parameters = [
        inspect.Parameter(
            row["name"],
            getattr(inspect.Parameter, row["kind"]),
            default=_default(row["default"]) if "default" in row else inspect.Parameter.empty,
            annotation=row.get("annotation", inspect.Parameter.empty),
        )
        for row in rows
    ]
    return inspect.Signature(parameters)


def available_mx_versions() -> list[str]:
    """mx-driving versions with committed API data, oldest first."""
    versions = [p.name[len(_PREFIX) : -len(".json")] for p in _DATA.glob(f"{_PREFIX}*.json")]
    return sorted(versions, key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.replace("post", "").replace("rc", ".").split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


@cache
def _document(version: str) -> dict[str, Any]:
    path = _DATA / f"{_PREFIX}{version}.json"
    if not path.is_file():
        known = ", ".join(available_mx_versions()) or "none"
        raise LookupError(f"no mx_driving API data for version {version!r}; available: {known}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != _FORMAT:
        raise LookupError(
            f"{path.name} is mx_driving data format {data.get('format')!r}, not {_FORMAT}; "
            f"regenerate it with tools/mx_driving_signatures.py {version}"
        )
    return data


def mx_data_source(version: str = DEFAULT_MX_VERSION) -> tuple[str, str]:
    """(wheel file name, sha256) the data of ``version`` was read from."""
    data = _document(version)
    return str(data["source"]), str(data["sha256"])


@cache
def load_mx_api(version: str = DEFAULT_MX_VERSION) -> dict[str, MxName]:
    """Every public name of mx_driving ``version``, by name."""
    names: dict[str, MxName] = {}
    for row in _document(version)["names"]:
        names[row["name"]] = MxName(
            row["name"],
            row["kind"],
            row["module"],
            signature_of(row.get("signature")),
            signature_of(row.get("init")),
            signature_of(row.get("forward")),
            row.get("function_class"),
        )
    return names
