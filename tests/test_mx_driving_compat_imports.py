"""mx_driving.patcher migration: replace_import's keywords and parent packages (issue 16, items 2, 3).

Each test is written the way a DrivingSDK ``patch.py`` spells it, with only the
import line changed to ``ascend_patch_core``.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import types
import uuid
from collections.abc import Callable

import pytest

from ascend_patch_core import Patcher
from ascend_patch_core import ReplaceImport
from ascend_patch_core import replace_with


PackageFactory = Callable[..., str]
_ids = itertools.count()


def _absent() -> str:
    return f"apmxabsent{next(_ids)}_{uuid.uuid4().hex[:8]}"


def _base(make_package: PackageFactory) -> str:
    pkg = make_package(
        {
            "impl.py": "def deform_conv2d(x):\n    return ('npu', x)\nKEPT = 'base'\nSHADOWED = 'base'\n"
        }
    )
    return f"{pkg}.impl"


# ------------------------------------------------------------------ item 2: keywords


def test_base_module_keyword_serves_the_base_modules_names(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """replace_import(name, base_module="pkg") is the base module's content, not an attribute."""
    base = _base(make_package)
    name = _absent()
    patcher.replace_import(name, base_module=base, SHADOWED="export")
    mod = importlib.import_module(name)
    assert not hasattr(mod, "base_module")
    assert mod.deform_conv2d(3) == ("npu", 3)
    assert mod.KEPT == "base" and mod.SHADOWED == "export"


def test_exports_keyword_gives_attributes_not_an_attribute_named_exports(
    patcher: Patcher,
) -> None:
    name = _absent()
    patcher.replace_import(name, exports={"F": 1, "exports": "an attribute named exports"})
    mod = importlib.import_module(name)
    assert mod.F == 1
    assert mod.exports == "an attribute named exports"


def test_exports_and_attrs_combine(patcher: Patcher) -> None:
    name = _absent()
    patcher.replace_import(name, exports={"A": 1}, B=2)
    mod = importlib.import_module(name)
    assert (mod.A, mod.B) == (1, 2)


def test_replacement_keyword(make_package: PackageFactory, patcher: Patcher) -> None:
    base = _base(make_package)
    name = _absent()
    patcher.replace_import(name, replacement=base)
    assert importlib.import_module(name).deform_conv2d(1) == ("npu", 1)


@pytest.mark.parametrize(
    "spell",
    [
        lambda p, n, b: p.replace_import(n, b),
        lambda p, n, b: p.replace_import(n, base_module=b),
        lambda p, n, b: p.replace_import(n, replace_with.module(b)),
    ],
    ids=["positional", "base_module", "replace_with"],
)
def test_the_three_equivalent_base_module_forms(
    make_package: PackageFactory, patcher: Patcher, spell: Callable[..., object]
) -> None:
    base = _base(make_package)
    name = _absent()
    spell(patcher, name, base)
    mod = importlib.import_module(name)
    assert mod.deform_conv2d is sys.modules[base].deform_conv2d


@pytest.mark.parametrize(
    "spell",
    [
        lambda p, n, obj: p.replace_import(n, replace_with.module(X=obj)),
        lambda p, n, obj: p.replace_import(n, exports={"X": obj}),
        lambda p, n, obj: p.replace_import(n, X=obj),
    ],
    ids=["replace_with", "exports", "attrs"],
)
def test_export_only_forms(patcher: Patcher, spell: Callable[..., object]) -> None:
    name = _absent()
    marker = object()
    spell(patcher, name, marker)
    assert importlib.import_module(name).X is marker


def test_replace_with_base_and_exports(make_package: PackageFactory, patcher: Patcher) -> None:
    base = _base(make_package)
    name = _absent()
    patcher.replace_import(name, replace_with.module(base, SHADOWED="spec"), EXTRA=1)
    mod = importlib.import_module(name)
    assert (mod.SHADOWED, mod.KEPT, mod.EXTRA) == ("spec", "base", 1)


def test_a_module_object_plus_overrides(patcher: Patcher) -> None:
    """The reference's "module plus override": the object's names, some overridden."""
    impl = types.ModuleType("impl_for_override")
    impl.f = lambda: "impl"  # type: ignore[attr-defined]
    impl.g = "impl"  # type: ignore[attr-defined]
    name = _absent()
    patcher.replace_import(name, impl, g="override")
    mod = importlib.import_module(name)
    assert mod.f() == "impl" and mod.g == "override"
    assert impl.g == "impl", "the given module is not modified"


@pytest.mark.parametrize(
    "call",
    [
        lambda p, n: p.replace_import(n, "os", base_module="json"),
        lambda p, n: p.replace_import(n, exports={"X": 1}, X=2),
        lambda p, n: p.replace_import(n, replace_with.module("os"), base_module="json"),
        lambda p, n: p.replace_import(n, replace_with.module(X=1), X=2),
        lambda p, n: p.replace_import(n, exports=[("X", 1)]),
    ],
    ids=["replacement+base", "exports+attrs", "spec+base", "spec+attrs", "exports-not-mapping"],
)
def test_contradictions_raise_value_error_at_the_call(
    patcher: Patcher, call: Callable[..., object]
) -> None:
    name = _absent()
    with pytest.raises(ValueError):
        call(patcher, name)
    assert not patcher.report.records, "nothing was declared"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def test_rule_object_takes_the_same_keywords(make_package: PackageFactory) -> None:
    base = _base(make_package)
    name = _absent()
    p = Patcher().add(ReplaceImport(name, base_module=base, exports={"X": 1}))
    try:
        mod = importlib.import_module(name)
        assert mod.X == 1 and mod.KEPT == "base"
    finally:
        p.revert()


# ------------------------------------------------------------------ item 3: missing parents


def test_replace_import_synthesises_missing_parents(patcher: Patcher) -> None:
    """replace_import("nopkg.ops.x", F=1); import nopkg.ops.x works where nopkg exists nowhere."""
    top = _absent()
    patcher.replace_import(f"{top}.ops.x", F=1)
    assert top not in sys.modules, "nothing is imported at declaration"
    namespace: dict[str, object] = {}
    exec(f"import {top}.ops.x\nfrom {top}.ops.x import F\nfrom {top}.ops import x", namespace)
    assert namespace["F"] == 1
    assert namespace["x"] is sys.modules[f"{top}.ops.x"]
    assert sys.modules[top].ops.x.F == 1
    patcher.revert()
    assert top not in sys.modules and f"{top}.ops" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{top}.ops.x")


def test_skip_import_synthesises_missing_parents(patcher: Patcher) -> None:
    top = _absent()
    patcher.skip_import(f"{top}.cuda_ext")
    mod = importlib.import_module(f"{top}.cuda_ext")
    assert not mod  # a stub
    patcher.revert()
    assert top not in sys.modules


def test_real_parents_are_still_imported_normally(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A real parent runs its __init__; only the missing level in between is synthesised."""
    pkg = make_package({"__init__.py": "REAL = True\n"})
    patcher.replace_import(f"{pkg}.ops.deformable_aggregation", DeformableAggregation="npu")
    from_ops = importlib.import_module(f"{pkg}.ops.deformable_aggregation")
    assert from_ops.DeformableAggregation == "npu"
    assert sys.modules[pkg].REAL is True
    assert sys.modules[pkg].__spec__.origin.endswith("__init__.py")


def test_a_real_parents_errors_still_propagate(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    pkg = make_package({"__init__.py": "raise ValueError('broken parent')\n"})
    patcher.replace_import(f"{pkg}.ops.x", F=1)
    with pytest.raises(ValueError, match="broken parent"):
        importlib.import_module(f"{pkg}.ops.x")


def test_a_skipped_parent_is_left_to_its_rule(patcher: Patcher) -> None:
    top = _absent()
    patcher.skip_import(top)
    patcher.replace_import(f"{top}.ops", F=1)
    assert importlib.import_module(f"{top}.ops").F == 1
    assert not sys.modules[top], "the parent is the skip rule's stub"


def test_two_rules_share_a_synthesised_parent_until_both_are_reverted():
    """``nopkg_shared.a`` is needed by both rules: reverting the first keeps it served for
    the second; reverting the second takes it (and ``nopkg_shared``) away."""
    first = Patcher().replace_import("nopkg_shared.a.x", X=1)
    second = Patcher().replace_import("nopkg_shared.a.y", Y=2)
    first.apply()
    second.apply()
    try:
        assert importlib.import_module("nopkg_shared.a.x").X == 1
        first.revert()
        assert "nopkg_shared.a.x" not in sys.modules
        assert importlib.import_module("nopkg_shared.a.y").Y == 2
        assert sys.modules["nopkg_shared.a"].y.Y == 2
    finally:
        first.revert()
        second.revert()
    assert not [m for m in sys.modules if m.startswith("nopkg_shared")]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("nopkg_shared.a.y")
