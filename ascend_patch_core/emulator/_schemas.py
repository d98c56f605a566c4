"""The real torch_npu op schemas, per torch_npu version, from committed data files.

Each ``data/torch_npu-<version>.json`` is generated from that version's wheel by
``tools/extract_npu_schemas.py`` (it reads
``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``, sections custom,
autograd, symint, and parses every entry with ``torchgen.model.FunctionSchema``).
Format::

    {"format": 1, "torch_npu": "2.14.0", "source": "<wheel file name>",
     "ops": [{"name": "npu_rms_norm", "overload": "", "section": "custom",
              "exposed": true,
              "schema": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)"},
             ...]}

Loading needs no torch: this module is plain data access.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple


__all__ = ["DEFAULT_VERSION", "OpSchema", "available_versions", "load_schemas"]

_DATA = Path(__file__).resolve().parent / "data"
_PREFIX = "torch_npu-"

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
