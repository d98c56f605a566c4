"""Import rules (skip / replace / inject) and the import hub that serves them.

Every test imports real modules written to disk by ``make_package`` (or names that
exist nowhere), so the import system runs exactly as it does for users.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.resources
import importlib.util
import itertools
import runpy
import sys
import types
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ImportRule
from ascend_patch_core import ImportRuleError
from ascend_patch_core import InjectImport
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import Record
from ascend_patch_core import ReplaceImport
from ascend_patch_core import SkipImport
from ascend_patch_core import Status
from ascend_patch_core import hookimpl
from ascend_patch_core import is_stub
from ascend_patch_core.imports._hub import hub


PackageFactory = Callable[..., str]

_ids = itertools.count()


def _absent() -> str:
    """A module name that exists nowhere on disk."""
    return f"apabsent{next(_ids)}_{uuid.uuid4().hex[:8]}"


def _rule_record(patcher: Patcher, module: str, kind: str | None = None) -> Record:
    found = [
        r
        for r in patcher.report.records
        if r.kind == "rule"
        and r.target == module
        and (kind is None or r.name.startswith(kind + " "))
    ]
    assert len(found) == 1, f"expected one rule record for {module}, got {found!r}"
    return found[0]


def _tracker(make_package: PackageFactory) -> str:
    """A package whose RUNS list other packages append to, to count module executions."""
    return make_package({"__init__.py": "RUNS = []\n"})


def _gone(name: str) -> None:
    """Forget a module that a test imported outside make_package's cleanup (absent names)."""
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


class _RulesPlugin:
    """A plugin object handing rule objects to a Patcher through the hook contract."""

    def __init__(self, rules: list[ImportRule]) -> None:
        self._rules = rules

    @hookimpl
    def register_import_rules(self) -> list[ImportRule]:
        return self._rules


def _plugin_patcher(*rules: ImportRule) -> Patcher:
    return Patcher(extra_plugins=[("test-rules", _RulesPlugin(list(rules)))])


# =============================================================================== skip_import


def test_skip_import_registering_imports_nothing(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Declaring a skip rule imports neither the module nor its parent and leaves it PENDING."""
    tracker = _tracker(make_package)
    pkg = make_package(
        {
            "__init__.py": f"import {tracker}\n{tracker}.RUNS.append('init')\n",
            "heavy.py": "raise RuntimeError('heavy must not run')\n",
        }
    )
    name = _absent()
    patcher.skip_import(name, f"{pkg}.heavy")
    assert name not in sys.modules
    assert pkg not in sys.modules
    assert _rule_record(patcher, name).status is Status.PENDING
    assert _rule_record(patcher, f"{pkg}.heavy").status is Status.PENDING


def test_skip_import_serves_stubs_at_any_depth(patcher: Patcher) -> None:
    """import x, import x.a.b.c and from x.deep.mod import thing all give stubs."""
    name = _absent()
    patcher.skip_import(name)

    top = importlib.import_module(name)
    assert is_stub(top)
    assert _rule_record(patcher, name).status is Status.APPLIED

    deep = importlib.import_module(f"{name}.a.b.c")
    assert is_stub(deep)
    assert deep.__name__ == f"{name}.a.b.c"
    assert sys.modules[f"{name}.a.b.c"] is deep
    assert top.a.b.c is deep, "each stub submodule is reachable from its parent"

    namespace: dict[str, Any] = {}
    exec(f"from {name}.deep.mod import thing", namespace)
    thing = namespace["thing"]
    assert is_stub(thing)
    assert sys.modules[f"{name}.deep.mod"].thing is thing


def test_skip_import_find_spec_returns_a_spec_without_raising(patcher: Patcher) -> None:
    """importlib.util.find_spec finds a skipped module (and its submodules) before and after import."""
    name = _absent()
    assert importlib.util.find_spec(name) is None
    patcher.skip_import(name)

    before = importlib.util.find_spec(name)
    assert before is not None and before.name == name
    assert name not in sys.modules, "probing must not import"
    sub_before = importlib.util.find_spec(f"{name}.ops")
    assert sub_before is not None and sub_before.name == f"{name}.ops"

    importlib.import_module(name)
    after = importlib.util.find_spec(name)
    assert after is not None and after.name == name
    assert importlib.util.find_spec(f"{name}.ops.triton") is not None


def test_skip_import_metadata_reports_no_distribution(patcher: Patcher) -> None:
    """importlib.metadata still finds no distribution, so availability probes say 'unavailable'."""
    name = _absent()
    patcher.skip_import(name)
    importlib.import_module(name)

    def is_available(pkg: str) -> bool:  # the transformers _is_package_available idiom
        if importlib.util.find_spec(pkg) is None:
            return False
        try:
            importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return False
        return True

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version(name)
    assert is_available(name) is False


def test_skip_import_real_parent_runs_once_and_only_the_leaf_is_stubbed(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A real parent package is imported normally (its __init__ runs once); only the named leaf is a stub."""
    tracker = _tracker(make_package)
    pkg = make_package(
        {
            "__init__.py": f"import {tracker}\n{tracker}.RUNS.append('pkg')\nREAL = 'pkg'\n",
            "sub/__init__.py": f"import {tracker}\n{tracker}.RUNS.append('sub')\nREAL = 'sub'\n",
            "sub/blocked.py": "raise RuntimeError('the skipped module must never run')\n",
            "sub/sibling.py": "VALUE = 7\n",
        }
    )
    patcher.skip_import(f"{pkg}.sub.blocked")

    importlib.import_module(f"{pkg}.sub.blocked")
    runs = sys.modules[tracker].RUNS
    assert runs == ["pkg", "sub"]
    parent = sys.modules[pkg]
    sub = sys.modules[f"{pkg}.sub"]
    assert not is_stub(parent) and parent.REAL == "pkg"
    assert not is_stub(sub) and sub.REAL == "sub"
    assert is_stub(sys.modules[f"{pkg}.sub.blocked"])
    assert importlib.import_module(f"{pkg}.sub.sibling").VALUE == 7
    assert is_stub(importlib.import_module(f"{pkg}.sub.blocked.deeper"))
    assert runs == ["pkg", "sub"], "parents ran exactly once"


def test_skip_import_leaf_is_reachable_through_its_parents(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """After 'import pkg.sub.blocked', the expression pkg.sub.blocked is the stub module."""
    pkg = make_package(
        {
            "sub/blocked.py": "raise RuntimeError('the skipped module must never run')\n",
        }
    )
    patcher.skip_import(f"{pkg}.sub.blocked")
    namespace: dict[str, Any] = {}
    exec(
        f"import {pkg}.sub.blocked\nresult = {pkg}.sub.blocked\nattr = {pkg}.sub.blocked.Thing",
        namespace,
    )
    assert namespace["result"] is sys.modules[f"{pkg}.sub.blocked"]
    assert is_stub(namespace["result"])
    assert is_stub(namespace["attr"])


def test_skip_import_of_an_imported_module_is_skipped_and_leaves_it_alone(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A skip rule for an already-imported module records SKIPPED with a reason and changes nothing."""
    pkg = make_package({"mod.py": "VALUE = 42\n"})
    mod = importlib.import_module(f"{pkg}.mod")
    patcher.skip_import(f"{pkg}.mod")

    record = _rule_record(patcher, f"{pkg}.mod")
    assert record.status is Status.SKIPPED
    assert record.reason and "already imported" in record.reason
    assert sys.modules[f"{pkg}.mod"] is mod
    assert importlib.import_module(f"{pkg}.mod") is mod
    assert mod.VALUE == 42 and not is_stub(mod)
    assert not hub.serves(f"{pkg}.mod")


def test_skip_import_revert_removes_stubs_and_the_real_module_imports(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """revert() removes stubs from sys.modules and from parents; the real module then imports."""
    pkg = make_package({"sub/leaf.py": "VALUE = 'real'\n", "sub/leaf_child.py": ""})
    patcher.skip_import(f"{pkg}.sub.leaf")
    importlib.import_module(f"{pkg}.sub.leaf.inner")
    sub = sys.modules[f"{pkg}.sub"]
    assert is_stub(vars(sub)["leaf"])

    report = patcher.revert()
    assert f"{pkg}.sub.leaf" not in sys.modules
    assert f"{pkg}.sub.leaf.inner" not in sys.modules
    assert "leaf" not in vars(sub)
    assert [r.status for r in report.records if r.kind == "rule"] == [Status.REVERTED]

    leaf = importlib.import_module(f"{pkg}.sub.leaf")
    assert not is_stub(leaf)
    assert leaf.VALUE == "real"
    assert sub.leaf is leaf


def test_skip_import_revert_of_an_absent_module_leaves_nothing(patcher: Patcher) -> None:
    """After revert, a skipped absent module is absent again (ModuleNotFoundError, no find_spec)."""
    name = _absent()
    patcher.skip_import(name)
    importlib.import_module(f"{name}.x.y")
    patcher.revert()
    assert not [k for k in sys.modules if k == name or k.startswith(name + ".")]
    assert importlib.util.find_spec(name) is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def test_revert_leaves_a_module_someone_else_put_under_a_served_name(
    patcher: Patcher,
) -> None:
    """revert() takes out only the modules the rule served: one a test or the program put
    in sys.modules under that name since (a stand-in) is theirs, and stays."""
    name = _absent()
    patcher.skip_import(name)
    served = importlib.import_module(name)
    assert is_stub(served)
    stand_in = types.ModuleType(name)
    sys.modules[name] = stand_in
    try:
        patcher.revert()
        assert sys.modules.get(name) is stand_in
    finally:
        sys.modules.pop(name, None)


def test_skip_import_rule_class_through_a_plugin(make_package: PackageFactory) -> None:
    """A SkipImport object handed over by a plugin acts from apply() and is undone by revert()."""
    pkg = make_package({"heavy.py": "raise RuntimeError('must not run')\n"})
    p = _plugin_patcher(SkipImport(f"{pkg}.heavy"))
    assert not hub.serves(f"{pkg}.heavy"), "a plugin's rule waits for apply()"
    try:
        report = p.apply()
        record = _rule_record(p, f"{pkg}.heavy")
        assert record.status is Status.PENDING
        assert record.provenance.plugin == "test-rules"
        heavy = importlib.import_module(f"{pkg}.heavy")
        assert is_stub(heavy)
        assert report.get(f"skip {pkg}.heavy").status is Status.APPLIED
    finally:
        p.revert()
    assert f"{pkg}.heavy" not in sys.modules
    with pytest.raises(RuntimeError, match="must not run"):
        importlib.import_module(f"{pkg}.heavy")


def test_skip_rule_rejects_invalid_names() -> None:
    """SkipImport needs a dotted module name."""
    for bad in ("", "1abc", "a..b", "a-b", None, 3):
        with pytest.raises(PatchDefinitionError):
            SkipImport(bad)  # type: ignore[arg-type]


# ============================================================================ replace_import


def test_replace_import_with_exports_only(patcher: Patcher) -> None:
    """replace_import(name, None, X=1) serves a new module holding exactly the exports."""
    name = _absent()
    patcher.replace_import(name, None, X=1, helper=len)
    assert name not in sys.modules
    assert _rule_record(patcher, name).status is Status.PENDING

    mod = importlib.import_module(name)
    assert mod.X == 1 and mod.helper is len
    assert mod.__name__ == name
    assert isinstance(mod.__spec__, importlib.machinery.ModuleSpec) and mod.__spec__.name == name
    assert _rule_record(patcher, name).status is Status.APPLIED
    with pytest.raises(AttributeError):
        _ = mod.missing


def test_replace_import_with_a_module_object_serves_that_object(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A module object is served as is: identity kept, __name__ and __spec__ untouched."""
    impl_pkg = make_package({"impl.py": "def kernel():\n    return 'npu'\n"})
    target_pkg = make_package(
        {"_ext.py": "raise RuntimeError('the CUDA extension must never load')\n"}
    )
    impl = importlib.import_module(f"{impl_pkg}.impl")
    spec_before = impl.__spec__
    loader_before = impl.__loader__
    patcher.replace_import(f"{target_pkg}._ext", impl)

    served = importlib.import_module(f"{target_pkg}._ext")
    assert served is impl
    assert sys.modules[f"{target_pkg}._ext"] is impl
    assert impl.__name__ == f"{impl_pkg}.impl"
    assert impl.__spec__ is spec_before and impl.__spec__.name == f"{impl_pkg}.impl"
    assert impl.__loader__ is loader_before
    namespace: dict[str, Any] = {}
    exec(f"from {target_pkg} import _ext\nfrom {target_pkg}._ext import kernel", namespace)
    assert namespace["_ext"] is impl
    assert namespace["kernel"]() == "npu"
    assert sys.modules[f"{impl_pkg}.impl"] is impl


def test_replace_import_with_an_unnamed_module_object(patcher: Patcher) -> None:
    """A synthesized module object (no spec) is served with its own name and spec left alone."""
    made = types.ModuleType("elsewhere_made")
    made.VALUE = 5  # type: ignore[attr-defined]
    name = _absent()
    patcher.replace_import(name, made)
    assert importlib.import_module(name) is made
    assert made.__name__ == "elsewhere_made"
    assert made.__spec__ is None


def test_replace_import_factory_runs_on_first_import_only(patcher: Patcher) -> None:
    """A factory is not called at declaration, then exactly once however often the module is imported."""
    calls: list[str] = []

    def factory(fullname: str) -> types.ModuleType:
        calls.append(fullname)
        mod = types.ModuleType(fullname)
        mod.VALUE = len(calls)  # type: ignore[attr-defined]
        return mod

    name = _absent()
    patcher.replace_import(name, factory, EXTRA="x")
    assert calls == []
    first = importlib.import_module(name)
    second = importlib.import_module(name)
    namespace: dict[str, Any] = {}
    exec(f"import {name}\nfrom {name} import VALUE", namespace)
    assert calls == [name]
    assert first is second is namespace[name]
    assert first.VALUE == 1 and namespace["VALUE"] == 1
    assert first.EXTRA == "x"


def test_replace_import_factory_returning_a_foreign_module(patcher: Patcher) -> None:
    """A factory's module with another __name__ is served as that very object, name untouched."""
    made = types.ModuleType("synthesized_elsewhere")
    made.K = 1  # type: ignore[attr-defined]
    calls: list[str] = []

    def factory(fullname: str) -> types.ModuleType:
        calls.append(fullname)
        return made

    name = _absent()
    patcher.replace_import(name, factory)
    assert importlib.import_module(name) is made
    assert importlib.import_module(name) is made
    assert calls == [name]
    assert made.__name__ == "synthesized_elsewhere"


def test_replace_import_factory_returning_a_mapping(patcher: Patcher) -> None:
    """A factory returning a mapping fills a fresh module; exports are added on top."""
    calls: list[str] = []

    def factory(fullname: str) -> dict[str, Any]:
        calls.append(fullname)
        return {"A": 1, "B": 2}

    name = _absent()
    patcher.replace_import(name, factory, B=20)
    mod = importlib.import_module(name)
    importlib.import_module(name)
    assert calls == [name]
    assert (mod.A, mod.B) == (1, 20)
    assert mod.__name__ == name


def test_replace_import_factory_named_by_string(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """'pkg.mod:factory' names a factory imported and called on first import only."""
    fpkg = make_package(
        {
            "factories.py": """
                CALLS = []
                def build(fullname):
                    CALLS.append(fullname)
                    return {"ANSWER": 42}
            """,
        }
    )
    name = _absent()
    patcher.replace_import(name, f"{fpkg}.factories:build")
    assert f"{fpkg}.factories" not in sys.modules, "declaring imports nothing"
    mod = importlib.import_module(name)
    importlib.import_module(name)
    assert mod.ANSWER == 42
    calls = sys.modules[f"{fpkg}.factories"].CALLS
    assert calls == [name]


def test_replace_import_with_a_base_module_falls_back_to_it(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A base module name: the served module holds the exports and falls back to the base's attributes."""
    bpkg = make_package({"base.py": "def shared():\n    return 'base'\nOVERRIDDEN = 'base'\n"})
    name = _absent()
    patcher.replace_import(name, f"{bpkg}.base", OVERRIDDEN="export")
    assert f"{bpkg}.base" not in sys.modules
    mod = importlib.import_module(name)
    base = sys.modules[f"{bpkg}.base"]
    assert mod is not base
    assert mod.__name__ == name
    assert mod.OVERRIDDEN == "export"
    assert base.OVERRIDDEN == "base", "the base module is not modified"
    assert mod.shared is base.shared and mod.shared() == "base"
    namespace: dict[str, Any] = {}
    exec(f"from {name} import shared", namespace)
    assert namespace["shared"] is base.shared
    with pytest.raises(AttributeError, match=name):
        _ = mod.not_anywhere


def test_replace_import_never_executes_the_original(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """The replaced module's own file never runs."""
    pkg = make_package({"mod.py": "raise RuntimeError('the original must never run')\n"})
    patcher.replace_import(f"{pkg}.mod", None, OK=True)
    mod = importlib.import_module(f"{pkg}.mod")
    assert mod.OK is True
    assert getattr(mod, "__file__", None) is None


def test_replace_import_runs_the_real_parent_normally(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """The parent package's __init__ runs once, for real, and the replacement is its attribute."""
    tracker = _tracker(make_package)
    pkg = make_package(
        {
            "__init__.py": f"import {tracker}\n{tracker}.RUNS.append('init')\nPARENT = True\n",
            "mod.py": "raise RuntimeError('the original must never run')\n",
        }
    )
    patcher.replace_import(f"{pkg}.mod", None, X=1)
    namespace: dict[str, Any] = {}
    exec(f"from {pkg} import mod\nfrom {pkg}.mod import X", namespace)
    parent = sys.modules[pkg]
    assert parent.PARENT is True
    assert sys.modules[tracker].RUNS == ["init"]
    assert namespace["mod"] is sys.modules[f"{pkg}.mod"] is parent.mod
    assert namespace["X"] == 1


def test_replace_import_parent_importing_the_module_itself(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A parent whose __init__ does 'from .mod import X' gets the replacement's X."""
    pkg = make_package(
        {
            "__init__.py": "from .mod import X\n",
            "mod.py": "raise RuntimeError('the original must never run')\n",
        }
    )
    patcher.replace_import(f"{pkg}.mod", None, X="replaced")
    assert importlib.import_module(pkg).X == "replaced"


def test_replace_import_does_not_swallow_the_parents_errors(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An exception raised by the real parent's __init__ reaches the importer unchanged."""
    pkg = make_package(
        {
            "__init__.py": "raise ValueError('parent is broken')\n",
            "mod.py": "X = 'original'\n",
        }
    )
    patcher.replace_import(f"{pkg}.mod", None, X=1)
    with pytest.raises(ValueError, match="parent is broken"):
        importlib.import_module(f"{pkg}.mod")
    assert pkg not in sys.modules
    assert f"{pkg}.mod" not in sys.modules
    with pytest.raises(ValueError, match="parent is broken"):
        exec(f"from {pkg} import mod", {})


def test_replace_import_failing_factory_raises_import_rule_error(patcher: Patcher) -> None:
    """A raising factory makes the import raise ImportRuleError (an ImportError) and FAILs the record."""

    def factory(fullname: str) -> types.ModuleType:
        raise OSError("no such library: libfoo.so")

    name = _absent()
    patcher.replace_import(name, factory)
    with pytest.raises(ImportRuleError, match="libfoo") as info:
        importlib.import_module(name)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value.__cause__, OSError)
    assert name not in sys.modules
    record = _rule_record(patcher, name)
    assert record.status is Status.FAILED
    assert record.reason and "libfoo" in record.reason
    # the usual optional-dependency idiom degrades gracefully
    try:
        importlib.import_module(name)
        available = True
    except ImportError:
        available = False
    assert available is False


def test_replace_import_factory_of_the_wrong_signature_is_told_how_it_is_called(
    patcher: Patcher,
) -> None:
    name = _absent()
    patcher.replace_import(name, lambda: types.ModuleType("made"))
    with pytest.raises(ImportRuleError, match=rf"a factory is called as factory\('{name}'\)"):
        importlib.import_module(name)
    assert name not in sys.modules


def test_replace_import_factory_returning_garbage_fails(patcher: Patcher) -> None:
    """A factory returning neither a module nor a mapping is a FAILED rule and an ImportRuleError."""
    name = _absent()
    patcher.replace_import(name, lambda fullname: 42)
    with pytest.raises(ImportRuleError, match="int"):
        importlib.import_module(name)
    assert _rule_record(patcher, name).status is Status.FAILED


def test_replace_import_of_an_imported_module_is_skipped(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A replace rule for an already-imported module records SKIPPED with a reason and changes nothing."""
    pkg = make_package({"mod.py": "X = 'original'\n"})
    mod = importlib.import_module(f"{pkg}.mod")
    patcher.replace_import(f"{pkg}.mod", None, X="replaced")
    record = _rule_record(patcher, f"{pkg}.mod")
    assert record.status is Status.SKIPPED
    assert record.reason and "already imported" in record.reason
    assert importlib.import_module(f"{pkg}.mod") is mod
    assert mod.X == "original"


def test_replace_import_revert_brings_back_the_real_module(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """After revert the replacement is gone from sys.modules and the parent; the next import is real."""
    pkg = make_package({"mod.py": "X = 'original'\n"})
    patcher.replace_import(f"{pkg}.mod", None, X="replaced")
    assert importlib.import_module(f"{pkg}.mod").X == "replaced"
    parent = sys.modules[pkg]
    assert parent.mod.X == "replaced"

    report = patcher.revert()
    assert f"{pkg}.mod" not in sys.modules
    assert "mod" not in vars(parent)
    assert [r.status for r in report.records if r.kind == "rule"] == [Status.REVERTED]
    real = importlib.import_module(f"{pkg}.mod")
    assert real.X == "original"
    assert parent.mod is real


def test_replace_import_revert_of_a_served_module_object_keeps_it(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Reverting a module-object replacement unbinds the alias only; the object's own entry stays."""
    impl_pkg = make_package({"impl.py": "V = 1\n"})
    target_pkg = make_package({"mod.py": "V = 'original'\n"})
    impl = importlib.import_module(f"{impl_pkg}.impl")
    patcher.replace_import(f"{target_pkg}.mod", impl)
    assert importlib.import_module(f"{target_pkg}.mod") is impl
    patcher.revert()
    assert sys.modules[f"{impl_pkg}.impl"] is impl
    assert sys.modules[impl_pkg].impl is impl
    assert importlib.import_module(f"{target_pkg}.mod").V == "original"


def test_replace_rule_rejects_invalid_arguments(patcher: Patcher) -> None:
    """Invalid module names or replacement kinds raise PatchDefinitionError.

    (A module object with exports is the DrivingSDK patcher's "module plus override":
    tests/test_mx_driving_compat_imports.py.)
    """
    with pytest.raises(PatchDefinitionError):
        patcher.replace_import("", None)
    with pytest.raises(PatchDefinitionError):
        patcher.replace_import("not a name", None)
    with pytest.raises(PatchDefinitionError):
        patcher.replace_import(_absent(), 42)
    with pytest.raises(PatchDefinitionError):
        patcher.replace_import(_absent(), "bad base name!")
    with pytest.raises(PatchDefinitionError):
        ReplaceImport("a..b")
    assert patcher.report.records == [], "a rejected rule is not registered"


def test_replace_rule_class_through_a_plugin(make_package: PackageFactory) -> None:
    """A ReplaceImport object handed over by a plugin serves its module after apply() until revert()."""
    pkg = make_package({"mod.py": "X = 'original'\n"})
    p = _plugin_patcher(ReplaceImport(f"{pkg}.mod", None, X="plugin"))
    try:
        p.apply()
        assert _rule_record(p, f"{pkg}.mod").status is Status.PENDING
        assert importlib.import_module(f"{pkg}.mod").X == "plugin"
        assert _rule_record(p, f"{pkg}.mod").status is Status.APPLIED
    finally:
        p.revert()
    assert importlib.import_module(f"{pkg}.mod").X == "original"


# ================================================================ replace_import(when_missing)


def test_when_missing_imports_the_real_module_where_it_exists(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A real module present: it is imported, never the replacement; the record says why."""
    pkg = make_package({"_ext.py": "X = 'real'\n"})
    built: list[str] = []

    def factory(name: str) -> dict[str, Any]:
        built.append(name)
        return {"X": "served"}

    patcher.replace_import(f"{pkg}._ext", factory, when_missing=True)
    record = _rule_record(patcher, f"{pkg}._ext")
    assert record.status is Status.PENDING
    assert record.reason and "if no real one is installed" in record.reason
    assert importlib.util.find_spec(f"{pkg}._ext").origin.endswith("_ext.py")  # type: ignore[union-attr]
    module = importlib.import_module(f"{pkg}._ext")
    assert module.X == "real"
    assert built == []
    assert record.status is Status.SKIPPED
    assert record.reason and f"the real {pkg}._ext exists" in record.reason
    assert "_ext.py" in record.reason
    assert "(when missing)" in record.name


def test_when_missing_serves_the_replacement_where_the_real_one_is_absent(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """No real module: the replacement is served, find_spec (pkgutil probes) finds it, revert removes it."""
    pkg = make_package({"__init__.py": ""})
    patcher.replace_import(f"{pkg}._ext", None, when_missing=True, X="served")
    record = _rule_record(patcher, f"{pkg}._ext")
    spec = importlib.util.find_spec(f"{pkg}._ext")
    assert spec is not None and spec.loader is not None  # pkgutil.find_loader(...) is truthy
    assert record.status is Status.PENDING
    assert importlib.import_module(f"{pkg}._ext").X == "served"
    assert record.status is Status.APPLIED
    assert record.reason == f"no real {pkg}._ext is installed"

    report = patcher.revert()
    assert f"{pkg}._ext" not in sys.modules
    assert [r.status for r in report.records if r.kind == "rule"] == [Status.REVERTED]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{pkg}._ext")


def test_when_missing_with_an_already_imported_real_module(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """The real module imported before the rule: skipped, saying the real one is in use."""
    pkg = make_package({"_ext.py": "X = 'real'\n"})
    real = importlib.import_module(f"{pkg}._ext")
    patcher.replace_import(f"{pkg}._ext", None, when_missing=True, X="served")
    record = _rule_record(patcher, f"{pkg}._ext")
    assert record.status is Status.SKIPPED
    assert record.reason and f"the real {pkg}._ext exists" in record.reason
    assert importlib.import_module(f"{pkg}._ext") is real


def test_when_missing_keeps_the_real_modules_watches(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A patch waiting for the real module is installed on it when the rule steps aside."""
    pkg = make_package({"_ext.py": "def f():\n    return 'real'\n"})
    patcher.replace_import(f"{pkg}._ext", None, when_missing=True, f=lambda: "served")
    patcher.add(AtomicPatch(f"{pkg}._ext.f", lambda: "patched"))
    patcher.apply()
    assert importlib.import_module(f"{pkg}._ext").f() == "patched"
    assert _rule_record(patcher, f"{pkg}._ext").status is Status.SKIPPED


def test_when_missing_through_a_plugin_and_its_locate_imports_nothing(
    make_package: PackageFactory,
) -> None:
    """A plugin's when_missing rule; locate_real() finds the real module without importing its parent."""
    pkg = make_package({"__init__.py": "RAN = True\n", "_ext.py": "X = 'real'\n"})
    present = ReplaceImport(f"{pkg}._ext", None, when_missing=True, X="served")
    absent = ReplaceImport(f"{pkg}._other", None, when_missing=True, X="served")
    nowhere = ReplaceImport(f"{_absent()}._ext", None, when_missing=True)
    installed, origin = present.locate_real()
    assert installed and origin is not None and origin.endswith("_ext.py")
    assert absent.locate_real() == (True, None)
    assert nowhere.locate_real() == (False, None)
    assert pkg not in sys.modules, "locating the real module imports nothing"
    p = _plugin_patcher(present, absent)
    try:
        p.apply()
        assert importlib.import_module(f"{pkg}._ext").X == "real"
        assert importlib.import_module(f"{pkg}._other").X == "served"
        assert _rule_record(p, f"{pkg}._ext").status is Status.SKIPPED
        assert _rule_record(p, f"{pkg}._other").status is Status.APPLIED
    finally:
        p.revert()
    assert f"{pkg}._other" not in sys.modules
    assert importlib.import_module(f"{pkg}._ext").X == "real"


def test_when_missing_rejects_a_non_boolean() -> None:
    """when_missing is a switch, not an export: anything but a bool is a definition error."""
    with pytest.raises(PatchDefinitionError):
        ReplaceImport(_absent(), None, when_missing="yes")


# ============================================================================= inject_import


def test_inject_import_is_lazy(make_package: PackageFactory, patcher: Patcher) -> None:
    """Neither source nor target is imported at declaration; the source is imported with the target."""
    src = make_package({"__init__.py": "def helper():\n    return 'injected'\n"})
    dst = make_package({"api.py": "OWN = 1\n"})
    patcher.inject_import(src, "helper", f"{dst}.api")
    assert src not in sys.modules and f"{dst}.api" not in sys.modules
    assert _rule_record(patcher, f"{dst}.api").status is Status.PENDING

    api = importlib.import_module(f"{dst}.api")
    assert src in sys.modules
    assert api.helper is sys.modules[src].helper
    assert api.helper() == "injected"
    namespace: dict[str, Any] = {}
    exec(f"from {dst}.api import helper", namespace)
    assert namespace["helper"]() == "injected"
    assert _rule_record(patcher, f"{dst}.api").status is Status.APPLIED


def test_inject_import_into_an_imported_target_acts_at_once(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An already-imported target receives the name immediately."""
    src = make_package({"__init__.py": "VALUE = 3\n"})
    dst = make_package({"__init__.py": ""})
    target = importlib.import_module(dst)
    patcher.inject_import(src, "VALUE", dst)
    assert target.VALUE == 3
    assert _rule_record(patcher, dst).status is Status.APPLIED


def test_inject_import_never_overwrites(make_package: PackageFactory, patcher: Patcher) -> None:
    """An attribute the target already defines is kept; the record says SKIPPED."""
    src = make_package({"__init__.py": "helper = 'from source'\n"})
    dst = make_package({"__init__.py": "helper = 'own'\n__all__ = ['helper']\n"})
    patcher.inject_import(src, "helper", dst)
    target = importlib.import_module(dst)
    assert target.helper == "own"
    assert target.__all__ == ["helper"]
    record = _rule_record(patcher, dst)
    assert record.status is Status.SKIPPED
    assert record.reason and "not overwritten" in record.reason
    patcher.revert()
    assert target.helper == "own"


@pytest.mark.parametrize("kind", ["list", "tuple"])
def test_inject_import_extends_all_and_revert_restores_it(
    make_package: PackageFactory, patcher: Patcher, kind: str
) -> None:
    """The injected name is appended to a list/tuple __all__; revert removes it and restores __all__."""
    src = make_package({"__init__.py": "def helper():\n    return 1\n"})
    literal = "['own']" if kind == "list" else "('own',)"
    dst = make_package({"__init__.py": f"own = 0\n__all__ = {literal}\n"})
    patcher.inject_import(src, "helper", dst)
    target = importlib.import_module(dst)
    original_all = vars(target)["__all__"]
    assert list(original_all) == ["own", "helper"]
    assert type(original_all).__name__ == kind
    namespace: dict[str, Any] = {}
    exec(f"from {dst} import *", namespace)
    assert namespace["helper"]() == 1

    patcher.revert()
    assert "helper" not in vars(target)
    assert list(target.__all__) == ["own"]
    assert type(target.__all__).__name__ == kind
    namespace = {}
    exec(f"from {dst} import *", namespace)
    assert "helper" not in namespace


def test_inject_import_restores_the_same_all_object(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Revert puts back the very __all__ list the module had, unmodified."""
    src = make_package({"__init__.py": "helper = 1\n"})
    dst = make_package({"__init__.py": "__all__ = ['a']\na = 0\n"})
    target = importlib.import_module(dst)
    before = target.__all__
    patcher.inject_import(src, "helper", dst)
    assert target.__all__ == ["a", "helper"]
    assert before == ["a"], "the original list is not mutated in place"
    patcher.revert()
    assert target.__all__ is before


def test_inject_import_into_a_stub(make_package: PackageFactory, patcher: Patcher) -> None:
    """A name can be injected into a module that skip_import serves as a stub."""
    src = make_package({"__init__.py": "def real_kernel():\n    return 'npu'\n"})
    name = _absent()
    patcher.skip_import(name)
    patcher.inject_import(src, "real_kernel", name)
    stub = importlib.import_module(name)
    assert is_stub(stub)
    assert not is_stub(stub.real_kernel)
    assert stub.real_kernel() == "npu"
    assert "real_kernel" in stub.__all__
    namespace: dict[str, Any] = {}
    exec(f"from {name} import real_kernel, other", namespace)
    assert namespace["real_kernel"]() == "npu"
    assert is_stub(namespace["other"])


def test_inject_import_missing_source_module_is_skipped(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A source module that does not exist makes the rule SKIPPED; the target imports fine."""
    dst = make_package({"__init__.py": "OWN = 1\n"})
    missing = _absent()
    patcher.inject_import(missing, "helper", dst)
    target = importlib.import_module(dst)
    assert target.OWN == 1 and not hasattr(target, "helper")
    record = _rule_record(patcher, dst)
    assert record.status is Status.SKIPPED
    assert record.reason and missing in record.reason


def test_inject_import_missing_name_fails(make_package: PackageFactory, patcher: Patcher) -> None:
    """A source module without the name makes the rule FAILED; the target imports fine."""
    src = make_package({"__init__.py": "other = 1\n"})
    dst = make_package({"__init__.py": "OWN = 1\n"})
    patcher.inject_import(src, "helper", dst)
    target = importlib.import_module(dst)
    assert target.OWN == 1 and not hasattr(target, "helper")
    record = _rule_record(patcher, dst)
    assert record.status is Status.FAILED
    assert record.reason and "helper" in record.reason


def test_inject_import_revert_before_import_leaves_no_watch(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Reverting a pending inject rule removes its watch; the later import is untouched."""
    src = make_package({"__init__.py": "helper = 1\n"})
    dst = make_package({"__init__.py": ""})
    patcher.inject_import(src, "helper", dst)
    patcher.revert()
    target = importlib.import_module(dst)
    assert not hasattr(target, "helper")
    assert src not in sys.modules


@pytest.fixture
def namespace_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A PEP 420 namespace package (a directory without __init__.py) on sys.path; returns its name."""
    name = f"apns{next(_ids)}_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "nsroot"
    (root / name).mkdir(parents=True)
    (root / name / "data.txt").write_text("ns-data")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield name
    _gone(name)


def test_inject_import_into_a_namespace_package(
    namespace_package: str, make_package: PackageFactory, patcher: Patcher
) -> None:
    """A namespace package (no __init__.py) as target still receives the injected name on import."""
    src = make_package({"__init__.py": "helper = 'h'\n"})
    patcher.inject_import(src, "helper", namespace_package)
    target = importlib.import_module(namespace_package)
    assert getattr(target, "helper", None) == "h"
    assert _rule_record(patcher, namespace_package).status is Status.APPLIED


def test_inject_rule_class_through_a_plugin(make_package: PackageFactory) -> None:
    """An InjectImport object handed over by a plugin acts on import after apply() and reverts."""
    src = make_package({"__init__.py": "helper = 'h'\n"})
    dst = make_package({"__init__.py": "__all__ = []\n"})
    p = _plugin_patcher(InjectImport(src, "helper", dst))
    try:
        p.apply()
        target = importlib.import_module(dst)
        assert target.helper == "h" and target.__all__ == ["helper"]
    finally:
        p.revert()
    assert not hasattr(target, "helper") and target.__all__ == []


def test_inject_rule_rejects_invalid_arguments() -> None:
    """InjectImport needs dotted module names and an identifier."""
    with pytest.raises(PatchDefinitionError):
        InjectImport("a.b", "not-an-identifier", "c")
    with pytest.raises(PatchDefinitionError):
        InjectImport("", "x", "c")
    with pytest.raises(PatchDefinitionError):
        InjectImport("a", "x", "c..d")


# ======================================================================================= hub


def test_watched_module_keeps_its_real_loader_and_resources(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """After a watched import, __loader__ and __spec__.loader are the real loader; importlib.resources works."""
    pkg = make_package(
        {
            "__init__.py": """
                import importlib.resources
                def compute():
                    return 'orig'
                DURING_IMPORT = (importlib.resources.files(__name__) / "data.txt").read_text()
            """,
            "data.txt": "payload\n",
        }
    )
    patcher.add(AtomicPatch(f"{pkg}.compute", lambda: "new")).apply()
    assert hub.installed
    mod = importlib.import_module(pkg)
    assert mod.compute() == "new"
    assert mod.DURING_IMPORT == "payload\n"
    assert isinstance(mod.__loader__, importlib.machinery.SourceFileLoader)
    assert mod.__spec__.loader is mod.__loader__
    assert (importlib.resources.files(pkg) / "data.txt").read_text() == "payload\n"
    assert mod.__loader__.get_data(mod.__file__.replace("__init__.py", "data.txt")) == b"payload\n"


def test_watched_module_loader_via_hub_watch(make_package: PackageFactory) -> None:
    """A direct hub watch fires once after the body ran, and the module keeps the real loader."""
    pkg = make_package({"__init__.py": "", "mod.py": "VALUE = 1\n", "res.txt": "r"})
    seen: list[types.ModuleType] = []
    handle = hub.watch(f"{pkg}.mod", seen.append)
    try:
        mod = importlib.import_module(f"{pkg}.mod")
        assert seen == [mod] and mod.VALUE == 1
        assert type(mod.__loader__) is importlib.machinery.SourceFileLoader
        assert type(mod.__spec__.loader) is importlib.machinery.SourceFileLoader
        assert (importlib.resources.files(pkg) / "res.txt").read_text() == "r"
    finally:
        hub.unwatch(handle)


def test_hub_watch_fires_for_a_namespace_package(namespace_package: str) -> None:
    """A watched namespace package notifies its callback once imported and keeps its loader and resources."""
    seen: list[types.ModuleType] = []
    handle = hub.watch(namespace_package, seen.append)
    try:
        mod = importlib.import_module(namespace_package)
        assert seen == [mod]
        # The import system's own namespace loader (_NamespaceLoader before 3.11).
        assert type(mod.__loader__).__name__ in ("NamespaceLoader", "_NamespaceLoader")
        assert (importlib.resources.files(namespace_package) / "data.txt").read_text() == "ns-data"
    finally:
        hub.unwatch(handle)


def test_served_module_object_keeps_its_loader_and_resources(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A real package served under another name keeps its own loader; its resources stay readable."""
    impl_pkg = make_package({"__init__.py": "", "data.txt": "impl-data"})
    impl = importlib.import_module(impl_pkg)
    name = _absent()
    patcher.replace_import(name, impl)
    served = importlib.import_module(name)
    assert served is impl
    assert isinstance(served.__loader__, importlib.machinery.SourceFileLoader)
    assert (importlib.resources.files(served) / "data.txt").read_text() == "impl-data"


def test_run_module_of_a_watched_module(make_package: PackageFactory, patcher: Patcher) -> None:
    """runpy.run_module (python -m) of a watched module runs its code from the real file."""
    pkg = make_package(
        {
            "main.py": """
                import sys
                RESULT = 6 * 7
                RAN_AS = __name__
                DATA = __loader__.get_data(__file__)
            """,
        }
    )
    patcher.add(AtomicPatch(f"{pkg}.main.RESULT", 0)).apply()
    importlib.import_module(pkg)  # the patch now waits for pkg.main itself
    assert f"{pkg}.main" in hub._watches
    assert type(importlib.util.find_spec(f"{pkg}.main").loader).__name__ == "_NotifyingLoader"
    result = runpy.run_module(f"{pkg}.main", run_name="__main__")
    assert result["RESULT"] == 42
    assert result["RAN_AS"] == "__main__"
    assert result["__file__"].endswith("main.py")
    assert b"RESULT = 6 * 7" in result["DATA"]
    spec = result["__spec__"]
    assert spec.name == f"{pkg}.main"


def test_two_rules_for_one_module_say_which_serves_it(make_package: PackageFactory) -> None:
    """The last rule declared for a module serves it; the other one says so (it stayed
    "pending" for ever, silently), and the one serving it warns of the other."""
    pkg = make_package({"sub/__init__.py": "def g():\n    return 'real'\n", "alt.py": "X = 1\n"})
    for two_patchers in (False, True):
        first = Patcher(autoload=False).skip_import(f"{pkg}.sub")
        second = first if not two_patchers else Patcher(autoload=False)
        second.replace_import(f"{pkg}.sub", f"{pkg}.alt")
        try:
            first.apply()
            second.apply()
            module = importlib.import_module(f"{pkg}.sub")
            assert module.X == 1 and not is_stub(module)
            skip = next(r for r in first.report.records if r.name.startswith("skip"))
            replace = next(r for r in second.report.records if r.name.startswith("replace"))
            assert skip.status is Status.SKIPPED
            assert skip.reason == (
                f"superseded: replace {pkg}.sub -> {pkg}.alt serves {pkg}.sub now: "
                "keep one of the two rules"
            )
            assert replace.status is Status.APPLIED
            assert replace.warnings == [f"skip {pkg}.sub was declared too; {skip.reason[12:]}"]
        finally:
            second.revert()
            first.revert()
        assert f"{pkg}.sub" not in sys.modules


def test_hub_leaves_meta_path_when_the_last_rule_goes(make_package: PackageFactory) -> None:
    """The hub is on sys.meta_path while any rule or watch exists and is removed with the last one."""
    assert not hub.installed, "precondition: a clean process has no hub"
    pkg = make_package({"mod.py": "def f():\n    return 1\n"})
    first, second, third = Patcher(), Patcher(), Patcher()
    try:
        first.skip_import(_absent())
        assert hub.installed and sys.meta_path[0] is hub
        second.replace_import(_absent(), None, X=1)
        third.add(AtomicPatch(f"{pkg}.mod.f", lambda: 2)).apply()
        first.revert()
        assert hub.installed
        second.revert()
        assert hub.installed, "the pending patch still needs the hub"
        assert importlib.import_module(f"{pkg}.mod").f() == 2
        assert not hub.installed, "the watch fired and nothing else needs the hub"
        third.revert()
        assert not hub.installed
    finally:
        for p in (first, second, third):
            p.revert()
    assert hub not in sys.meta_path


def test_hub_leaves_meta_path_after_inject_revert(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A pending inject rule's watch is the hub's only reason to stay; revert removes it."""
    assert not hub.installed
    src = make_package({"__init__.py": "x = 1\n"})
    patcher.inject_import(src, "x", _absent())
    assert hub.installed
    patcher.revert()
    assert not hub.installed


def test_callback_sees_a_module_that_replaced_itself(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A package that swaps itself in sys.modules during import (transformers' _LazyModule) is patched as swapped."""
    pkg = make_package(
        {
            "__init__.py": """
                import sys
                import types

                class _LazyModule(types.ModuleType):
                    def __getattr__(self, name):
                        if name == "heavy":
                            value = lambda: "orig"
                            setattr(self, name, value)
                            return value
                        raise AttributeError(name)

                _lazy = _LazyModule(__name__)
                _lazy.__spec__ = __spec__
                _lazy.__file__ = __file__
                _lazy.__path__ = __path__
                _lazy.compute = lambda: "orig"
                sys.modules[__name__] = _lazy
            """,
        }
    )
    seen: list[types.ModuleType] = []
    handle = hub.watch(pkg, seen.append)
    patcher.add(AtomicPatch(f"{pkg}.compute", lambda: "new")).apply()
    try:
        mod = importlib.import_module(pkg)
    finally:
        hub.unwatch(handle)
    assert type(mod).__name__ == "_LazyModule"
    assert sys.modules[pkg] is mod
    assert seen == [mod], "the callback received the replacement object"
    assert mod.compute() == "new"
    assert patcher.report.get(f"{pkg}.compute").status is Status.APPLIED
    patcher.revert()
    assert mod.compute() == "orig"


def test_callback_sees_a_submodule_that_replaced_itself(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """The same holds for a submodule that replaces itself; its parent attribute is the replacement too."""
    pkg = make_package(
        {
            "lazy.py": """
                import sys
                import types
                _real = types.ModuleType(__name__)
                _real.__spec__ = __spec__
                _real.compute = lambda: "orig"
                sys.modules[__name__] = _real
            """,
        }
    )
    patcher.add(AtomicPatch(f"{pkg}.lazy.compute", lambda: "new")).apply()
    namespace: dict[str, Any] = {}
    exec(f"import {pkg}.lazy\nresult = {pkg}.lazy.compute()", namespace)
    assert namespace["result"] == "new"
    assert sys.modules[f"{pkg}.lazy"].compute() == "new"
    patcher.revert()
    assert sys.modules[f"{pkg}.lazy"].compute() == "orig"
