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
from ascend_patch_core import LegacyPatch
from ascend_patch_core import Patch
from ascend_patch_core import PatchConflictError
from ascend_patch_core import Patcher
from ascend_patch_core import PatcherBuilder
from ascend_patch_core import Status


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


# ------------------------------------------------------------------ item 6: the 1.0 API


def test_1_0_patch_gets_a_dict_of_options(make_package: PackageFactory) -> None:
    """Patch(f).options is {}: a 1.0 function's options.get(...) works."""
    resnet = _resnet(make_package)
    seen: list[Any] = []

    def numpy_type(module: Any, options: Any) -> None:
        seen.append(options.get("fp16", False))

    patcher = PatcherBuilder().add_module_patch(resnet.__name__, Patch(numpy_type)).build()
    with patcher:
        pass
    assert Patch(numpy_type).options == {}
    assert seen == [False]


def test_1_0_patch_positional_priority_and_failure_warning() -> None:
    def f(module: Any, options: Any) -> None: ...

    patch = Patch(f, {"a": 1}, 3, patch_failure_warning=False)
    assert isinstance(patch, LegacyPatch)
    assert (patch.options, patch.priority, patch.patch_failure_warning) == ({"a": 1}, 3, False)


def test_1_0_patches_sort_by_priority() -> None:
    def f(module: Any, options: Any) -> None: ...

    patches = [Patch(f, None, 2), Patch(f, None, 0), Patch(f, None, 1)]
    assert [p.priority for p in sorted(patches)] == [0, 1, 2]


def test_1_0_function_raising_attribute_error_is_skipped(make_package: PackageFactory) -> None:
    resnet = _resnet(make_package)

    def resnet_add_relu(module: Any, options: Any) -> None:
        module.BasicBlock.forward = None  # this version has no BasicBlock

    def raising(module: Any, options: Any) -> None:
        raise RuntimeError("a real defect")

    patcher = (
        PatcherBuilder()
        .add_module_patch(resnet.__name__, Patch(resnet_add_relu), Patch(raising))
        .build()
    )
    with patcher:
        report = patcher.report
        assert report.get("resnet_add_relu").status is Status.SKIPPED
        assert "BasicBlock" in (report.get("resnet_add_relu").reason or "")
        assert report.get("raising").status is Status.FAILED
