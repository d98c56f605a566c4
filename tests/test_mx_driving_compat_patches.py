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


# ------------------------------------------------------------------ item 8: group names


@pytest.mark.parametrize(
    ("reference_name", "group"), [("tensor_index", "TensorIndex"), ("numpy_compat", "NumpyCompat")]
)
def test_reference_group_names_disable_the_torch_plugins_groups(
    reference_name: str, group: str
) -> None:
    """disable("tensor_index") disables the torch plugin's TensorIndex: no 'matches nothing'."""
    pytest.importorskip("ascend_patch_torch")
    patcher = Patcher(plugins="torch").enable(reference_name).disable(reference_name)
    try:
        report = patcher.apply()
        record = report.get(group, kind="group")
        assert record.status is Status.SKIPPED and record.reason == "disabled"
        assert not [w for w in report.warnings if reference_name in w]
    finally:
        patcher.revert()


def test_reference_names_enable_an_opt_in_group() -> None:
    pytest.importorskip("ascend_patch_torch")
    patcher = Patcher(plugins="torch").enable("tensor_index")
    try:
        report = patcher.apply()
        assert [r for r in report.records if r.group == "TensorIndex" and r.kind == "patch"]
        assert not [r for r in report.records if r.name == "TensorIndex" and r.kind == "group"]
        assert not report.warnings
    finally:
        patcher.revert()


def test_torch_scatter_name_disables_a_torch_scatter_group(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """The reference's TorchScatter group, declared in a patch.py, answers to "torch_scatter"."""
    resnet = _resnet(make_package)

    class TorchScatter(Patch):
        legacy_name = "scatter"

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{resnet.__name__}.maxpool_forward", lambda x: ("scatter", x))]

    report = patcher.add(TorchScatter).disable("torch_scatter").apply()
    assert resnet.maxpool_forward(1) == ("orig", 1)
    assert report.get("TorchScatter", kind="group").reason == "disabled"


def test_conflicts_with_and_disable_use_any_of_a_groups_names(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Class-named groups answer to the reference's snake-case names, in disable() and conflicts_with."""
    resnet = _resnet(make_package)
    module = resnet.__name__

    class ResNetMaxPool(Patch):
        legacy_name = "resnet_maxpool"

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{module}.maxpool_forward", lambda x: ("maxpool", x))]

    class ResNetFP16(Patch):
        legacy_name = "resnet_fp16"
        conflicts_with = ("resnet_maxpool",)

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{module}.maxpool_forward", lambda x: ("fp16", x))]

    with pytest.warns(UserWarning, match="'ResNetMaxPool'"):
        patcher.add(ResNetMaxPool, ResNetFP16)
    with pytest.raises(PatchConflictError):
        patcher.apply()
    patcher.disable("resnet_maxpool").apply()
    assert resnet.maxpool_forward(1) == ("fp16", 1)
    patcher.disable("resnet_fp16")  # after apply(): reverted at once
    assert resnet.maxpool_forward(1) == ("orig", 1)


def test_disable_after_apply_by_snake_name(make_package: PackageFactory, patcher: Patcher) -> None:
    resnet = _resnet(make_package)

    class TensorIndex(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{resnet.__name__}.maxpool_forward", lambda x: ("index", x))]

    patcher.add(TensorIndex).apply()
    assert resnet.maxpool_forward(1) == ("index", 1)
    patcher.disable("tensor_index")
    assert resnet.maxpool_forward(1) == ("orig", 1)


def test_group_names_are_converted_once_per_name_not_per_apply(patcher: Patcher) -> None:
    """apply() asks for each group's names several times; the snake-case conversion is
    cached, so a second apply() of the same groups converts nothing again (hot path)."""
    from ascend_patch_core._engine.group_names import snake_name

    class SomeLongGroupNameForCaching(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return []

    patcher.add(SomeLongGroupNameForCaching).apply()
    misses = snake_name.cache_info().misses
    second = Patcher().add(SomeLongGroupNameForCaching).disable("some_long_group_name_for_caching")
    try:
        assert second.apply().get("SomeLongGroupNameForCaching", kind="group").reason == "disabled"
    finally:
        second.revert()
    assert snake_name.cache_info().misses == misses


# ------------------------------------------------------------------ item 1: per-patch use


def test_atomic_patch_apply_alone(make_package: PackageFactory) -> None:
    """AtomicPatch("m.f", g).apply(), .is_applied, .module, .get_info() as patch.py uses them."""
    resnet = _resnet(make_package)

    def npu_maxpool(x: Any) -> Any:
        return ("npu", x)

    patch = AtomicPatch(f"{resnet.__name__}.maxpool_forward", npu_maxpool)
    assert patch.module == resnet.__name__.split(".")[0]
    assert not patch.is_applied
    record = patch.apply()
    assert record.status is Status.APPLIED and patch.is_applied
    assert resnet.maxpool_forward(1) == ("npu", 1)
    info = patch.get_info()
    assert info.startswith(f"{resnet.__name__}.maxpool_forward: ")
    assert "maxpool_forward -> " in info and "npu_maxpool" in info
    diff = patch.get_info(show_diff=True)
    assert "-def maxpool_forward(x):" in diff and "+    def npu_maxpool" in diff
    patch.revert()
    assert not patch.is_applied and resnet.maxpool_forward(1) == ("orig", 1)


def test_atomic_patch_applied_alone_from_two_threads_is_installed_once(
    make_package: PackageFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads calling patch.apply() at once share one Patcher: revert() undoes it all."""
    import threading
    import time

    from ascend_patch_core._compat import per_patch as _per_patch

    resnet = _resnet(make_package)
    made: list[Patcher] = []

    class SlowPatcher(Patcher):  # widens the window between "none yet" and "made one"
        def __init__(self) -> None:
            time.sleep(0.05)
            super().__init__()
            made.append(self)

    monkeypatch.setattr(_per_patch, "Patcher", SlowPatcher)
    patch = AtomicPatch(f"{resnet.__name__}.maxpool_forward", lambda x: ("npu", x))
    threads = [threading.Thread(target=patch.apply) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and resnet.maxpool_forward(1) == ("npu", 1)
    patch.revert()
    assert resnet.maxpool_forward(1) == ("orig", 1)


def test_apply_all_again_after_revert_all_uses_the_new_options(
    make_package: PackageFactory,
) -> None:
    """Patch.apply_all(options) and MyPatch(options).apply() pass each call's options to
    patches(), also after an earlier apply_all() was reverted (not the first call's)."""
    resnet = _resnet(make_package)
    target = f"{resnet.__name__}.maxpool_forward"

    class Tagged(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            tag = (options or {}).get("tag", "default")
            return [AtomicPatch(target, lambda x: (tag, x))]

    Tagged.apply_all()
    assert resnet.maxpool_forward(1) == ("default", 1)
    Tagged.revert_all()
    Tagged.apply_all({"tag": "second"})
    assert resnet.maxpool_forward(1) == ("second", 1)
    Tagged.revert_all()
    assert Tagged({"tag": "instance"}).apply().status is Status.APPLIED
    assert resnet.maxpool_forward(1) == ("instance", 1)
    Tagged.revert_all()
    assert resnet.maxpool_forward(1) == ("orig", 1)


def test_patch_group_apply_all_and_iteration(make_package: PackageFactory) -> None:
    resnet = _resnet(make_package)
    maxpool, _ = _groups(resnet.__name__)
    children = list(maxpool())
    assert [c.target for c in children] == [f"{resnet.__name__}.maxpool_forward"]
    records = maxpool.apply_all()
    assert [r.status for r in records] == [Status.APPLIED]
    assert resnet.maxpool_forward(1) == ("maxpool", 1)
    folded = maxpool().apply()  # the same patcher: still applied
    assert folded.kind == "group" and folded.name == "resnet_maxpool"
    assert folded.status is Status.APPLIED
    maxpool.revert_all()
    assert resnet.maxpool_forward(1) == ("orig", 1)


def test_print_info_before_and_after_apply(
    make_package: PackageFactory, patcher: Patcher, capsys: pytest.CaptureFixture[str]
) -> None:
    resnet = _resnet(make_package)
    maxpool, fp16 = _groups(resnet.__name__)
    with pytest.warns(UserWarning, match="conflict"):
        patcher.add(maxpool).add(fp16)
    patcher.disable("resnet_fp16")
    text = patcher.print_info()
    assert text in capsys.readouterr().out
    assert text.startswith("Patcher Info (1 modules, 2 patches)")
    assert f"[pending] {resnet.__name__}.maxpool_forward: <missing> ->" in text
    assert f"[disabled] {resnet.__name__}.maxpool_forward" in text
    assert resnet.maxpool_forward(1) == ("orig", 1), "print_info() applied nothing"
    patcher.apply()
    after = patcher.print_info(diff=True)
    assert (
        f"[applied] {resnet.__name__}.maxpool_forward: {resnet.__name__}.maxpool_forward" in after
    )
    assert "-def maxpool_forward(x):" in after


def test_print_info_before_apply_lists_the_plugins_patches_too(
    make_package: PackageFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """default_patcher.print_info() before apply() lists what apply() would apply: the
    plugins' groups as well as the added ones (it listed only the added ones)."""
    from ascend_patch_core import hookimpl

    resnet = _resnet(make_package)
    maxpool, _ = _groups(resnet.__name__)

    class Plugin:
        @hookimpl
        def register_patches(self) -> list[Any]:
            return [maxpool]

    patcher = Patcher(extra_plugins=[("test-plugin", Plugin())])
    text = patcher.print_info()
    capsys.readouterr()
    assert text.startswith("Patcher Info (1 modules, 1 patches)")
    assert f"[pending] {resnet.__name__}.maxpool_forward: <missing> ->" in text
    assert resnet.maxpool_forward(1) == ("orig", 1), "print_info() applied nothing"
    try:
        patcher.apply()
        assert patcher.print_info().startswith("Patcher Info (1 modules, 1 patches)")
    finally:
        patcher.revert()


# ------------------------------------------------------------------ item 7: apply_before_collect


def _bootstrap_case(make_package: PackageFactory, early_first: bool) -> tuple[Any, Any, Any]:
    pkg = make_package(
        {
            "np.py": "bool_ = bool\n",  # an old numpy without the alias the model needs
            "model.py": "from .np import int_\nWIDTH = int_(3)\n",
        }
    )
    np = importlib.import_module(f"{pkg}.np")  # already imported, as numpy always is

    class NumpyCompat(Patch):
        apply_before_collect = early_first

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{pkg}.np.int_", int, create=True)]

    class ModelPatch(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            model = importlib.import_module(f"{pkg}.model")  # an eager patches()
            return [AtomicPatch(f"{pkg}.model.WIDTH", model.WIDTH + 1)]

    return np, NumpyCompat, ModelPatch


def test_apply_before_collect_runs_first(make_package: PackageFactory, patcher: Patcher) -> None:
    """The reference's NumpyCompat case: ModelPatch.patches() imports code needing np.int_."""
    np, compat, model_patch = _bootstrap_case(make_package, early_first=True)
    report = patcher.add(model_patch, compat).apply()  # added after the group needing it
    assert np.int_ is int
    model = sys.modules[f"{np.__name__.rpartition('.')[0]}.model"]
    assert model.WIDTH == 4
    assert not [r for r in report.records if r.status.value == "failed"]


def test_without_apply_before_collect_the_group_fails_alone(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    np, compat, model_patch = _bootstrap_case(make_package, early_first=False)
    report = patcher.add(model_patch, compat).apply()
    assert report.get("ModelPatch", kind="group").status.value == "failed"
    assert np.int_ is int, "the other group still applies"
