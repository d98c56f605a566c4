"""Hypothesis-fuzzed patch declarations: only documented errors, and apply() never crashes."""

from __future__ import annotations

import contextlib
import sys

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ascend_patch_core import AtomicPatch
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import ReplaceImport
from ascend_patch_core import SkipImport
from ascend_patch_core import Status


_names = st.sampled_from(
    ["core", "core.f", "core.K", "core.K.s", "core.REG", "nope", "core.K.nope"]
)
_junk = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=8),
    st.just(""),
    st.lists(st.text(max_size=4), max_size=3),
    st.just(print),
    st.just(lambda *a, **k: True),
    st.just(lambda *a, **k: 1 / 0),
)


@st.composite
def _spec(draw: st.DrawFn, pkg: str) -> dict[str, object]:
    target = draw(
        st.one_of(_names.map(lambda n: f"{pkg}.{n}"), st.text(max_size=12), st.integers())
    )
    spec: dict[str, object] = {"target": target}
    spec["replacement"] = draw(st.one_of(_junk, st.just(f"{pkg}.core:g"), st.just("no_such_mod:x")))
    for key in ("precheck", "runtime_check", "replacement_wrapper", "target_wrapper"):
        if draw(st.booleans()):
            spec[key] = draw(_junk)
    if draw(st.booleans()):
        spec["aliases"] = draw(st.one_of(_junk, _names.map(lambda n: [f"{pkg}.{n}"])))
    if draw(st.booleans()):
        spec["requires"] = draw(
            st.one_of(_junk, st.sampled_from(["pluggy>=1", "nope-dist>1", "pluggy<0", "|"]))
        )
    if draw(st.booleans()):
        spec["after"] = draw(st.one_of(_junk, st.just(["other"])))
    return spec


@pytest.fixture
def fuzz_pkg(make_package) -> str:
    return make_package(
        {
            "core.py": """
                def f(x=1):
                    return ("f", x)
                def g(x=1):
                    return ("g", x)
                class K:
                    @staticmethod
                    def s(x=1):
                        return ("s", x)
                REG = {"a": 1}
            """
        }
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_patch_specs_raise_only_definition_errors_and_apply_never_crashes(
    fuzz_pkg: str, data
) -> None:
    """AtomicPatch(**random) either builds or raises PatchDefinitionError; apply/revert of what builds never raises."""
    specs = [data.draw(_spec(fuzz_pkg)) for _ in range(data.draw(st.integers(1, 4)))]
    patches = []
    for spec in specs:
        target = spec.pop("target")
        try:
            patches.append(AtomicPatch(target, **spec))  # type: ignore[arg-type]
        except PatchDefinitionError:
            continue
    import_first = data.draw(st.booleans())
    if import_first:
        __import__(f"{fuzz_pkg}.core")
    patcher = Patcher().add(*patches)
    report = patcher.apply()
    __import__(f"{fuzz_pkg}.core")
    for record in report.records:
        assert isinstance(record.status, Status)
        if record.status in (Status.SKIPPED, Status.FAILED):
            assert record.reason, record
    report.to_json()
    patcher.revert()
    core = sys.modules[f"{fuzz_pkg}.core"]
    assert core.f() == ("f", 1)
    assert core.K.s() == ("s", 1)
    assert core.REG == {"a": 1}


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=15), st.integers(), st.none()), st.one_of(_junk, st.just(sys)))
def test_random_import_rules_raise_only_definition_errors(
    name: object, replacement: object
) -> None:
    """Rule constructors reject bad input with PatchDefinitionError only."""
    for build in (lambda: SkipImport(name), lambda: ReplaceImport(name, replacement)):  # type: ignore[arg-type]
        with contextlib.suppress(PatchDefinitionError):
            build()
