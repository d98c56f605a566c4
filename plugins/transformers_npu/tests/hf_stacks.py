"""Which Hugging Face stack a test module needs, and whether its absence is a skip or a failure.

Each nox session installs one stack and names it in ``ASCEND_PATCH_TEST_REQUIRE``
(comma-separated): there a missing stack fails instead of skipping. Names:
``transformers``, ``diffusers``, ``accelerate``, ``peft``, ``trl``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from typing import Any

import pytest


__all__ = ["require_module", "required", "transformers_version"]


def required(name: str) -> bool:
    """Whether this session promises ``name`` (a missing one is then a failure)."""
    return name in os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(",")


def require_module(module: str) -> Any:
    """Import ``module``; skip the test module without it, unless the session requires it."""
    if required(module):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def transformers_version() -> tuple[int, ...]:
    """The installed transformers version as numbers (``(0,)`` when absent)."""
    try:
        text = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return (0,)
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())
