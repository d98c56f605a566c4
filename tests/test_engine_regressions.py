"""Defects found from outside, each pinned by the behaviour a user sees.

* revert() gives the original back to a module that imported a with_imports
  trampoline before its first call, and to a package re-exporting a patched function
  while another patch targets that package;
* a target missing from a module imported after apply() is skipped ("target not
  found") exactly as when the module was imported first -- never pending forever --
  and fails in strict mode;
* in strict mode, a failure while installing during an import that then fails leaves
  no patch of that module reported as applied;
* a ReplaceImport whose replacement cannot be built is FAILED and the real module is
  imported (strict mode raises).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ImportRuleError
from ascend_patch_core import Patcher
from ascend_patch_core import PatchError
from ascend_patch_core import Status


PackageFactory = Callable[..., str]


def imp(name: str) -> types.ModuleType:
    return importlib.import_module(name)


# ----------------------------------------------------------------------------- revert


def test_revert_reaches_a_module_that_imported_the_with_imports_trampoline(
    make_package: PackageFactory,
) -> None:
    """from pkg import f after apply() takes the trampoline; after one call and revert it holds the original."""
    pkg = make_package(
        {
            "core.py": "def f():\n    return 'orig'\n",
            "repl.py": """
                from ascend_patch_core import with_imports

                @with_imports("json")
                def f():
                    return 'patched ' + json.dumps(1)
            """,
            "late.py": "from {name}.core import f\n",
        }
    )
    core = imp(f"{pkg}.core")
    original = core.f
    patcher = Patcher().add(AtomicPatch(f"{pkg}.core.f", f"{pkg}.repl:f"))
    patcher.apply()
    try:
        late = imp(f"{pkg}.late")  # holds the trampoline
        assert late.f() == "patched 1"  # the first call: the slot now holds the function itself
        assert core.f is not late.f
    finally:
        patcher.revert()
    assert core.f is original
    assert late.f is original


def test_revert_reaches_a_package_reexporting_a_patched_function_another_patch_targets(
    make_package: PackageFactory,
) -> None:
    """pkg/__init__ re-exports core.f (patched lazily) and defines g (patched too): revert restores pkg.f."""
    pkg = make_package(
        {
            "__init__.py": "from .core import f\n\ndef g():\n    return 'g'\n",
            "core.py": "def f():\n    return 'orig'\n",
        }
    )
    patcher = Patcher().add(
        AtomicPatch(f"{pkg}.core.f", lambda: "patched f"),
        AtomicPatch(f"{pkg}.g", lambda: "patched g"),
    )
    patcher.apply()
    try:
        package = imp(pkg)
        assert package.f() == "patched f"  # re-exported after the patch landed on core
        assert package.g() == "patched g"
    finally:
        patcher.revert()
    assert package.f() == "orig"
    assert package.f is sys.modules[f"{pkg}.core"].f
    assert package.g() == "g"


# ----------------------------------------------------------------------------- missing targets


@pytest.mark.parametrize(
    "target",
    [
        "{pkg}.core.missing",  # a module imported by its package's __init__
        "{pkg}.missing",  # the package itself
        "{pkg}.core.C.missing",  # a class attribute
        "{pkg}.core.D.x",  # a class that is not there
        "{pkg}.core:D.x",  # the same, module named explicitly
        "{pkg}.sub.missing",  # a subpackage imported explicitly
    ],
)
@pytest.mark.parametrize("imported_first", [True, False])
def test_a_missing_target_is_skipped_whether_its_module_comes_before_or_after_apply(
    make_package: PackageFactory, target: str, imported_first: bool
) -> None:
    """Imported before or after apply(), a missing target ends SKIPPED with "target not found"."""
    pkg = make_package(
        {
            "__init__.py": "from . import core\n",
            "core.py": "class C:\n    def m(self):\n        return 1\n",
            "sub/__init__.py": "",
        }
    )
    path = target.format(pkg=pkg)
    if imported_first:
        imp(pkg), imp(f"{pkg}.sub")
    patcher = Patcher().add(AtomicPatch(path, lambda: 2, name="p"))
    report = patcher.apply()
    try:
        imp(pkg), imp(f"{pkg}.sub")
        record = report.get("p")
        assert record.status is Status.SKIPPED, (record.status, record.reason)
        assert record.reason is not None and record.reason.startswith("target not found")
    finally:
        patcher.revert()


@pytest.mark.parametrize("imported_first", [True, False])
def test_a_missing_target_fails_in_strict_mode(
    make_package: PackageFactory, imported_first: bool
) -> None:
    """strict=True: a target not found is a failure, raised from apply() or from the import."""
    pkg = make_package({"core.py": "def f():\n    return 1\n"})
    if imported_first:
        imp(f"{pkg}.core")
    patcher = Patcher(strict=True).add(AtomicPatch(f"{pkg}.core.gone", lambda: 2, name="p"))
    try:
        if imported_first:
            with pytest.raises(PatchError, match="target not found"):
                patcher.apply()
        else:
            patcher.apply()  # nothing to find yet: the target's module is not imported
            with pytest.raises(PatchError, match="target not found"):
                imp(f"{pkg}.core")
        assert patcher.report.get("p").status is Status.FAILED
    finally:
        patcher.revert()


# ----------------------------------------------------------------------------- strict lazy failures


def test_strict_failure_during_an_import_leaves_no_patch_of_that_module_applied(
    make_package: PackageFactory,
) -> None:
    """The failed import drops the module: its other patches are not reported applied, and a retry patches."""
    pkg = make_package({"core.py": "def a():\n    return 'a'\n\ndef b():\n    return 'b'\n"})
    broken: dict[str, Any] = {"on": True}

    def maybe_broken(replacement: Any) -> Any:
        if broken["on"]:
            raise ValueError("broken once")
        return replacement

    patcher = Patcher(strict=True).add(
        AtomicPatch(f"{pkg}.core.a", lambda: "A", name="good"),
        AtomicPatch(f"{pkg}.core.b", lambda: "B", replacement_wrapper=maybe_broken, name="bad"),
    )
    patcher.apply()
    try:
        with pytest.raises(PatchError, match="bad"):
            imp(f"{pkg}.core")
        assert f"{pkg}.core" not in sys.modules
        good = patcher.report.get("good")
        assert good.status is Status.PENDING, (good.status, good.reason)
        broken["on"] = False
        core = imp(f"{pkg}.core")  # imported again: the patches land on the new module
        assert core.a() == "A" and core.b() == "B"
        assert patcher.report.get("good").status is Status.APPLIED
    finally:
        patcher.revert()
    core = imp(f"{pkg}.core")
    assert core.a() == "a" and core.b() == "b"


# ----------------------------------------------------------------------------- import rules


def test_a_replace_import_that_cannot_be_built_fails_and_the_real_module_is_imported(
    make_package: PackageFactory,
) -> None:
    """Non-strict: the rule is FAILED with the error, and the user's import gets the real module."""
    pkg = make_package({"real.py": "VALUE = 'real'\n"})
    patcher = Patcher().replace_import(f"{pkg}.real", "nosuchpackage_apx.factory:build")
    try:
        module = imp(f"{pkg}.real")
        assert module.VALUE == "real"
        record = patcher.report.get(f"{pkg}.real", kind="rule")
        assert record.status is Status.FAILED
        assert "nosuchpackage_apx" in (record.reason or "")
    finally:
        patcher.revert()


def test_a_replace_import_that_cannot_be_built_raises_in_strict_mode(
    make_package: PackageFactory,
) -> None:
    pkg = make_package({"real.py": "VALUE = 'real'\n"})
    patcher = Patcher(strict=True).replace_import(f"{pkg}.real", "nosuchpackage_apx.factory:build")
    try:
        with pytest.raises(ImportRuleError, match="nosuchpackage_apx"):
            imp(f"{pkg}.real")
        record = patcher.report.get(f"{pkg}.real", kind="rule")
        assert record.status is Status.FAILED
        assert "real module" not in (record.reason or "")  # strict: not imported instead
    finally:
        patcher.revert()


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize("spelling", ["{pkg}.core:Box.f", "{pkg}.core.Box.f"])
def test_disable_takes_a_target_in_either_spelling(
    make_package: PackageFactory, spelling: str
) -> None:
    """A patch on ``pkg.core:Box.f`` is disabled by that path or by its dotted form, without warning."""
    pkg = make_package(
        {"core.py": "class Box:\n    @staticmethod\n    def f():\n        return 1\n"}
    )
    patcher = Patcher().add(AtomicPatch(f"{pkg}.core:Box.f", staticmethod(lambda: 2)))
    try:
        report = patcher.disable(spelling.format(pkg=pkg)).apply()
        assert imp(f"{pkg}.core").Box.f() == 1
        assert report.get(f"{pkg}.core:Box.f").status is Status.SKIPPED
        assert not report.warnings
    finally:
        patcher.revert()
