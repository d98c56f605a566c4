"""mx_driving.patcher migration: groups, conflicts, the 1.0 API and per-patch application (issue 16).

Written the way a DrivingSDK ``patch.py`` uses the API, with only the import line
changed to ``ascend_patch_core``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch
from ascend_patch_core import PatchConflictError
from ascend_patch_core import Patcher


PackageFactory = Callable[..., str]

_RESNET = """
def maxpool_forward(x):
    return ('orig', x)
"""


def _resnet(make_package: PackageFactory) -> Any:
    pkg = make_package({"resnet.py": _RESNET})
    return importlib.import_module(f"{pkg}.resnet")


def _groups(module: str) -> tuple[type[Patch], type[Patch]]:
    """The reference's ResNetFP16 / ResNetMaxPool pair, named the reference's way."""

    class ResNetMaxPool(Patch):
        name = "resnet_maxpool"

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{module}.maxpool_forward", lambda x: ("maxpool", x))]

    class ResNetFP16(Patch):
        name = "resnet_fp16"
        conflicts_with = ["resnet_maxpool"]  # noqa: RUF012 (a list, as patch.py files write it)

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{module}.maxpool_forward", lambda x: ("fp16", x))]

    return ResNetMaxPool, ResNetFP16


# ------------------------------------------------------------------ item 5: conflicts_with


def test_add_then_disable_resolves_a_conflict(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """p.add(A).add(B).disable("b") -- the reference's fix, written after the adds."""
    resnet = _resnet(make_package)
    maxpool, fp16 = _groups(resnet.__name__)
    with pytest.warns(UserWarning, match="conflict"):
        patcher.add(maxpool).add(fp16)
    patcher.disable("resnet_maxpool").apply()
    assert resnet.maxpool_forward(1) == ("fp16", 1)


def test_a_conflict_still_enabled_raises_value_error_at_apply(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    resnet = _resnet(make_package)
    maxpool, fp16 = _groups(resnet.__name__)
    with pytest.warns(UserWarning):
        patcher.add(maxpool, fp16)
    with pytest.raises(ValueError) as info:
        patcher.apply()
    assert isinstance(info.value, PatchConflictError)
    assert "resnet_fp16" in str(info.value) and "resnet_maxpool" in str(info.value)
    assert "default_patcher" in str(info.value)
    assert resnet.maxpool_forward(1) == ("orig", 1)


def test_adding_a_conflicting_group_after_apply_raises(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """After apply(), add() applies at once (ours), so a conflict cannot wait: it raises."""
    resnet = _resnet(make_package)
    maxpool, fp16 = _groups(resnet.__name__)
    patcher.add(maxpool).apply()
    with pytest.raises(PatchConflictError):
        patcher.add(fp16)
    assert resnet.maxpool_forward(1) == ("maxpool", 1)
    assert sys.modules[resnet.__name__] is resnet
