"""mx_driving.patcher migration: the reference's public names (issue 16, item 9)."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable

import pytest

import ascend_patch_core
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import PatchResult
from ascend_patch_core import PatchStatus
from ascend_patch_core import Record
from ascend_patch_core import RegistryPatch
from ascend_patch_core import Status


PackageFactory = Callable[..., str]

_REGISTRY = """
class Registry:
    def __init__(self):
        self._module_dict = {}

    def register_module(self, name=None, force=False, module=None):
        self._module_dict[name or module.__name__] = module
        return module

    def get(self, name):
        return self._module_dict.get(name)


MODELS = Registry()


class SubMConv3d:
    kind = "cuda"


MODELS.register_module(module=SubMConv3d)
"""


class NpuSubMConv3d:
    kind = "npu"


def test_registry_patch_overwrites_an_entry_and_reverts(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    pkg = make_package({"registry.py": _REGISTRY})
    registry = importlib.import_module(f"{pkg}.registry")
    original = registry.MODELS.get("SubMConv3d")
    patch = RegistryPatch(f"{pkg}.registry.MODELS", NpuSubMConv3d, name="SubMConv3d")
    assert patch.name == f"{pkg}.registry.MODELS.SubMConv3d"
    report = patcher.add(patch).apply()
    assert registry.MODELS.get("SubMConv3d") is NpuSubMConv3d
    assert report.get(patch.name).status is Status.APPLIED
    patcher.revert()
    assert registry.MODELS.get("SubMConv3d") is original


def test_registry_patch_new_entry_factory_and_precheck(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    pkg = make_package({"registry.py": _REGISTRY})
    seen: list[str] = []

    def precheck(name: str, force: bool) -> bool:
        seen.append(f"{name}:{force}")
        return True

    patcher.add(
        RegistryPatch(
            f"{pkg}.registry.MODELS",
            name="NpuOnly",
            module_factory=lambda: NpuSubMConv3d,
            precheck=precheck,
        )
    ).apply()
    registry = importlib.import_module(f"{pkg}.registry")  # installed when imported
    assert registry.MODELS.get("NpuOnly") is NpuSubMConv3d
    assert seen == ["NpuOnly:True"]
    patcher.revert()
    assert "NpuOnly" not in registry.MODELS._module_dict


def test_registry_patch_without_force_fails_on_an_existing_name(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    pkg = make_package({"registry.py": _REGISTRY})
    registry = importlib.import_module(f"{pkg}.registry")
    patch = RegistryPatch(f"{pkg}.registry.MODELS", NpuSubMConv3d, name="SubMConv3d", force=False)
    fresh = RegistryPatch(f"{pkg}.registry.MODELS", NpuSubMConv3d, name="Fresh", force=False)
    report = patcher.add(patch, fresh).apply()
    assert report.get(patch.name).status is Status.FAILED
    assert report.get(fresh.name).status is Status.APPLIED
    assert registry.MODELS.get("SubMConv3d").kind == "cuda"


def test_registry_patch_definition_errors() -> None:
    with pytest.raises(PatchDefinitionError):
        RegistryPatch("pkg.MODELS", module_factory=lambda: object)  # no name
    with pytest.raises(PatchDefinitionError):
        RegistryPatch("pkg.MODELS", NpuSubMConv3d, module_factory=lambda: object)


def test_patch_result_and_status_are_the_reports() -> None:
    assert PatchStatus is Status and PatchResult is Record
    assert PatchStatus.APPLIED.value == "applied" and PatchStatus("skipped") is Status.SKIPPED


def test_version_helpers_read_metadata() -> None:
    from ascend_patch_core import check_version
    from ascend_patch_core import get_version
    from ascend_patch_core import is_mmcv_v1x
    from ascend_patch_core import is_mmcv_v2x
    from ascend_patch_core import mmcv_version

    pytest_version = importlib.metadata.version("pytest")
    assert get_version("pytest") == pytest_version
    assert check_version("pytest", major=int(pytest_version.split(".")[0]))
    assert not check_version("pytest", major=0)
    assert get_version("no_such_package_anywhere") is None
    assert not check_version("no_such_package_anywhere")
    mmcv = get_version("mmcv")
    assert mmcv_version.version == mmcv == mmcv_version()
    assert bool(mmcv_version) is (mmcv is not None) is mmcv_version.has_mmcv
    assert is_mmcv_v1x() is (mmcv is not None and mmcv.startswith("1."))
    assert is_mmcv_v2x() is (mmcv is not None and mmcv.startswith("2."))


def test_default_patcher_builder_holds_the_plugins_patches() -> None:
    from ascend_patch_core import default_patcher_builder

    patcher = default_patcher_builder.build()
    assert isinstance(patcher, Patcher) and not patcher.is_applied
    assert patcher._config.autoload  # the plugins' default patches, at apply()


def test_every_documented_name_is_public() -> None:
    for name in ("PatchResult", "PatchStatus", "RegistryPatch", "default_patcher_builder",
                 "get_version", "check_version", "mmcv_version", "is_mmcv_v1x",
                 "is_mmcv_v2x", "replace_with", "with_imports"):  # fmt: skip
        assert name in ascend_patch_core.__all__
        assert getattr(ascend_patch_core, name) is not None
