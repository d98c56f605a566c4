"""The transformers plugin's tests: :mod:`hf_stacks` (which stack a test module needs) on the path.

The suite runs with ``--import-mode=importlib``, where a test module cannot import a
sibling; this directory goes on ``sys.path`` so that ``from hf_stacks import ...`` works.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(autouse=True)
def _npu_integration_without_einops(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under the emulator, what ``apply()`` gives a user of transformers 4.51/4.52 without einops.

    There transformers' ``integrations.npu_flash_attention`` imports einops as soon as it
    sees an NPU, and every modeling module imports it: the NpuAttention group's import
    rule serves it without einops. Tests that use the emulator but build their own
    Patcher get that rule here, so that they pass whatever ran before them (the rule
    itself is tested in test_served_flash_attn.py). Elsewhere: nothing.
    """
    if "npu_emulator" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("npu_emulator")
    from ascend_patch_transformers import groups

    served = "transformers.integrations.npu_flash_attention"
    rules = [rule for rule in groups.import_rules() if rule.module == served]
    if not rules or served in sys.modules:
        yield
        return
    from ascend_patch_core import Patcher

    patcher = Patcher(autoload=False).add(*rules)
    patcher.apply()
    try:
        yield
    finally:
        patcher.revert()
