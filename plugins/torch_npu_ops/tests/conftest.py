"""Fixtures for the torch plugin's tests: the NPU emulator with the plugin's patches applied.

The suite runs with ``--import-mode=importlib``, where a test module cannot import a
sibling; this directory goes on ``sys.path`` so that ``from torch_transfer_coverage
import ...`` (test and doc data, not shipped in the wheel) works in every test module here.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest


_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def require(module: str):
    """Import ``module``, or skip the test -- unless the session requires it.

    Sessions that install an optional dependency on purpose (numpy, torch_scatter)
    name it in ``ASCEND_PATCH_TEST_REQUIRE`` (comma-separated), and a missing one
    is then an error instead of a skip.
    """
    required = {n.strip() for n in os.environ.get("ASCEND_PATCH_TEST_REQUIRE", "").split(",")}
    if module in required:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed in this environment")


@pytest.fixture(scope="session")
def np():
    """numpy, or a skip (see :func:`require`)."""
    return require("numpy")


@pytest.fixture(scope="session")
def torch_scatter():
    """The real torch_scatter, or a skip (see :func:`require`)."""
    module = require("torch_scatter")
    assert getattr(module, "__file__", None), (
        "torch_scatter is served by ascend-patch, not installed"
    )
    return module


@pytest.fixture
def redirect(npu_emulator, isolated_patcher):
    """The plugin's default patch groups, applied under the NPU emulator; reverted afterwards.

    The opt-in groups are left out: a group added by hand is always on.
    """
    from ascend_patch_torch import plugin

    for group in plugin.register_patches():
        if not group.opt_in:
            isolated_patcher.add(group)
    isolated_patcher.apply()
    return isolated_patcher


@pytest.fixture
def calls(redirect):
    """``calls(name)``: ``(redirected, untouched)`` call counts of one patch of ``redirect``."""

    def counts(name):
        record = redirect.report.get(name)
        assert record.status.value == "applied", f"{name}: {record.status} {record.reason}"
        assert record.counters is not None, f"{name} has no call counters"
        return record.counters.replacement_calls, record.counters.fallback_calls

    return counts
