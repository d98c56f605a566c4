"""Fixtures shared by the emulator tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ascend_patch_core.emulator import EmulatorHandle
from ascend_patch_core.emulator import activate
from ascend_patch_core.emulator import is_active


@pytest.fixture(scope="module")
def emulated(emulated_torch_npu_version: str) -> Iterator[EmulatorHandle]:
    """The emulator, active for a whole test module (hypothesis tests cannot use per-test fixtures)."""
    was_active = is_active()
    handle = activate(emulated_torch_npu_version)
    yield handle
    if not was_active:
        handle.deactivate()
