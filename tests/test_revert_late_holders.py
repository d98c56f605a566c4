"""revert() and modules imported while a patch was applied (docs/core.md, "Reverting").

Such a module may hold the replacement because it took it from the target (``from x
import f``, ``g = x.f``): it gets the original back. It may also hold the same object
for reasons of its own -- a library object used as replacement (``float``,
``math.sqrt``), a helper imported from the module that defines it: that is left as
it is, since putting the target's original there would break it.
"""

from __future__ import annotations

import importlib
import math
import types
from collections.abc import Callable

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patcher


PackageFactory = Callable[..., str]


def imp(name: str) -> types.ModuleType:
    return importlib.import_module(name)


def test_a_module_that_took_the_replacement_from_the_target_gets_the_original_under_any_name(
    make_package: PackageFactory,
) -> None:
    pkg = make_package(
        {
            "core.py": "def f():\n    return 'orig'\n",
            "late.py": (
                "from {name}.core import f\n"
                "from {name}.core import f as g\n"
                "import {name}.core as c\n"
                "h = c.f\n"
            ),
        }
    )
    core = imp(f"{pkg}.core")
    original = core.f
    patcher = Patcher().add(AtomicPatch(f"{pkg}.core.f", lambda: "patched"))
    patcher.apply()
    try:
        late = imp(f"{pkg}.late")
        assert late.f() == late.g() == late.h() == "patched"
    finally:
        patcher.revert()
    assert late.f is late.g is late.h is original


def test_a_module_holding_the_same_library_object_for_itself_is_left_alone(
    make_package: PackageFactory,
) -> None:
    pkg = make_package(
        {
            "core.py": "def f(x):\n    return x\n\ndef g(x):\n    return x\n",
            "late.py": (
                "import math\n"
                "from math import sqrt\n"
                "my_sqrt = math.sqrt\n"
                "DTYPE = float\n"
                "from {name}.core import f, g\n"
            ),
        }
    )
    core = imp(f"{pkg}.core")
    f, g = core.f, core.g
    patcher = Patcher().add(
        AtomicPatch(f"{pkg}.core.f", math.sqrt), AtomicPatch(f"{pkg}.core.g", float)
    )
    patcher.apply()
    try:
        late = imp(f"{pkg}.late")
        assert late.f is math.sqrt and late.g is float
    finally:
        report = patcher.revert()
    assert late.sqrt is late.my_sqrt is math.sqrt
    assert late.DTYPE is float
    assert (late.f, late.g) == (f, g)
    warnings = [*report.get(f"{pkg}.core.f").warnings, *report.get(f"{pkg}.core.g").warnings]
    assert any(f"{pkg}.late.my_sqrt still holds the replacement" in w for w in warnings)
    assert any("builtins.float holds the same object" in w for w in warnings)


def test_a_helper_imported_from_its_own_module_is_left_alone(
    make_package: PackageFactory,
) -> None:
    pkg = make_package(
        {
            "core.py": "def f():\n    return 'orig'\n",
            "helpers.py": "def fast():\n    return 'fast'\n",
            "late.py": (
                "from {name}.helpers import fast\n"
                "from {name}.helpers import fast as handler\n"
                "from {name}.core import f\n"
            ),
        }
    )
    core = imp(f"{pkg}.core")
    original = core.f
    patcher = Patcher().add(AtomicPatch(f"{pkg}.core.f", f"{pkg}.helpers:fast"))
    patcher.apply()
    try:
        late = imp(f"{pkg}.late")
        fast = imp(f"{pkg}.helpers").fast
        assert late.f is late.fast is late.handler is fast
    finally:
        report = patcher.revert()
    assert late.f is original
    assert late.fast is late.handler is fast
    [warning] = report.get(f"{pkg}.core.f").warnings
    assert f"{pkg}.late.handler still holds the replacement" in warning
    assert f"{pkg}.helpers.fast holds the same object" in warning


def test_a_data_replacement_is_given_back_to_a_module_that_imported_it(
    make_package: PackageFactory,
) -> None:
    pkg = make_package(
        {
            "core.py": "CONFIG = {'backend': 'cuda'}\nLIMIT = 3\n",
            "late.py": "from {name}.core import CONFIG, LIMIT\n",
        }
    )
    core = imp(f"{pkg}.core")
    config = core.CONFIG
    patcher = Patcher().add(
        AtomicPatch(f"{pkg}.core.CONFIG", {"backend": "npu"}),
        AtomicPatch(f"{pkg}.core.LIMIT", 8),
    )
    patcher.apply()
    try:
        late = imp(f"{pkg}.late")
        assert late.CONFIG == {"backend": "npu"} and late.LIMIT == 8
    finally:
        patcher.revert()
    assert late.CONFIG is config
    # A small int is everybody's: not traced by identity, as documented.
    assert late.LIMIT == 8
