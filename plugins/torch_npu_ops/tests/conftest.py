"""Fixtures for the torch plugin's tests: the NPU emulator with the plugin's patches applied."""

from __future__ import annotations

import pytest


@pytest.fixture
def redirect(npu_emulator, isolated_patcher):
    """The plugin's default patch groups, applied under the NPU emulator; reverted afterwards."""
    from ascend_patch_torch import plugin

    for group in plugin.register_patches():
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
