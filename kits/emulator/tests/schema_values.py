"""Values of torch_npu schema argument types, for calling the emulator's ops in tests."""

from __future__ import annotations

from typing import Any

import torch


__all__ = ["schema_value"]


def schema_value(type_: str) -> Any:
    """A value of schema type ``type_`` that torch's argument parser accepts."""
    if type_.endswith("?"):
        return None
    base = type_.split("(")[0]
    if type_.endswith("[]") and base.startswith("Tensor"):
        return [torch.zeros(1)]
    if base.startswith("Tensor"):
        return torch.zeros(1)
    scalar, _, size = base.partition("[")
    count = int(size.rstrip("]") or 1) if size else None
    one = {
        "int": 1,
        "SymInt": 1,
        "bool": False,
        "float": 1.0,
        "str": "x",
        "Scalar": 1,
        "ScalarType": torch.float32,
    }[scalar]
    return one if count is None else [one] * count
