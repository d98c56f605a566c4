"""The NPU emulator: torch_npu's real op schemas on CPU, with reference kernels.

Not imported by ``import ascend_patch_core``; importing it does not import torch.
"""

from __future__ import annotations

from ._schemas import DEFAULT_VERSION
from ._schemas import Argument
from ._schemas import OpSchema
from ._schemas import available_versions
from ._schemas import load_schemas
from ._schemas import parse_arguments


__all__ = [
    "DEFAULT_VERSION",
    "Argument",
    "OpSchema",
    "available_versions",
    "load_schemas",
    "parse_arguments",
]
