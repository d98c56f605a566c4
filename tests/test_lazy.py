"""Lazy, order-independent application: apply() imports nothing; patches land when modules load.

Also: stale references (``from x import f`` made before apply()), and strict mode at
import time.
"""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import ModuleHook
from ascend_patch_core import Patcher
from ascend_patch_core import PatchError
from ascend_patch_core import Status
from ascend_patch_core.imports._hub import hub


HEAVY = (
    "torch",
    "mmcv",
    "mmdet",
    "mmdet3d",
    "mmengine",
    "transformers",
    "diffusers",
    "torch_npu",
    "numpy",
)

PackageFactory = Callable[..., str]


def imp(name: str) -> types.ModuleType:
    return importlib.import_module(name)


def make_new(value: Any = "new") -> Callable[..., Any]:
    """A fresh replacement function that is no module's global (see test_revert_keeps_replacement_module_global)."""

    def replacement(*args: Any) -> Any:
        return value

    return replacement


def _subprocess_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def _output(tmp_path: Path, code: str, **env: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (the test environment, plus ``env``); its stdout lines."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(_subprocess_env(tmp_path), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


# ----------------------------------------------------------------------------- nothing imported


def test_apply_in_subprocess_imports_no_heavy_library(tmp_path: Path) -> None:
    """`import ascend_patch_core; ascend_patch_core.apply()` imports none of the target libraries."""
    code = (
        "import sys, ascend_patch_core; ascend_patch_core.apply(); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    lines = _output(tmp_path, code)
    assert lines[-1] == "[]"


def test_rarely_used_core_modules_load_on_first_use(tmp_path: Path) -> None:
    """Import rules, the 1.0 builder, with_imports and print_info cost nothing until used."""
    lazy = (
        "ascend_patch_core.imports._rules",
        "ascend_patch_core._compat.legacy",
        "ascend_patch_core._install.with_imports",
        "ascend_patch_core._engine.info",  # print_info() / get_info() only
    )
    code = (
        "import sys, ascend_patch_core\n"
        f"print(sorted(m for m in {lazy!r} if m in sys.modules))\n"
        "from ascend_patch_core import SkipImport, PatcherBuilder\n"
        "assert SkipImport('apx_lazy_probe').module == 'apx_lazy_probe'\n"
        f"print(sorted(m for m in {lazy!r} if m in sys.modules))\n"
    )
    lines = _output(tmp_path, code, ASCEND_PATCH_AUTOLOAD="0")
    before, after = lines[-2:]
    assert before == "[]"
    assert after == str(sorted(lazy[:2]))


def test_apply_with_the_installed_plugins_loads_no_rule_machinery(tmp_path: Path) -> None:
    """Where no plugin has a module to serve (no mmcv, no NPU runtime), apply() loads no import rule.

    The rule machinery costs ~0.4 ms of every apply(); a plugin that imported a rule
    class at module level (for an annotation) made every program pay it.
    """
    import importlib.util

    if any(importlib.util.find_spec(name) for name in ("mmcv", "torch_npu")):
        pytest.skip("mmcv or an NPU runtime is installed: a plugin serves a module there")
    code = (
        "import sys, ascend_patch_core; ascend_patch_core.apply(); "
        "print('ascend_patch_core.imports._rules' in sys.modules)"
    )
    lines = _output(tmp_path, code)
    assert lines[-1] == "False"


def test_apply_loads_the_wrapper_module_only_for_a_wrapper_it_makes(tmp_path: Path) -> None:
    """A runtime_check patch that its precheck skips makes no wrapper: the module stays unloaded.

    The torch plugin's BatchMatmul patches are such patches on every machine without an
    NPU runtime; loading the wrapper module for them cost every apply() ~0.5 ms.
    """
    probe = "'ascend_patch_core._install.wrappers' in sys.modules"
    code = (
        "import json, sys\n"
        "loads = json.loads\n"
        "from ascend_patch_core import AtomicPatch, Patcher\n"
        "def check(obj, *a, **k): return True\n"
        "def new(obj, *a, **k): return ''\n"
        "p = Patcher().add(AtomicPatch('json.dumps', new, runtime_check=check,"
        " precheck=lambda original: False))\n"
        f"p.apply(); print({probe})\n"
        "q = Patcher().add(AtomicPatch('json.loads', new, runtime_check=check))\n"
        f"q.apply(); print({probe}, json.loads is not loads)\n"
    )
    lines = _output(tmp_path, code, ASCEND_PATCH_AUTOLOAD="0")
    assert lines[-2:] == ["False", "True True"]


def test_a_cache_miss_without_the_plugins_libraries_imports_no_packaging(tmp_path: Path) -> None:
    """The first run after an install, in a program without OpenMMLab or Hugging Face: the
    plugins' version ranges name absent libraries first, so no answer needs packaging (~10 ms)."""
    import importlib.util

    libraries = ("mmcv", "mmengine", "mmdet", "mmdet3d", "transformers", "diffusers", "accelerate")
    if any(importlib.util.find_spec(name) for name in libraries):
        pytest.skip("a plugin's library is installed: its version range needs packaging")
    code = (
        "import sys, ascend_patch_core; ascend_patch_core.apply(); "
        "print('packaging' in sys.modules)"
    )
    lines = _output(tmp_path, code, ASCEND_PATCH_CACHE="0")
    assert lines[-1] == "False"


def test_import_alone_in_subprocess_imports_no_heavy_library(tmp_path: Path) -> None:
    """`import ascend_patch_core` by itself imports none of the target libraries."""
    code = f"import sys, ascend_patch_core; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    lines = _output(tmp_path, code)
    assert lines == ["[]"]


def test_apply_imports_no_target_in_process(make_package: PackageFactory, patcher: Patcher) -> None:
    """apply() leaves sys.modules unchanged except for the core's own modules."""
    new_f = make_new()
    pkg = make_package(
        {
            "__init__.py": "from .core import f\n",
            "core.py": "def f():\n    return 'orig'\nclass C:\n    def m(self):\n        return 1\n",
            "sub/mod.py": "def g():\n    return 'g'\n",
        }
    )
    patcher.add(
        AtomicPatch(f"{pkg}.core.f", new_f, aliases=[f"{pkg}.f"]),
        AtomicPatch(f"{pkg}.core.C.m", lambda self: 2),
        AtomicPatch(f"{pkg}.sub.mod.g", lambda: "G"),
        AtomicPatch(f"{pkg}.core:C.m", target_wrapper=lambda orig: orig, name="tw"),
    )
    before = set(sys.modules)
    report = patcher.apply()
    added = set(sys.modules) - before
    assert not [
        m for m in added if m != "ascend_patch_core" and not m.startswith("ascend_patch_core.")
    ]
    assert not [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]
    assert {r.status for r in report.records if r.kind == "patch"} == {Status.PENDING}
    # And the patches do land once the user imports the package.
    assert imp(pkg).f() == "new"
    assert imp(f"{pkg}.core").C().m() == 2


# ----------------------------------------------------------------------------- when patches land


def test_already_imported_target_is_applied_at_once(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A target whose module is already imported is installed during apply()."""
    new_f = make_new()
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    core = imp(f"{pkg}.core")
    report = patcher.add(AtomicPatch(f"{pkg}.core.f", new_f)).apply()
    assert report.get(f"{pkg}.core.f").status is Status.APPLIED
    assert core.f is new_f
    assert core.f() == "new"


def test_module_body_sees_original_and_later_calls_see_replacement(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A lazy patch lands after the module body ran: import-time calls see the original, later ones the replacement."""
    new_f = make_new()
    pkg = make_package(
        {
            "core.py": """
                def f():
                    return 'orig'
                AT_IMPORT = f()
                def call_later():
                    return f()
            """
        }
    )
    report = patcher.add(AtomicPatch(f"{pkg}.core.f", new_f)).apply()
    assert report.get(f"{pkg}.core.f").status is Status.PENDING
    core = imp(f"{pkg}.core")
    assert core.AT_IMPORT == "orig"
    assert core.call_later() == "new"
    assert report.get(f"{pkg}.core.f").status is Status.APPLIED


def test_package_init_reexports_patched_function(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """`from .core import f` in a package __init__ binds the replacement: core is patched before __init__ continues."""
    new_f = make_new()
    pkg = make_package(
        {
            "__init__.py": "from .core import f\nSEEN_BY_INIT = f()\n",
            "core.py": "def f():\n    return 'orig'\n",
        }
    )
    patcher.add(AtomicPatch(f"{pkg}.core.f", new_f)).apply()
    package = imp(pkg)
    assert package.f is new_f
    assert package.SEEN_BY_INIT == "new"
    patcher.revert()
    assert package.f is sys.modules[f"{pkg}.core"].f
    assert package.f() == "orig"


def test_import_order_does_not_matter(make_package: PackageFactory, patcher: Patcher) -> None:
    """Patches on modules imported before and after apply() end in the same state."""
    pkg = make_package(
        {
            "a.py": "def f():\n    return 'a'\n",
            "b.py": "def f():\n    return 'b'\n",
        }
    )
    a = imp(f"{pkg}.a")
    report = patcher.add(
        AtomicPatch(f"{pkg}.a.f", lambda: "A"),
        AtomicPatch(f"{pkg}.b.f", lambda: "B"),
    ).apply()
    b = imp(f"{pkg}.b")
    assert (a.f(), b.f()) == ("A", "B")
    assert {r.status for r in report.records} == {Status.APPLIED}


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(
            {"replacement": make_new(), "replacement_wrapper": lambda r: 1 / 0},
            id="replacement_wrapper",
        ),
        pytest.param({"target_wrapper": lambda orig: 1 / 0}, id="target_wrapper"),
        pytest.param({"replacement": make_new(), "precheck": lambda: 1 / 0}, id="precheck"),
        pytest.param(
            {"replacement": "no_such_module_xyz.attr.f", "target_wrapper": lambda o: 1 / 0},
            id="string",
        ),
    ],
)
def test_exception_while_patching_never_breaks_the_import(
    make_package: PackageFactory, patcher: Patcher, kwargs: dict[str, Any]
) -> None:
    """An exception inside lazy patching leaves the user's import working and the record FAILED."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    report = patcher.add(AtomicPatch(f"{pkg}.core.f", **kwargs)).apply()
    core = imp(f"{pkg}.core")
    assert core.f() == "orig"
    record = report.get(f"{pkg}.core.f")
    assert record.status is Status.FAILED
    assert "ZeroDivisionError" in (record.reason or "")


def test_submodule_target_waits_for_the_exact_submodule(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """`pkg.sub.mod.f` stays pending while only pkg and pkg.sub are imported; it lands when pkg.sub.mod loads."""
    new_f = make_new()
    pkg = make_package(
        {
            "__init__.py": "X = 1\n",
            "sub/__init__.py": "Y = 2\n",
            "sub/mod.py": "def f():\n    return 'orig'\n",
        }
    )
    report = patcher.add(AtomicPatch(f"{pkg}.sub.mod.f", new_f)).apply()
    imp(pkg)
    imp(f"{pkg}.sub")
    assert f"{pkg}.sub.mod" not in sys.modules, "the patcher must not import the submodule itself"
    assert report.get(f"{pkg}.sub.mod.f").status is Status.PENDING
    mod = imp(f"{pkg}.sub.mod")
    assert mod.f() == "new"
    assert report.get(f"{pkg}.sub.mod.f").status is Status.APPLIED


def test_submodule_target_when_parent_already_imported(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """With the parent packages already imported, apply() waits for the submodule instead of skipping."""
    new_f = make_new()
    pkg = make_package({"sub/mod.py": "def f():\n    return 'orig'\n"})
    imp(f"{pkg}.sub")
    report = patcher.add(AtomicPatch(f"{pkg}.sub.mod.f", new_f)).apply()
    assert report.get(f"{pkg}.sub.mod.f").status is Status.PENDING
    assert f"{pkg}.sub.mod" not in sys.modules
    assert imp(f"{pkg}.sub.mod").f() == "new"


def test_lazy_patch_reverted_before_import_leaves_no_watch(make_package: PackageFactory) -> None:
    """Reverting before the target was imported removes the watch: a later import is untouched."""
    new_f = make_new()
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    p = Patcher().add(AtomicPatch(f"{pkg}.core.f", new_f))
    meta_path_len = len(sys.meta_path)
    try:
        p.apply()
        assert any(name == pkg or name.startswith(pkg + ".") for name in hub._watches)
    finally:
        report = p.revert()
    assert report.get(f"{pkg}.core.f").status is Status.REVERTED
    assert not any(name == pkg or name.startswith(pkg + ".") for name in hub._watches)
    assert len(sys.meta_path) == meta_path_len
    assert imp(f"{pkg}.core").f() == "orig"


# ----------------------------------------------------------------------------- ModuleHook


def _models_package(make_package: PackageFactory) -> str:
    body = "class RMSNorm:\n    def forward(self):\n        return 'orig-{model}'\n"
    return make_package(
        {
            "models/a/modeling_a.py": body.replace("{model}", "a"),
            "models/a/config_a.py": body.replace("{model}", "config-a"),
            "models/b/modeling_b.py": body.replace("{model}", "b"),
            "models/c/modeling_c.py": "raise_here = True\n",
        }
    )


def test_module_hook_visits_imported_and_later_modules(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A pattern hook visits matching modules imported before and after apply(); its patches apply and revert."""
    pkg = _models_package(make_package)
    a = imp(f"{pkg}.models.a.modeling_a")
    originals = {"a": vars(a.RMSNorm)["forward"]}
    visited: list[str] = []

    def callback(module: types.ModuleType) -> list[AtomicPatch]:
        visited.append(module.__name__)
        if not hasattr(module, "RMSNorm"):
            return []
        return [AtomicPatch(f"{module.__name__}.RMSNorm.forward", lambda self: "npu")]

    report = patcher.add(ModuleHook(f"{pkg}.models.*.modeling_*", callback, name="rms")).apply()
    assert visited == [f"{pkg}.models.a.modeling_a"]
    assert a.RMSNorm().forward() == "npu"

    b = imp(f"{pkg}.models.b.modeling_b")
    config = imp(f"{pkg}.models.a.config_a")
    assert visited == [f"{pkg}.models.a.modeling_a", f"{pkg}.models.b.modeling_b"]
    assert b.RMSNorm().forward() == "npu"
    assert config.RMSNorm().forward() == "orig-config-a"
    assert report.get("rms").status is Status.APPLIED
    produced = [r for r in report.records if r.kind == "patch"]
    assert {r.target for r in produced} == {
        f"{pkg}.models.a.modeling_a.RMSNorm.forward",
        f"{pkg}.models.b.modeling_b.RMSNorm.forward",
    }
    assert {r.status for r in produced} == {Status.APPLIED}

    patcher.revert()
    assert vars(a.RMSNorm)["forward"] is originals["a"]
    assert vars(b.RMSNorm)["forward"].__qualname__ == "RMSNorm.forward"
    assert vars(b.RMSNorm)["forward"].__module__ == f"{pkg}.models.b.modeling_b"
    assert (a.RMSNorm().forward(), b.RMSNorm().forward()) == ("orig-a", "orig-b")
    # The pattern watch is gone: a later matching import is not visited.
    imp(f"{pkg}.models.c.modeling_c")
    assert len(visited) == 2


def test_module_hook_raising_callback_is_a_warning(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A raising hook callback is recorded as a warning, does not break the import, and the hook keeps working."""
    pkg = _models_package(make_package)

    def callback(module: types.ModuleType) -> list[AtomicPatch]:
        if module.__name__.endswith("modeling_b"):
            raise RuntimeError(f"cannot handle {module.__name__}")
        return [AtomicPatch(f"{module.__name__}.RMSNorm.forward", lambda self: "npu")]

    report = patcher.add(
        ModuleHook(f"{pkg}.models.*.modeling_*", callback, name="bad-hook")
    ).apply()
    b = imp(f"{pkg}.models.b.modeling_b")
    assert b.RMSNorm().forward() == "orig-b"
    a = imp(f"{pkg}.models.a.modeling_a")
    assert a.RMSNorm().forward() == "npu"
    record = report.get("bad-hook")
    assert record.status is Status.APPLIED
    assert [w for w in record.warnings if "RuntimeError" in w and f"{pkg}.models.b.modeling_b" in w]


def test_module_hook_patch_of_module_already_imported_records_stale(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A hook patch applied at apply() to an already-imported module still reports stale holders."""
    new_f = make_new()
    pkg = make_package(
        {
            "models/a/modeling_a.py": "def act():\n    return 'orig'\n",
            "models/a/user.py": "from .modeling_a import act\n",
        }
    )
    user = imp(f"{pkg}.models.a.user")
    report = patcher.add(
        ModuleHook(
            f"{pkg}.models.*.modeling_*",
            lambda m: [AtomicPatch(f"{m.__name__}.act", new_f)],
            name="acts",
        )
    ).apply()
    record = report.get(f"{pkg}.models.a.modeling_a.act")
    assert record.status is Status.APPLIED
    assert f"{pkg}.models.a.user.act" in record.stale_holders
    assert user.act() == "orig"


# ----------------------------------------------------------------------------- stale references


def _stale_package(make_package: PackageFactory) -> str:
    return make_package(
        {
            "core.py": "def f():\n    return 'orig'\n",
            "holder.py": "from {name}.core import f\ndef use():\n    return f()\n",
            "late.py": "from {name}.core import f\ndef use():\n    return f()\n",
        }
    )


def test_stale_holder_is_reported_with_a_fix(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A module that did `from pkg.core import f` before apply() is listed in stale_holders, with a fix hint."""
    new_f = make_new()
    pkg = _stale_package(make_package)
    holder = imp(f"{pkg}.holder")
    report = patcher.add(AtomicPatch(f"{pkg}.core.f", new_f)).apply()
    record = report.get(f"{pkg}.core.f")
    assert record.stale_holders == [f"{pkg}.holder.f"]
    assert record.rebound_holders == []
    assert holder.use() == "orig"
    assert any("rebind_stale=True" in w and "apply() earlier" in w for w in record.warnings)


@pytest.mark.parametrize("how", ["patcher", "patch"])
def test_stale_holder_is_rebound_on_request_and_restored(
    make_package: PackageFactory, how: str
) -> None:
    """With rebind_stale (or AtomicPatch(rebind=True)) holders get the replacement; revert gives the original back."""
    new_f = make_new()
    pkg = _stale_package(make_package)
    holder = imp(f"{pkg}.holder")
    original = holder.f
    if how == "patcher":
        p = Patcher(rebind_stale=True).add(AtomicPatch(f"{pkg}.core.f", new_f))
    else:
        p = Patcher().add(AtomicPatch(f"{pkg}.core.f", new_f, rebind=True))
    try:
        record = p.apply().get(f"{pkg}.core.f")
        assert record.rebound_holders == [f"{pkg}.holder.f"]
        assert record.stale_holders == []
        assert holder.use() == "new"
    finally:
        p.revert()
    assert holder.f is original
    assert holder.use() == "orig"


def test_rebind_false_on_patch_overrides_patcher(make_package: PackageFactory) -> None:
    """AtomicPatch(rebind=False) keeps holders untouched even under Patcher(rebind_stale=True)."""
    new_f = make_new()
    pkg = _stale_package(make_package)
    holder = imp(f"{pkg}.holder")
    p = Patcher(rebind_stale=True).add(AtomicPatch(f"{pkg}.core.f", new_f, rebind=False))
    try:
        record = p.apply().get(f"{pkg}.core.f")
        assert record.stale_holders == [f"{pkg}.holder.f"]
        assert holder.use() == "orig"
    finally:
        p.revert()


def test_holders_in_replacement_package_are_not_rebound(make_package: PackageFactory) -> None:
    """A plugin module keeping the original for fallback is not rebound (that would make the replacement recursive)."""
    pkg = _stale_package(make_package)
    plug = make_package(
        {
            "impl.py": """
                from {target}.core import f as _original_f
                def f():
                    return ('plugin', _original_f())
            """.replace("{target}", pkg)
        }
    )
    impl = imp(f"{plug}.impl")
    holder = imp(f"{pkg}.holder")
    original = impl._original_f
    p = Patcher(rebind_stale=True).add(AtomicPatch(f"{pkg}.core.f", impl.f))
    try:
        record = p.apply().get(f"{pkg}.core.f")
        assert impl._original_f is original
        assert all(
            not label.startswith(plug) for label in record.rebound_holders + record.stale_holders
        )
        assert record.rebound_holders == [f"{pkg}.holder.f"]
        assert holder.use() == ("plugin", "orig")
        assert sys.modules[f"{pkg}.core"].f() == ("plugin", "orig")
    finally:
        p.revert()
    assert holder.use() == "orig"


def test_holders_in_sibling_module_of_replacement_package_are_not_rebound(
    make_package: PackageFactory,
) -> None:
    """The whole package of the replacement is protected, not only its defining module (fallbacks live in siblings)."""
    pkg = _stale_package(make_package)
    plug = make_package(
        {
            "fallback.py": "from {target}.core import f as original_f\n".replace("{target}", pkg),
            "impl.py": """
                from . import fallback
                def f():
                    return ('plugin', fallback.original_f())
            """,
        }
    )
    impl = imp(f"{plug}.impl")
    fallback = sys.modules[f"{plug}.fallback"]
    original = fallback.original_f
    p = Patcher(rebind_stale=True).add(AtomicPatch(f"{pkg}.core.f", impl.f))
    try:
        record = p.apply().get(f"{pkg}.core.f")
        assert fallback.original_f is original
        assert f"{plug}.fallback.original_f" not in record.rebound_holders
        assert sys.modules[f"{pkg}.core"].f() == ("plugin", "orig")
    finally:
        p.revert()


def test_holders_in_string_replacement_package_are_not_rebound(
    make_package: PackageFactory,
) -> None:
    """A replacement given as a dotted string protects its own package's fallback reference too."""
    pkg = _stale_package(make_package)
    plug = make_package(
        {
            "impl.py": """
                from {target}.core import f as _original_f
                def f():
                    return ('plugin', _original_f())
            """.replace("{target}", pkg)
        }
    )
    impl = imp(f"{plug}.impl")
    imp(f"{pkg}.holder")
    original = impl._original_f
    p = Patcher(rebind_stale=True).add(AtomicPatch(f"{pkg}.core.f", f"{plug}.impl:f"))
    try:
        p.apply()
        assert impl._original_f is original
        assert sys.modules[f"{pkg}.core"].f() == ("plugin", "orig")
    finally:
        p.revert()


def test_late_importer_gets_original_back_on_revert(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A module that imported the replacement while applied is given the original back by revert()."""
    new_f = make_new()
    pkg = _stale_package(make_package)
    patcher.add(AtomicPatch(f"{pkg}.core.f", new_f)).apply()
    late = imp(f"{pkg}.late")
    assert late.f is new_f
    original_from_core = None
    patcher.revert()
    original_from_core = sys.modules[f"{pkg}.core"].f
    assert original_from_core is not new_f
    assert late.f is original_from_core
    assert late.use() == "orig"


def test_late_importer_of_immediate_patch_gets_original_back(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Also for a patch installed during apply() (module imported before), late importers are restored."""
    new_f = make_new()
    pkg = _stale_package(make_package)
    core = imp(f"{pkg}.core")
    original = core.f
    patcher.add(AtomicPatch(f"{pkg}.core.f", new_f)).apply()
    late = imp(f"{pkg}.late")
    assert late.use() == "new"
    patcher.revert()
    assert core.f is original
    assert late.f is original


# ----------------------------------------------------------------------------- strict mode at import time


def test_strict_lazy_failure_raises_at_import_and_import_works_after_revert(
    make_package: PackageFactory,
) -> None:
    """strict=True: a failing lazy patch makes the import raise PatchError naming it; after revert it works."""
    new_f = make_new()
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})

    def broken(replacement: Any) -> Any:
        raise ValueError("broken wrapper")

    p = Patcher(strict=True).add(
        AtomicPatch(f"{pkg}.core.f", new_f, replacement_wrapper=broken, name="my-broken")
    )
    try:
        p.apply()
        with pytest.raises(PatchError, match="my-broken"):
            imp(f"{pkg}.core")
    finally:
        p.revert()
    assert imp(f"{pkg}.core").f() == "orig"


def test_non_strict_lazy_failure_does_not_raise(make_package: PackageFactory) -> None:
    """The same failing lazy patch without strict only records FAILED."""
    new_f = make_new()
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    p = Patcher(strict=False).add(
        AtomicPatch(f"{pkg}.core.f", new_f, replacement_wrapper=lambda r: 1 / 0, name="my-broken")
    )
    try:
        report = p.apply()
        assert imp(f"{pkg}.core").f() == "orig"
        assert report.get("my-broken").status is Status.FAILED
    finally:
        p.revert()


def test_target_wrapper_sees_fully_initialized_module(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """The target_wrapper runs after the body: names defined below the target exist already."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\nDEFINED_LATER = 42\n"})
    seen: list[int] = []

    def wrap(original: Callable[[], str]) -> Callable[[], str]:
        seen.append(sys.modules[f"{pkg}.core"].DEFINED_LATER)

        @functools.wraps(original)
        def wrapper() -> str:
            return "wrapped-" + original()

        return wrapper

    patcher.add(AtomicPatch(f"{pkg}.core.f", target_wrapper=wrap)).apply()
    assert imp(f"{pkg}.core").f() == "wrapped-orig"
    assert seen == [42]


def test_revert_keeps_replacement_module_global(make_package: PackageFactory) -> None:
    """revert() must not rebind the module that defines the replacement (it is no 'late importer')."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    plug = make_package({"impl.py": "def fast_f():\n    return 'new'\n"})
    impl = imp(f"{plug}.impl")
    replacement = impl.fast_f
    core = imp(f"{pkg}.core")
    p = Patcher().add(AtomicPatch(f"{pkg}.core.f", replacement))
    try:
        p.apply()
        assert core.f() == "new"
    finally:
        p.revert()
    assert core.f() == "orig"
    assert impl.fast_f is replacement
    assert impl.fast_f() == "new"


def test_a_target_holding_a_builtin_never_rebinds_builtins(make_package: PackageFactory) -> None:
    """A module global that *is* print: patching it with rebind must not make builtins.print the replacement."""
    import builtins

    pkg = make_package({"core.py": "show = print\n"})
    imp(f"{pkg}.core")
    real_print = builtins.print
    p = Patcher(rebind_stale=True).add(AtomicPatch(f"{pkg}.core.show", make_new("shown")))
    try:
        record = p.apply().get(f"{pkg}.core.show")
        assert builtins.print is real_print
        assert "builtins.print" not in record.rebound_holders + record.stale_holders
    finally:
        p.revert()
    assert builtins.print is real_print


def test_revert_leaves_modules_that_held_the_replacement_before_apply(
    make_package: PackageFactory,
) -> None:
    """A replacement re-exported elsewhere (torchvision.ops.nms-style) is no late importer: revert leaves it."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    plug = make_package({"impl.py": "def fast_f():\n    return 'new'\n"})
    # Another library re-exports it (as torch re-exports torchvision-free ops, or a
    # utility package its dependency's functions): outside the replacement's package.
    other = make_package({"api.py": f"from {plug}.impl import fast_f\n"})
    api = imp(f"{other}.api")
    replacement = api.fast_f
    core = imp(f"{pkg}.core")
    p = Patcher().add(AtomicPatch(f"{pkg}.core.f", replacement))
    try:
        p.apply()
        late = make_package({"late.py": f"from {pkg}.core import f\n"})
        assert imp(f"{late}.late").f is replacement
    finally:
        p.revert()
    assert core.f() == "orig"
    assert api.fast_f is replacement  # held before apply(): untouched
    assert sys.modules[f"{late}.late"].f is core.f  # imported while applied: given the original


def test_revert_of_a_builtin_replacement_leaves_builtins_alone(
    make_package: PackageFactory,
) -> None:
    """Replacing a module global with print, then reverting, must not touch builtins.print."""
    import builtins

    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    core = imp(f"{pkg}.core")
    real_print = builtins.print
    p = Patcher().add(AtomicPatch(f"{pkg}.core.f", print))
    try:
        p.apply()
        assert core.f is print
    finally:
        p.revert()
    assert builtins.print is real_print
    assert core.f() == "orig"
