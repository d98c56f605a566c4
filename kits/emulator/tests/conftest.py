"""Fixtures shared by the emulator tests, and :mod:`schema_values` on the path.

The suite runs with ``--import-mode=importlib``, where a test module cannot import a
sibling; this directory goes on ``sys.path`` so that ``from schema_values import ...``
works in every test module here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ascend_patch_emulator import EmulatorHandle
from ascend_patch_emulator import activate
from ascend_patch_emulator import is_active


_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="module")
def emulated(emulated_torch_npu_version: str) -> Iterator[EmulatorHandle]:
    """The emulator, active for a whole test module (hypothesis tests cannot use per-test fixtures)."""
    was_active = is_active()
    handle = activate(emulated_torch_npu_version)
    yield handle
    if not was_active:
        handle.deactivate()


@pytest.fixture(scope="session")
def assert_close():
    """``assert_close(actual, expected)``: ``expected`` is a float64 reference; tolerance by ``actual``'s dtype."""
    import torch
    from ascend_patch_emulator.pytest_plugin import tolerance_for

    def check(actual, expected, *, dtype=None, rtol=None, atol=None):
        chosen_rtol, chosen_atol = tolerance_for(dtype or actual.dtype)
        torch.testing.assert_close(
            actual.double(),
            expected.double(),
            rtol=chosen_rtol if rtol is None else rtol,
            atol=chosen_atol if atol is None else atol,
            equal_nan=True,
        )

    return check
