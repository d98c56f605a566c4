"""mx_driving.patcher migration: with_imports' leniency and decorators (issue 16, item 4)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patcher


PackageFactory = Callable[..., str]

_REPL = """
from ascend_patch_core import with_imports

CALLS = []


def record(tag):
    def deco(func):
        def wrapped(*args):
            CALLS.append(tag)
            return func(*args)
        return wrapped
    return deco


def plain_record(func):
    def wrapped(*args):
        CALLS.append("plain")
        return func(*args)
    return wrapped


@with_imports("{pkg}.helpers", "mx_driving_not_installed_anywhere")
def uses_only_helpers(x):
    return helpers.double(x)


@with_imports("mx_driving_not_installed_anywhere")
def uses_the_missing_module(x):
    return mx_driving_not_installed_anywhere.op(x)


@with_imports(("{pkg}.helpers", "double"), "@record('outer')", "@plain_record")
def decorated(x):
    return double(x)


@with_imports("{pkg}.helpers", apply_decorators=[("{pkg}.repl.record", {{"tag": "legacy"}})])
def legacy_decorated(x):
    return helpers.double(x)
"""


def _package(make_package: PackageFactory) -> str:
    pkg = make_package({"helpers.py": "def double(x):\n    return 2 * x\n"})
    path = importlib.import_module(pkg).__path__[0]
    with open(f"{path}/repl.py", "w", encoding="utf-8") as out:
        out.write(_REPL.format(pkg=pkg))
    importlib.invalidate_caches()
    return pkg


def test_a_missing_module_warns_and_the_function_runs(make_package: PackageFactory) -> None:
    pkg = _package(make_package)
    repl = importlib.import_module(f"{pkg}.repl")  # declaring raises nothing
    with pytest.warns(UserWarning, match="mx_driving_not_installed_anywhere"):
        assert repl.uses_only_helpers(2) == 4
    with pytest.raises(ImportError, match="uses_the_missing_module"), pytest.warns(UserWarning):
        repl.uses_the_missing_module(1)


def test_decorator_specs_apply_at_the_first_call(make_package: PackageFactory) -> None:
    pkg = _package(make_package)
    repl = importlib.import_module(f"{pkg}.repl")
    assert repl.decorated(3) == 6
    assert repl.CALLS == ["outer", "plain"], "the first written decorator is outermost"


def test_apply_decorators_legacy_form(make_package: PackageFactory) -> None:
    pkg = _package(make_package)
    repl = importlib.import_module(f"{pkg}.repl")
    assert repl.legacy_decorated(5) == 10
    assert repl.CALLS == ["legacy"]


def test_a_decorated_replacement_installed_by_a_patch(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Installed by a patch, the decorated function keeps its decorators after the first call."""
    pkg = _package(make_package)
    target = make_package({"core.py": "def compute(x):\n    return -x\n"})
    core = importlib.import_module(f"{target}.core")
    patcher.add(AtomicPatch(f"{target}.core.compute", f"{pkg}.repl:decorated")).apply()
    assert core.compute(1) == 2 and core.compute(2) == 4
    assert importlib.import_module(f"{pkg}.repl").CALLS == ["outer", "plain"] * 2
