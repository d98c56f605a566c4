"""The patch model: AtomicPatch options, with_imports, Patch groups and the Patcher's planning.

Every test builds real packages with ``make_package``, runs the patched code and checks
what it returns, then reverts and checks that the originals are back.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import sys
import types
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ascend_patch_core import AtomicPatch
from ascend_patch_core import LegacyPatch
from ascend_patch_core import Patch
from ascend_patch_core import PatchConflictError
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import PatchError
from ascend_patch_core import Report
from ascend_patch_core import Status
from ascend_patch_core import hookimpl
from ascend_patch_core.imports._hub import hub


PackageFactory = Callable[..., str]


def _import(name: str) -> types.ModuleType:
    return importlib.import_module(name)


def _pkg_dir(pkg: str) -> Path:
    return Path(sys.modules[pkg].__path__[0]) if pkg in sys.modules else Path(sys.path[0]) / pkg


@pytest.fixture
def strict_patcher() -> Iterator[Patcher]:
    """A strict Patcher, always reverted at the end of the test."""
    p = Patcher(strict=True)
    yield p
    p.revert()


_CORE = """
def compute(x):
    return ('orig', x)

def other(x):
    return ('other', x)

def third(x):
    return ('third', x)

def boom(x):
    raise ValueError('original raised')

class Ops:
    @staticmethod
    def add(a, b=1):
        return ('orig', a + b)

    @classmethod
    def make(cls, x):
        return ('orig', cls.__name__, x)

class SubOps(Ops):
    pass
"""


# ============================================================================ AtomicPatch options


def test_string_replacements_resolve_lazily_at_install(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """'pkg.mod:func' and 'pkg.mod.func' replacements are imported only when the target is installed."""
    pkg = make_package({"core.py": _CORE})
    ops = "def fast(x):\n    return ('npu', x)\n\nclass K:\n    def slow(x):\n        return ('npu-k', x)\n"
    npu = make_package({"ops.py": ops})
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", f"{npu}.ops:fast"),
        AtomicPatch(f"{pkg}.core.other", f"{npu}.ops.fast"),
        AtomicPatch(f"{pkg}.core.third", f"{npu}.ops:K.slow"),
    ).apply()
    assert npu not in sys.modules and pkg not in sys.modules, (
        "apply() imports neither target nor replacement"
    )
    assert report.get(f"{pkg}.core.compute").status is Status.PENDING
    core = _import(f"{pkg}.core")
    assert f"{npu}.ops" in sys.modules
    assert core.compute(1) == ("npu", 1)
    assert core.other(2) == ("npu", 2)
    assert core.third(3) == ("npu-k", 3)
    assert core.compute is sys.modules[f"{npu}.ops"].fast
    patcher.revert()
    assert core.compute(1) == ("orig", 1)


def test_unimportable_string_replacement_is_skipped(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An unimportable string replacement skips the patch with a reason naming it; the original stays."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", "not_a_real_module_xyz.ops:fast"),
        AtomicPatch(f"{pkg}.core.other", "not_a_real_module_xyz.ops.fast"),
    ).apply()
    for target in (f"{pkg}.core.compute", f"{pkg}.core.other"):
        record = report.get(target)
        assert record.status is Status.SKIPPED
        assert "not_a_real_module_xyz" in (record.reason or "")
        assert "not importable" in (record.reason or "")
    assert core.compute(1) == ("orig", 1)
    assert report.ok


def test_unimportable_string_replacement_falls_back_to_target_wrapper(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """With a target_wrapper, an unimportable string replacement falls back to wrapping the original."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    original = core.compute

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(x: Any) -> Any:
            return ("wrapped", fn(x))

        return wrapped

    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", "not_a_real_module_xyz:fast", target_wrapper=wrap)
    ).apply()
    assert report.get(f"{pkg}.core.compute").status is Status.APPLIED
    assert core.compute(1) == ("wrapped", ("orig", 1))
    patcher.revert()
    assert core.compute is original


def test_precheck_false_skips_and_raising_fails(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """precheck False -> SKIPPED 'precheck returned False'; precheck raising -> FAILED with the error."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")

    def bad_precheck() -> bool:
        raise ValueError("boom-in-precheck")

    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), precheck=lambda: False),
        AtomicPatch(f"{pkg}.core.other", lambda x: ("new", x), precheck=bad_precheck),
    ).apply()
    skipped = report.get(f"{pkg}.core.compute")
    assert skipped.status is Status.SKIPPED and skipped.reason == "precheck returned False"
    failed = report.get(f"{pkg}.core.other")
    assert failed.status is Status.FAILED
    assert "precheck raised ValueError: boom-in-precheck" in (failed.reason or "")
    assert core.compute(1) == ("orig", 1) and core.other(1) == ("other", 1)
    assert not report.ok


def test_precheck_runs_after_target_import_and_receives_keywords(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A precheck runs when the target module is imported and gets the target/original it declares."""
    pkg = make_package({"core.py": _CORE})
    seen: list[tuple[str, Any]] = []

    def precheck(target: str, original: Any) -> bool:
        seen.append((target, original))
        return True

    def any_kwargs(**kwargs: Any) -> bool:
        seen.append(("kwargs", sorted(kwargs)))
        return True

    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), precheck=precheck),
        AtomicPatch(f"{pkg}.core.Ops.add", lambda a, b=1: ("new", a), precheck=precheck),
        AtomicPatch(f"{pkg}.core.other", lambda x: ("new", x), precheck=any_kwargs),
    ).apply()
    assert seen == []
    core = _import(f"{pkg}.core")
    assert core.compute(1) == ("new", 1)
    assert seen[0][0] == f"{pkg}.core.compute"
    assert seen[0][1](5) == ("orig", 5) and seen[0][1].__name__ == "compute"
    assert seen[1][0] == f"{pkg}.core.Ops.add"
    assert isinstance(seen[1][1], types.FunctionType), (
        "the original of a staticmethod is its function"
    )
    assert seen[1][1](1, 2) == ("orig", 3)
    offered = [
        "aliases",
        "original",
        "replacement",
        "replacement_wrapper",
        "target",
        "target_wrapper",
    ]
    assert seen[2] == ("kwargs", offered)


def test_target_wrapper_gets_original_and_result_is_installed(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """target_wrapper receives the original (a staticmethod's inner function) and its result is installed."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    raw = vars(core.Ops)["add"]
    received: list[Any] = []

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        received.append(fn)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return ("wrapped", fn(*args, **kwargs))

        return wrapped

    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", target_wrapper=wrap),
        AtomicPatch(f"{pkg}.core.Ops.add", target_wrapper=wrap),
    ).apply()
    assert received[0] is not None and received[0](1) == ("orig", 1)
    assert received[1] is raw.__func__
    assert core.compute(1) == ("wrapped", ("orig", 1))
    assert core.Ops.add(2, 3) == ("wrapped", ("orig", 5))
    assert core.Ops().add(2, 3) == ("wrapped", ("orig", 5))
    patcher.revert()
    assert vars(core.Ops)["add"] is raw
    assert core.compute(1) == ("orig", 1)


def test_replacement_wrapper_wraps_the_resolved_replacement(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """replacement_wrapper is applied to the (resolved) replacement and its result is installed."""
    pkg = make_package({"core.py": _CORE})
    npu = make_package({"ops.py": "def fast(x):\n    return ('npu', x)\n"})
    core = _import(f"{pkg}.core")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda x: ("rw", fn(x))

    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", f"{npu}.ops:fast", replacement_wrapper=wrap)
    ).apply()
    assert core.compute(3) == ("rw", ("npu", 3))


def test_runtime_check_routes_each_call_and_counts(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """runtime_check true -> replacement, false or raising -> original; counters count each path."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")

    def check(x: Any) -> bool:
        if x == "explode":
            raise RuntimeError("check failed")
        return bool(x > 0)

    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), runtime_check=check)
    ).apply()
    record = report.get(f"{pkg}.core.compute")
    assert record.counters is not None
    assert (record.counters.replacement_calls, record.counters.fallback_calls) == (0, 0)
    assert core.compute(1) == ("new", 1)
    assert core.compute(2) == ("new", 2)
    assert core.compute(-1) == ("orig", -1)
    assert core.compute("explode") == ("orig", "explode")
    assert (record.counters.replacement_calls, record.counters.fallback_calls) == (2, 2)
    data = json.loads(report.to_json())
    [entry] = [r for r in data["records"] if r["target"] == f"{pkg}.core.compute"]
    assert entry["counters"] == {"replacement_calls": 2, "fallback_calls": 2}


def test_a_shared_runtime_check_serves_every_patch_and_is_not_kept_alive(
    make_package: PackageFactory,
) -> None:
    """One check for several targets (signatures cached by identity); the cache holds no reference."""
    import gc
    import weakref

    from ascend_patch_core._model import patch as _patch

    pkg = make_package({"core.py": "def f(x):\n    return 'f'\n\ndef g(x, y=1):\n    return 'g'\n"})
    core = _import(f"{pkg}.core")

    def positive(*args: Any, **kwargs: Any) -> bool:
        return bool(args and args[0] > 0)

    patcher = Patcher(autoload=False)
    with patcher.add(
        AtomicPatch(f"{pkg}.core.f", lambda x: "new f", runtime_check=positive),
        AtomicPatch(f"{pkg}.core.g", lambda x, y=1: ("new g", y), runtime_check=positive),
    ):
        assert (core.f(1), core.f(-1)) == ("new f", "f")
        assert (core.g(1, y=5), core.g(-1)) == (("new g", 5), "g")
        assert id(positive) in _patch._shared_signatures
    dead, key = weakref.ref(positive), id(positive)
    del positive, patcher
    gc.collect()
    assert dead() is None
    assert key not in _patch._shared_signatures


def test_runtime_check_replacement_exceptions_propagate(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An exception raised by the replacement propagates; the original is not run as a fallback."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    calls: list[int] = []

    def replacement(x: Any) -> Any:
        calls.append(x)
        raise KeyError("from replacement")

    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", replacement, runtime_check=lambda x: True)
    ).apply()
    with pytest.raises(KeyError, match="from replacement"):
        core.compute(1)
    assert calls == [1]
    patcher.add(
        AtomicPatch(f"{pkg}.core.boom", lambda x: ("fine", x), runtime_check=lambda x: False)
    )
    with pytest.raises(ValueError, match="original raised"):
        core.boom(1)


def test_runtime_check_keeps_staticmethod_and_classmethod_semantics(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """With runtime_check, staticmethods get no self and classmethods get the calling class, both ways."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")

    def add(a, b=1):
        return ("new", a * b)

    def make(cls, x):
        return ("new", cls.__name__, x)

    patcher.add(
        AtomicPatch(f"{pkg}.core.Ops.add", add, runtime_check=lambda a, b=1: a > 0),
        AtomicPatch(f"{pkg}.core.Ops.make", make, runtime_check=lambda cls, x: x > 0),
    ).apply()
    assert isinstance(vars(core.Ops)["add"], staticmethod)
    assert isinstance(vars(core.Ops)["make"], classmethod)
    assert core.Ops.add(2, 3) == ("new", 6)
    assert core.Ops().add(2, 3) == ("new", 6)
    assert core.Ops().add(-2, 3) == ("orig", 1)
    assert core.SubOps.make(1) == ("new", "SubOps", 1)
    assert core.SubOps().make(-1) == ("orig", "SubOps", -1)
    assert core.Ops.make(-1) == ("orig", "Ops", -1)


_SIGNATURE_SRC = """
def compute(a, b=2, /, c=3, *args, d, e=None, f='x', **kw):
    return ({tag!r}, a, b, c, args, d, e, f, sorted(kw.items()))
"""


def _outcome(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args, **kwargs))
    except TypeError as exc:
        return ("TypeError", str(exc))


_call_args = st.lists(st.integers(-3, 3), max_size=5)
_call_kwargs = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e", "f", "z"]), st.integers(-3, 3), max_size=4
)


@pytest.mark.parametrize("generic", [False, True], ids=["fixed-signature", "generic"])
def test_runtime_check_wrapper_is_call_transparent(
    make_package: PackageFactory, patcher: Patcher, generic: bool
) -> None:
    """For any call shape the wrapper behaves exactly like the function it routes to (both wrapper paths)."""
    replacement_src = (
        "def compute(x, y=2, /, z=3, *rest, d, e=None, f='x', **extra):\n"
        "    return ('new', x, y, z, rest, d, e, f, sorted(extra.items()))\n"
        if generic
        else _SIGNATURE_SRC.replace("{tag!r}", "'new'")
    )
    pkg = make_package(
        {"core.py": _SIGNATURE_SRC.replace("{tag!r}", "'orig'"), "repl.py": replacement_src}
    )
    core = _import(f"{pkg}.core")
    repl = _import(f"{pkg}.repl")
    original = core.compute
    use = [False]
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", repl.compute, runtime_check=lambda *a, **k: use[0])
    ).apply()
    wrapper = core.compute
    assert wrapper.__ascend_patch_original__ is original

    @settings(max_examples=150, deadline=None)
    @given(_call_args, _call_kwargs, st.booleans())
    def check_call(args: list[int], kwargs: dict[str, int], route_to_replacement: bool) -> None:
        use[0] = route_to_replacement
        expected = _outcome(repl.compute if route_to_replacement else original, args, kwargs)
        got = _outcome(wrapper, args, kwargs)
        if generic and expected[0] == "TypeError":
            assert got[0] == "TypeError"
        else:
            assert got == expected

    check_call()
    # The first call chose the code the wrapper keeps (the calls above ran both).
    own = inspect.signature(wrapper, follow_wrapped=False)
    if generic:
        assert str(own) == "(*args, **kwargs)", "mismatched signatures keep the generic code"
    else:
        assert own == inspect.signature(original), "equal signatures get the exact signature"
    counters = report.get(f"{pkg}.core.compute").counters
    assert counters is not None and counters.replacement_calls + counters.fallback_calls > 0


def test_aliases_are_patched_and_reported(make_package: PackageFactory, patcher: Patcher) -> None:
    """Each alias is reported; a same-object alias gets the very same installed object; a missing one only warns."""
    pkg = make_package(
        {
            "__init__.py": "from .core import compute\n",
            "core.py": _CORE,
            "late.py": "def compute(x):\n    return ('late', x)\n",
            "copy.py": "def compute(x):\n    return ('copy', x)\n",
        }
    )
    package = _import(pkg)
    core = sys.modules[f"{pkg}.core"]
    copy = _import(f"{pkg}.copy")
    originals = (core.compute, copy.compute)
    report = patcher.add(
        AtomicPatch(
            f"{pkg}.core.compute",
            target_wrapper=lambda fn: lambda x: ("wrapped", fn(x)),
            aliases=[f"{pkg}.compute", f"{pkg}.copy.compute", f"{pkg}.gone", f"{pkg}.late.compute"],
        )
    ).apply()
    record = report.get(f"{pkg}.core.compute")
    assert record.status is Status.APPLIED
    assert package.compute is core.compute, (
        "an alias of the same object gets the same installed object"
    )
    assert package.compute(1) == ("wrapped", ("orig", 1))
    assert copy.compute(1) == ("wrapped", ("copy", 1)), (
        "a different object at an alias is wrapped on its own"
    )
    assert record.aliases[f"{pkg}.compute"] == "applied"
    assert record.aliases[f"{pkg}.copy.compute"] == "applied"
    assert record.aliases[f"{pkg}.gone"].startswith("not found")
    assert any(f"{pkg}.gone" in w for w in record.warnings)
    assert record.aliases[f"{pkg}.late.compute"].startswith("pending")
    assert report.ok

    late = _import(f"{pkg}.late")
    assert record.aliases[f"{pkg}.late.compute"] == "applied"
    assert late.compute(1) == ("wrapped", ("late", 1)), (
        "an alias in a module imported later is patched on import"
    )
    patcher.revert()
    assert (core.compute, copy.compute) == originals
    assert package.compute is originals[0]
    assert late.compute(1) == ("late", 1)


def test_late_alias_reexporting_the_target_is_not_wrapped_twice(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An alias module imported after the patch that re-exports the target keeps the one installed object."""
    pkg = make_package({"core.py": _CORE, "api.py": "from {name}.core import compute\n"})
    core = _import(f"{pkg}.core")
    original = core.compute
    report = patcher.add(
        AtomicPatch(
            f"{pkg}.core.compute",
            target_wrapper=lambda fn: lambda x: ("wrapped", fn(x)),
            aliases=f"{pkg}.api.compute",
        )
    ).apply()
    api = _import(f"{pkg}.api")
    assert report.get(f"{pkg}.core.compute").aliases[f"{pkg}.api.compute"] == "applied"
    assert api.compute(1) == ("wrapped", ("orig", 1)), (
        "the re-exported replacement must not be wrapped again"
    )
    assert api.compute is core.compute
    patcher.revert()
    assert core.compute is original
    assert api.compute is original, "revert must give the re-exporting module the original back"


def test_alias_with_runtime_check_shares_the_wrapper(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A same-object alias shares the runtime_check wrapper, so counters see calls through both names."""
    pkg = make_package({"__init__.py": "from .core import compute\n", "core.py": _CORE})
    package = _import(pkg)
    core = sys.modules[f"{pkg}.core"]
    report = patcher.add(
        AtomicPatch(
            f"{pkg}.core.compute",
            lambda x: ("new", x),
            runtime_check=lambda x: x > 0,
            aliases=f"{pkg}.compute",
        )
    ).apply()
    assert package.compute is core.compute
    assert package.compute(1) == ("new", 1) and core.compute(-1) == ("orig", -1)
    counters = report.get(f"{pkg}.core.compute").counters
    assert counters is not None and (counters.replacement_calls, counters.fallback_calls) == (1, 1)


def test_revert_with_a_pending_alias_leaves_no_import_watch(make_package: PackageFactory) -> None:
    """Reverting while an alias still waits for its module removes that watch (revert is exact)."""
    pkg = make_package({"core.py": _CORE, "api.py": "from {name}.core import compute\n"})
    core = _import(f"{pkg}.core")
    patcher = Patcher()
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), aliases=f"{pkg}.api.compute")
    ).apply()
    assert report.get(f"{pkg}.core.compute").aliases[f"{pkg}.api.compute"].startswith("pending")
    patcher.revert()
    assert core.compute(1) == ("orig", 1)
    assert f"{pkg}.api" not in hub._watches, "the alias watch must be removed by revert()"
    api = _import(f"{pkg}.api")
    assert api.compute(1) == ("orig", 1)


# ============================================================================ with_imports


_WITH_IMPORTS_SRC = """
from ascend_patch_core import with_imports

counter = 0

@with_imports("{name}.helpers")
def via_module(x):
    return helpers.double(x)

@with_imports("{name}.helpers as H")
def via_alias(x):
    return H.double(x)

@with_imports(("{name}.helpers", "double", "triple as T"))
def via_names(x):
    return double(x) + T(x)

@with_imports("{name}.helpers")
def bump():
    global counter
    counter += helpers.double(1)
    return counter

@with_imports("{name}.later")
def uses_later():
    return later.VALUE

class Ops:
    @staticmethod
    @with_imports("{name}.helpers as HS1")
    def s1(x):
        return ('s1', HS1.double(x))

    @with_imports("{name}.helpers as HS2")
    @staticmethod
    def s2(x):
        return ('s2', HS2.double(x))

    @classmethod
    @with_imports("{name}.helpers as HC1")
    def c1(cls, x):
        return ('c1', cls.__name__, HC1.double(x))

    @with_imports(("{name}.helpers", "triple as TC2"))
    @classmethod
    def c2(cls, x):
        return ('c2', cls.__name__, TC2(x))

class SubOps(Ops):
    pass
"""

_HELPERS_SRC = "def double(x):\n    return 2 * x\n\ndef triple(x):\n    return 3 * x\n"


def test_with_imports_injects_into_module_globals_on_first_call(
    make_package: PackageFactory,
) -> None:
    """String, 'as' and tuple specs bind into the function's real module globals on first call, not before."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC})
    repl = _import(f"{pkg}.repl")
    assert f"{pkg}.helpers" not in sys.modules, "decorating imports nothing"
    for name in ("helpers", "H", "double", "T"):
        assert name not in vars(repl)
    assert repl.via_module(2) == 4
    helpers = sys.modules[f"{pkg}.helpers"]
    assert vars(repl)["helpers"] is helpers
    assert "H" not in vars(repl), "only the called function's specs are resolved"
    assert repl.via_alias(3) == 6 and vars(repl)["H"] is helpers
    assert repl.via_names(1) == 5
    assert vars(repl)["double"] is helpers.double and vars(repl)["T"] is helpers.triple
    assert repl.via_module.__name__ == "via_module"


def test_with_imports_global_statement_writes_reach_the_module(
    make_package: PackageFactory,
) -> None:
    """A 'global' write inside a with_imports function changes the real module global."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC})
    repl = _import(f"{pkg}.repl")
    assert repl.bump() == 2
    assert repl.bump() == 4
    assert repl.counter == 4


def test_with_imports_failed_import_names_function_and_retries(
    make_package: PackageFactory,
) -> None:
    """A failed import warns; using the name raises ImportError naming the function and
    the spec; a later use retries."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC})
    repl = _import(f"{pkg}.repl")
    with pytest.raises(ImportError) as info, pytest.warns(UserWarning, match="later"):
        repl.uses_later()
    message = str(info.value)
    assert "uses_later" in message and f"{pkg}.later" in message
    (_pkg_dir(pkg) / "later.py").write_text("VALUE = 'arrived'\n")
    importlib.invalidate_caches()
    assert repl.uses_later() == "arrived"


def test_with_imports_under_staticmethod_and_classmethod(make_package: PackageFactory) -> None:
    """with_imports works inside and outside staticmethod/classmethod, on the class, instances and subclasses."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC})
    repl = _import(f"{pkg}.repl")
    for name, kind in (
        ("s1", staticmethod),
        ("s2", staticmethod),
        ("c1", classmethod),
        ("c2", classmethod),
    ):
        assert isinstance(vars(repl.Ops)[name], kind), name
    assert repl.Ops.s1(2) == ("s1", 4)
    assert repl.Ops().s2(2) == ("s2", 4)
    assert repl.SubOps.c1(2) == ("c1", "SubOps", 4)
    assert repl.SubOps().c2(2) == ("c2", "SubOps", 6)
    assert repl.Ops.c2(1) == ("c2", "Ops", 3)


def test_with_imports_patched_slot_becomes_the_plain_function(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """After the first call the patcher installs the plain function, and revert still restores the original."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC, "core.py": _CORE})
    core = _import(f"{pkg}.core")
    repl = _import(f"{pkg}.repl")
    originals = (core.compute, vars(core.Ops)["add"], vars(core.Ops)["make"])
    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", repl.via_module),
        AtomicPatch(f"{pkg}.core.Ops.add", vars(repl.Ops)["s2"]),
        AtomicPatch(f"{pkg}.core.Ops.make", vars(repl.Ops)["c1"]),
    ).apply()
    assert core.compute is repl.via_module, "the trampoline is installed until the first call"
    assert f"{pkg}.helpers" not in sys.modules
    assert core.compute(2) == 4
    assert core.compute is repl.via_module.__wrapped__
    assert core.compute(3) == 6
    assert core.Ops().add(2) == ("s2", 4)
    assert isinstance(vars(core.Ops)["add"], staticmethod)
    assert vars(core.Ops)["add"].__func__ is vars(repl.Ops)["s2"].__func__.__wrapped__
    assert core.SubOps.make(2) == ("c1", "SubOps", 4)
    assert isinstance(vars(core.Ops)["make"], classmethod)
    assert vars(core.Ops)["make"].__func__ is vars(repl.Ops)["c1"].__func__.__wrapped__
    patcher.revert()
    assert (core.compute, vars(core.Ops)["add"], vars(core.Ops)["make"]) == originals
    assert core.compute(2) == ("orig", 2)


def test_with_imports_swap_keeps_runtime_check(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A with_imports replacement under runtime_check stays runtime-checked after its first call."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC, "core.py": _CORE})
    core = _import(f"{pkg}.core")
    repl = _import(f"{pkg}.repl")
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", repl.via_module, runtime_check=lambda x: x > 0)
    ).apply()
    assert core.compute(2) == 4
    assert core.compute(-1) == ("orig", -1), "the runtime check must survive the with_imports swap"
    counters = report.get(f"{pkg}.core.compute").counters
    assert counters is not None and (counters.replacement_calls, counters.fallback_calls) == (1, 1)


def test_with_imports_swap_keeps_replacement_wrapper(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A replacement_wrapper around a with_imports replacement stays installed after its first call."""
    pkg = make_package({"repl.py": _WITH_IMPORTS_SRC, "helpers.py": _HELPERS_SRC, "core.py": _CORE})
    core = _import(f"{pkg}.core")
    repl = _import(f"{pkg}.repl")
    import functools

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(x: Any) -> Any:
            return ("rw", fn(x))

        return wrapped

    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", repl.via_module, replacement_wrapper=wrap)
    ).apply()
    assert core.compute(2) == ("rw", 4)
    assert core.compute(3) == ("rw", 6), (
        "the replacement_wrapper must survive the with_imports swap"
    )


# ============================================================================ Patch groups


def test_group_name_defaults_to_class_name_and_options_are_passed(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Group name defaults to the class name; patches() receives add()'s options."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    received: list[Any] = []

    class ScaleOps(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            received.append(options)
            k = options["k"]
            return [AtomicPatch(f"{pkg}.core.compute", lambda x: ("scaled", x * k))]

    class Named(Patch):
        name = "custom-name"

    assert ScaleOps.name == "ScaleOps" and Named.name == "custom-name"
    report = patcher.add(ScaleOps, options={"k": 10}).apply()
    assert received == [{"k": 10}]
    assert core.compute(2) == ("scaled", 20)
    assert report.get(f"{pkg}.core.compute").group == "ScaleOps"


def test_patch_called_with_a_function_is_a_legacy_patch() -> None:
    """Patch(func, options) is the 1.0 API and returns a LegacyPatch carrying func and options."""

    def msda(module: Any, options: Any) -> None:
        pass

    legacy = Patch(msda, {"x": 1})
    assert isinstance(legacy, LegacyPatch)
    assert legacy.func is msda and legacy.options == {"x": 1} and legacy.name == "msda"


def _conflicting_groups(target: str) -> tuple[type[Patch], type[Patch]]:
    class FastAttn(Patch):
        conflicts_with = ("SlowAttn",)

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(target, lambda x: ("fast", x))]

    class SlowAttn(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(target, lambda x: ("slow", x))]

    return FastAttn, SlowAttn


def test_conflicting_groups_warn_at_add_and_raise_at_apply_naming_both(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Adding two groups that conflict warns; apply() raises PatchConflictError naming
    both and how to fix it, changing nothing (issue 16: the DrivingSDK patcher's order)."""
    pkg = make_package({"core.py": _CORE})
    fast, slow = _conflicting_groups(f"{pkg}.core.compute")
    patcher.add(slow)
    with pytest.warns(UserWarning, match="disable\\('SlowAttn'\\)"):
        patcher.add(fast)
    core = _import(f"{pkg}.core")
    with pytest.raises(PatchConflictError) as info:
        patcher.apply()
    message = str(info.value)
    assert "'FastAttn'" in message and "'SlowAttn'" in message
    assert "disable('SlowAttn')" in message
    assert core.compute(1) == ("orig", 1), "the failed apply() changed nothing"
    assert not patcher.is_applied


def test_conflicting_groups_allowed_when_one_is_disabled(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A conflict does not count when one side is disabled; the disabled group is reported SKIPPED."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    fast, slow = _conflicting_groups(f"{pkg}.core.compute")
    report = patcher.disable("SlowAttn").add(fast).add(slow).apply()
    assert core.compute(1) == ("fast", 1)
    group = report.get("SlowAttn", kind="group")
    assert group.status is Status.SKIPPED and group.reason == "disabled"


def test_conflict_with_a_plugin_group_raises_at_apply(make_package: PackageFactory) -> None:
    """A user group conflicting with a plugin's group raises PatchConflictError at apply(), changing nothing."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    fast, slow = _conflicting_groups(f"{pkg}.core.compute")

    class Plugin:
        @hookimpl
        def register_patches(self) -> list[Any]:
            return [slow]

    p = Patcher(extra_plugins=[("test-plugin", Plugin())]).add(fast)
    try:
        with pytest.raises(PatchConflictError, match=r"FastAttn.*SlowAttn|SlowAttn.*FastAttn"):
            p.apply()
        assert core.compute(1) == ("orig", 1)
    finally:
        p.revert()


def test_a_plugins_opt_in_group_conflicts_only_once_enabled(make_package: PackageFactory) -> None:
    """A plugin's opt-in group that names a default group in conflicts_with is off until
    enabled: apply() works and applies the default one; enabling it raises the conflict."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    fast, slow = _conflicting_groups(f"{pkg}.core.compute")
    fast.opt_in = True

    class Plugin:
        @hookimpl
        def register_patches(self) -> list[Any]:
            return [fast, slow]

    p = Patcher(extra_plugins=[("test-plugin", Plugin())])
    try:
        report = p.apply()
        assert core.compute(1) == ("slow", 1)
        assert (report.get("FastAttn", kind="group").reason or "").startswith("opt-in")
    finally:
        p.revert()
    p = Patcher(extra_plugins=[("test-plugin", Plugin())]).enable("FastAttn")
    try:
        with pytest.raises(PatchConflictError, match=r"FastAttn.*SlowAttn"):
            p.apply()
        assert core.compute(1) == ("orig", 1)
    finally:
        p.revert()


@pytest.mark.parametrize("how", ["group-name", "class", "atomic", "target"])
def test_disable_forms_skip_with_reason(
    make_package: PackageFactory, patcher: Patcher, how: str
) -> None:
    """disable() by group name, class, AtomicPatch object or target string gives SKIPPED 'disabled'."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    atomic = AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), name="my-compute")

    class Group(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [atomic]

    by: dict[str, Any] = {
        "group-name": "Group",
        "class": Group,
        "atomic": atomic,
        "target": f"{pkg}.core.compute",
    }
    report = patcher.disable(by[how]).add(Group).apply()
    assert core.compute(1) == ("orig", 1)
    group_level = how in ("group-name", "class")
    record = report.get("Group", kind="group") if group_level else report.get("my-compute")
    assert record.status is Status.SKIPPED and record.reason == "disabled"
    assert not report.warnings


def test_unknown_disable_name_is_a_report_warning(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """disable() of a name matching nothing adds a report warning naming it."""
    pkg = make_package({"core.py": _CORE})
    report = (
        patcher.disable("NoSuchPatch").add(AtomicPatch(f"{pkg}.core.compute", lambda x: x)).apply()
    )
    assert any("NoSuchPatch" in w for w in report.warnings)
    assert "NoSuchPatch" in str(report)


def _group(target: str, tag: str) -> type[Patch]:
    class Once(Patch):
        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(target, target_wrapper=lambda fn: lambda x: (tag, fn(x)))]

    return Once


def test_adding_a_group_twice_applies_once(make_package: PackageFactory, patcher: Patcher) -> None:
    """add() of the same class twice applies it once and warns."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    group = _group(f"{pkg}.core.compute", "once")
    report = patcher.add(group).add(group).apply()
    assert core.compute(1) == ("once", ("orig", 1)), "a twice-added group must not wrap twice"
    assert len([r for r in report.records if r.target == f"{pkg}.core.compute"]) == 1
    assert any("added twice" in w for w in report.warnings)


def test_adding_a_group_twice_in_one_call_applies_once(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """add(G, G) in one call also applies G once and warns."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    group = _group(f"{pkg}.core.compute", "once")
    report = patcher.add(group, group).apply()
    assert core.compute(1) == ("once", ("orig", 1)), "a twice-added group must not wrap twice"
    assert any("added twice" in w for w in report.warnings)


def test_add_after_apply_is_incremental_and_disable_after_apply_reverts(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """add() after apply() installs at once; disable() after apply() reverts that patch only."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    originals = (core.compute, core.other)
    report = patcher.add(AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x))).apply()
    assert patcher.is_applied
    patcher.add(AtomicPatch(f"{pkg}.core.other", lambda x: ("new-other", x)))
    assert core.other(1) == ("new-other", 1)
    assert report.get(f"{pkg}.core.other").status is Status.APPLIED
    patcher.disable(f"{pkg}.core.compute")
    assert core.compute is originals[0]
    record = report.get(f"{pkg}.core.compute")
    assert record.status is Status.SKIPPED and "disabled" in (record.reason or "")
    assert core.other(1) == ("new-other", 1)
    patcher.revert()
    assert (core.compute, core.other) == originals


def _ordering_patch(target: str, log: list[str], **kwargs: Any) -> AtomicPatch:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        log.append(target.rpartition(".")[2])
        return lambda x: ("patched", fn(x))

    return AtomicPatch(target, target_wrapper=wrap, **kwargs)


def test_after_orders_installation_regardless_of_add_order(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """after= installs dependencies first, whatever the order of add()."""
    pkg = make_package({"core.py": _CORE})
    _import(f"{pkg}.core")
    log: list[str] = []
    third = _ordering_patch(f"{pkg}.core.third", log, after=[f"{pkg}.core.other"])
    second = _ordering_patch(f"{pkg}.core.other", log, after="first")
    first = _ordering_patch(f"{pkg}.core.compute", log, name="first")
    report = patcher.add(third, second, first).apply()
    assert log == ["compute", "other", "third"]
    assert all(r.status is Status.APPLIED for r in report.records)


def test_after_waits_for_a_dependency_in_a_later_import(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A dependent whose dependency waits for an import stays pending, then installs right after it."""
    pkg = make_package({"core.py": _CORE})
    late = make_package({"mod.py": "def f(x):\n    return ('late', x)\n"})
    core = _import(f"{pkg}.core")
    log: list[str] = []
    report = patcher.add(
        _ordering_patch(f"{pkg}.core.compute", log, after="dep"),
        _ordering_patch(f"{late}.mod.f", log, name="dep"),
    ).apply()
    record = report.get(f"{pkg}.core.compute")
    assert record.status is Status.PENDING and "dep" in (record.reason or "")
    assert core.compute(1) == ("orig", 1)
    _import(f"{late}.mod")
    assert log == ["f", "compute"]
    assert core.compute(1) == ("patched", ("orig", 1))


def test_skipped_or_unknown_or_cyclic_dependencies(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A skipped dependency skips its dependent; an unknown name or a cycle fails the patch."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), after="skipped-dep"),
        AtomicPatch(
            f"{pkg}.core.Ops.add", lambda a, b=1: 0, precheck=lambda: False, name="skipped-dep"
        ),
        AtomicPatch(f"{pkg}.core.other", lambda x: ("new", x), after="no-such-patch"),
        AtomicPatch(f"{pkg}.core.third", lambda x: ("new", x), name="cyc-a", after="cyc-b"),
        AtomicPatch(f"{pkg}.core.boom", lambda x: ("new", x), name="cyc-b", after="cyc-a"),
    ).apply()
    dependent = report.get(f"{pkg}.core.compute")
    assert dependent.status is Status.SKIPPED and "skipped-dep" in (dependent.reason or "")
    unknown = report.get(f"{pkg}.core.other")
    assert unknown.status is Status.FAILED and "no-such-patch" in (unknown.reason or "")
    for name in ("cyc-a", "cyc-b"):
        record = report.get(name)
        assert record.status is Status.FAILED and "cycle" in (record.reason or "")
    assert (
        core.compute(1) == ("orig", 1)
        and core.other(1) == ("other", 1)
        and core.third(1) == ("third", 1)
    )


def test_same_target_twice_warns_and_installs_in_order(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Two patches on one target: a warning names both; the later is installed over the earlier."""
    pkg = make_package({"core.py": _CORE})
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("first", x), name="p-first"),
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("second", x), name="p-second"),
    ).apply()
    [warning] = [w for w in report.warnings if "both patch" in w]
    assert "'p-first'" in warning and "'p-second'" in warning
    core = _import(f"{pkg}.core")
    assert core.compute(1) == ("second", 1)
    assert (
        report.get("p-first").status is Status.APPLIED
        and report.get("p-second").status is Status.APPLIED
    )
    patcher.revert()
    assert core.compute(1) == ("orig", 1)


def test_same_target_with_runtime_check_chains_to_the_first(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """With runtime_check, the second patch's fallback is the first patch's replacement."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("first", x), name="p-first"),
        AtomicPatch(
            f"{pkg}.core.compute",
            lambda x: ("second", x),
            name="p-second",
            runtime_check=lambda x: x > 0,
        ),
    ).apply()
    assert core.compute(1) == ("second", 1)
    assert core.compute(-1) == ("first", -1)
    patcher.revert()
    assert core.compute(-1) == ("orig", -1)


def test_same_target_twice_in_strict_mode_raises(
    make_package: PackageFactory, strict_patcher: Patcher
) -> None:
    """In strict mode two patches on one target raise PatchConflictError naming both, before any change."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    strict_patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("first", x), name="p-first"),
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("second", x), name="p-second"),
    )
    with pytest.raises(PatchConflictError) as info:
        strict_patcher.apply()
    assert "'p-first'" in str(info.value) and "'p-second'" in str(info.value)
    assert core.compute(1) == ("orig", 1)


def test_requires_checked_from_metadata(make_package: PackageFactory, patcher: Patcher) -> None:
    """requires= is satisfied, unsatisfied (reason names the installed version) or not installed."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    version = importlib.metadata.version("pluggy")
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), requires="pluggy>=1.0"),
        AtomicPatch(f"{pkg}.core.other", lambda x: ("new", x), requires="pluggy<0.1"),
        AtomicPatch(f"{pkg}.core.third", lambda x: ("new", x), requires="not-a-real-dist-xyz>=1"),
        AtomicPatch(f"{pkg}.core.boom", lambda x: ("new", x), requires="not-real>=1 | pluggy>=1"),
    ).apply()
    assert report.get(f"{pkg}.core.compute").status is Status.APPLIED and core.compute(1) == (
        "new",
        1,
    )
    old = report.get(f"{pkg}.core.other")
    assert old.status is Status.SKIPPED
    assert f"pluggy {version}" in (old.reason or "") and "pluggy<0.1" in (old.reason or "")
    absent = report.get(f"{pkg}.core.third")
    assert absent.status is Status.SKIPPED and "not-a-real-dist-xyz is not installed" in (
        absent.reason or ""
    )
    assert report.get(f"{pkg}.core.boom").status is Status.APPLIED and core.boom(1) == ("new", 1)
    assert core.other(1) == ("other", 1) and core.third(1) == ("third", 1)


def test_requires_is_checked_before_the_target_is_imported(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An unsatisfied requires= (also on a group) skips at apply(): no watch, no patch on later import."""
    pkg = make_package({"core.py": _CORE})

    class OldOnly(Patch):
        requires = "pluggy<0.1"

        @classmethod
        def patches(cls, options: Any = None) -> list[AtomicPatch]:
            return [AtomicPatch(f"{pkg}.core.other", lambda x: ("new", x))]

    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x), requires="pluggy<0.1"), OldOnly
    ).apply()
    assert pkg not in sys.modules
    # A group's own requirement is checked before its patches are built: one group record.
    for name in (f"{pkg}.core.compute", "OldOnly"):
        record = report.get(name)
        assert record.status is Status.SKIPPED and "pluggy" in (record.reason or "")
    assert pkg not in hub._watches
    core = _import(f"{pkg}.core")
    assert core.compute(1) == ("orig", 1) and core.other(1) == ("other", 1)


# ============================================================================ report


def test_report_json_and_table(make_package: PackageFactory, patcher: Patcher) -> None:
    """to_json() has the schema, counts and per-record status/reason/provenance; str() lists each target."""
    pkg = make_package({"core.py": _CORE})
    late = make_package({"mod.py": "def f(x):\n    return x\n"})
    _import(f"{pkg}.core")
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.compute", lambda x: ("new", x)),
        AtomicPatch(f"{pkg}.core.other", lambda x: ("new", x), precheck=lambda: False),
        AtomicPatch(f"{pkg}.core.missing_name", lambda x: x),
        AtomicPatch(f"{late}.mod.f", lambda x: x),
    ).apply()
    assert isinstance(report, Report)
    data = json.loads(report.to_json())
    assert data["schema"] == "ascend-patch-report/1"
    assert data["counts"] == {"applied": 1, "pending": 1, "skipped": 2, "failed": 0, "reverted": 0}
    by_target = {r["target"]: r for r in data["records"]}
    assert by_target[f"{pkg}.core.compute"]["status"] == "applied"
    assert by_target[f"{pkg}.core.compute"]["reason"] is None
    assert by_target[f"{pkg}.core.other"]["reason"] == "precheck returned False"
    assert "missing_name" in by_target[f"{pkg}.core.missing_name"]["reason"]
    assert by_target[f"{late}.mod.f"]["status"] == "pending"
    assert by_target[f"{pkg}.core.compute"]["provenance"] == {
        "plugin": None,
        "distribution": None,
        "version": None,
        "entry_point": None,
        "file": None,
    }
    text = str(report)
    for target in by_target:
        assert target in text
    assert "precheck returned False" in text
    final = patcher.revert()
    assert final.get(f"{pkg}.core.compute").status is Status.REVERTED


def test_status_values() -> None:
    """Status members are the documented strings, usable as str and constructible from them."""
    assert [s.value for s in Status] == ["applied", "pending", "skipped", "failed", "reverted"]
    assert Status("skipped") is Status.SKIPPED
    assert str(Status.FAILED) == "failed"
    assert Status.APPLIED == "applied"


# ============================================================================ strict mode


def _failing_patch(target: str) -> AtomicPatch:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        raise RuntimeError("cannot wrap")

    return AtomicPatch(target, target_wrapper=wrap)


def test_strict_raises_at_apply_for_an_imported_module(
    make_package: PackageFactory, strict_patcher: Patcher
) -> None:
    """Patcher(strict=True) raises PatchError from apply() when a patch on an imported module fails."""
    pkg = make_package({"core.py": _CORE})
    core = _import(f"{pkg}.core")
    with pytest.raises(PatchError, match="cannot wrap"):
        strict_patcher.add(_failing_patch(f"{pkg}.core.compute")).apply()
    assert core.compute(1) == ("orig", 1)


def test_strict_raises_from_the_import_statement(
    make_package: PackageFactory, strict_patcher: Patcher
) -> None:
    """Patcher(strict=True): a patch failing at import time makes the import statement raise PatchError."""
    pkg = make_package({"core.py": _CORE})
    strict_patcher.add(_failing_patch(f"{pkg}.core.compute")).apply()
    with pytest.raises(PatchError, match="cannot wrap"):
        _import(f"{pkg}.core")


def test_strict_from_environment(
    make_package: PackageFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ASCEND_PATCH_STRICT=1 makes a default Patcher strict."""
    pkg = make_package({"core.py": _CORE})
    _import(f"{pkg}.core")
    monkeypatch.setenv("ASCEND_PATCH_STRICT", "1")
    p = Patcher().add(_failing_patch(f"{pkg}.core.compute"))
    try:
        with pytest.raises(PatchError):
            p.apply()
    finally:
        p.revert()


def test_non_strict_import_succeeds_and_records_failure(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Without strict, the import succeeds, the original stays, and the record is FAILED with the error."""
    pkg = make_package({"core.py": _CORE})
    report = patcher.add(_failing_patch(f"{pkg}.core.compute")).apply()
    core = _import(f"{pkg}.core")
    assert core.compute(1) == ("orig", 1)
    record = report.get(f"{pkg}.core.compute")
    assert record.status is Status.FAILED and "cannot wrap" in (record.reason or "")
    assert not report.ok


def test_add_tells_import_rules_from_patches_by_their_class() -> None:
    # add() answers "is this an import rule?" for the model's own classes without
    # looking up the rule mark; subclasses, rules and odd objects still get the lookup.
    from unittest import mock

    from ascend_patch_core import SkipImport

    class MyPatch(AtomicPatch):
        pass

    class MyRule(SkipImport):
        pass

    class Meta(type):  # classes of this metaclass are unhashable
        def __eq__(self, other: object) -> bool:
            return self is other

    class Odd(metaclass=Meta):
        pass

    def dumps(*args: Any, **kwargs: Any) -> str:
        return "patched"

    patcher = Patcher()
    try:
        patcher.add(MyPatch("json.dumps", dumps))
        patcher.add(MyRule("_ap_rule_sorted_pkg"), SkipImport("_ap_rule_sorted_other"))
        for bad in (Odd(), mock.Mock(), object()):
            with pytest.raises(TypeError, match=r"Patcher\.add\(\) takes Patch subclasses"):
                patcher.add(bad)
        patcher.apply()
        assert json.dumps({}) == "patched"
        from ascend_patch_core import is_stub

        for name in ("_ap_rule_sorted_pkg", "_ap_rule_sorted_other"):
            assert is_stub(importlib.import_module(name))
    finally:
        patcher.revert()
    assert json.dumps({}) == "{}"
    assert "_ap_rule_sorted_pkg" not in sys.modules


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("create", "no"), ("create", "False"), ("create", 2), ("rebind", "yes"), ("rebind", [])],
)
def test_a_switch_of_atomic_patch_takes_true_or_false_only(keyword: str, value: object) -> None:
    # bool("no") is True: create="no" used to make the slot it was meant not to.
    with pytest.raises(PatchDefinitionError, match=f"{keyword} must be True or False"):
        AtomicPatch("json.dumps", json.dumps, **{keyword: value})


def test_a_switch_of_atomic_patch_takes_the_usual_spellings() -> None:
    assert AtomicPatch("json.dumps", json.dumps, create=1).create is True
    assert AtomicPatch("json.dumps", json.dumps, create=None).create is False
    assert AtomicPatch("json.dumps", json.dumps, rebind=0).rebind is False
    assert AtomicPatch("json.dumps", json.dumps).rebind is None
