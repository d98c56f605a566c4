r"""The real torch_npu op schemas, per torch_npu version, from committed data files.

Each ``data/torch_npu-<version>.json`` is generated from that version's wheel by
``tools/extract_npu_schemas.py`` (it reads
``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``, sections custom,
autograd, symint, and parses every entry with ``torchgen.model.FunctionSchema``).
Format (one op per line, sorted by name and overload)::

    {"format": 2, "torch_npu": "2.14.0", "source": "<wheel file name>",
    "skipped": [{"schema": "...", "section": "custom", "reason": "torchgen: ..."}, ...],
    "ops": [{"name": "npu_rms_norm", "overload": "", "section": "custom", "exposed": true,
             "schema": "npu_rms_norm(Tensor input, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)"},
            ...]}

Schemas are stored as torch_npu *registers* them, which is not what its yaml says:
its code generator renames every ``self`` argument to ``input`` before ``m.def``
(``re.sub(r'\bself\b(?=[,\)])', 'input', schema)`` in ``custom_functions.py``, from
2.1.0.post9 to master), and ``torch_npu.<op>`` is ``torch.ops.npu.<op>``, so
``torch_npu.fast_gelu(input=x)`` binds and ``self=x`` does not; an overload with
several out arguments is registered with one ``Tensor[] out``. The extractor
applies the same rewrites, so the emulator, which defines these strings with
``torch.library``, and the contract check, which binds calls against them, both see
the registered names (format 2; format 1 held the yaml's text and is refused).
``skipped`` rows keep the yaml's text: they are never registered.

``skipped`` lists the entries torchgen cannot parse (the ``Dimname`` overloads of
the 2.1 to 2.12 wheels); torch cannot register them either, so they are not ops here.

Loading needs no torch: this module is plain data access, and
:func:`parse_arguments` reads argument names, defaults and keyword-only flags from
a schema string (checked against torchgen for every committed op by the tests).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple


__all__ = [
    "DEFAULT_VERSION",
    "Argument",
    "OpSchema",
    "available_versions",
    "load_schemas",
    "parse_arguments",
]

_DATA = Path(__file__).resolve().parent / "data"
_PREFIX = "torch_npu-"

#: The data format this module reads (see the module docstring).
_FORMAT = 2

#: The torch_npu release that pairs with the torch the project tests against (2.13).
DEFAULT_VERSION = "2.13.0"


class OpSchema(NamedTuple):
    """One op overload as torch_npu registers it under ``torch.ops.npu``."""

    name: str
    #: "" for the default overload.
    overload: str
    #: The full schema string, ``name[.overload](args) -> returns``.
    schema: str
    #: The yaml section it came from: "custom", "autograd" or "symint".
    section: str
    #: Whether torch_npu exposes it as ``torch_npu.<name>`` (its public API).
    exposed: bool

    @property
    def qualified(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def arguments(self) -> tuple[Argument, ...]:
        """The declared arguments, in order (parsed from :attr:`schema`, no torch)."""
        return parse_arguments(self.schema)


class Argument(NamedTuple):
    """One declared argument of an op schema."""

    name: str
    #: The schema type as written, alias annotations included: ``Tensor(a!)``, ``int[2]``, ``float?``.
    type: str
    #: The default as written in the schema (``"None"``, ``"1e-06"``, ``"'half'"``);
    #: ``None`` when the argument has no default, i.e. is required.
    default: str | None
    #: Declared after ``*``: it can only be passed by keyword.
    kwarg_only: bool


@cache
def parse_arguments(schema: str) -> tuple[Argument, ...]:
    """The arguments of ``schema`` (``name[.overload](args) -> returns``), in order."""
    start = schema.find("(")
    end = _closing(schema, start) if start > 0 else -1
    if end < 0:
        raise ValueError(f"not an op schema (expected 'name(args) -> returns'): {schema!r}")
    arguments: list[Argument] = []
    kwarg_only = False
    for piece in _split_top_level(schema[start + 1 : end]):
        if piece == "*":
            kwarg_only = True
            continue
        declaration, equals, default = piece.partition("=")
        type_, _, name = declaration.strip().rpartition(" ")
        if not type_ or not name.isidentifier():
            raise ValueError(f"cannot read argument {piece!r} of {schema!r}")
        arguments.append(
            Argument(name, type_.strip(), default.strip() if equals else None, kwarg_only)
        )
    return tuple(arguments)


_OPENING = {"(": ")", "[": "]"}


def _closing(text: str, start: int) -> int:
    """Index of the bracket that closes ``text[start]``, or -1."""
    depth = 0
    quote = ""
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes, pieces stripped."""
    pieces: list[str] = []
    depth = 0
    quote = ""
    current: list[str] = []
    for char in text:
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _OPENING:
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    tail = "".join(current).strip()
    if tail or pieces:
        pieces.append(tail)
    return pieces


def available_versions() -> list[str]:
    """torch_npu versions with committed schema data, oldest first."""
    versions = [p.name[len(_PREFIX) : -len(".json")] for p in _DATA.glob(f"{_PREFIX}*.json")]
    return sorted(versions, key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.replace("post", "").replace("rc", ".").split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


@cache
def load_schemas(version: str = DEFAULT_VERSION) -> dict[str, OpSchema]:
    """All op overloads of ``version``, keyed by ``name`` or ``name.overload``."""
    path = _DATA / f"{_PREFIX}{version}.json"
    if not path.is_file():
        known = ", ".join(available_versions()) or "none"
        raise LookupError(f"no torch_npu schema data for version {version!r}; available: {known}")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != _FORMAT:
        raise LookupError(
            f"{path.name} is schema data format {data.get('format')!r}, not {_FORMAT} "
            f"(format 1 kept the yaml's 'self' where torch_npu registers 'input'); "
            f"regenerate it with tools/extract_npu_schemas.py {version}"
        )
    ops: dict[str, OpSchema] = {}
    for row in data["ops"]:
        op = OpSchema(
            row["name"],
            row.get("overload", ""),
            row["schema"],
            row["section"],
            bool(row["exposed"]),
        )
        ops[op.qualified] = op
    return ops
