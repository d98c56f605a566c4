"""Prechecks that explain themselves, create=True slots, and torch-npu constraints under the emulator."""

from __future__ import annotations

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patcher
from ascend_patch_core import SkipPatch
from ascend_patch_core import Status


def test_precheck_can_skip_with_a_reason(make_package, patcher: Patcher) -> None:
    """raise SkipPatch('why') in a precheck: SKIPPED with that reason, the original untouched."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})

    def no_npu() -> bool:
        raise SkipPatch("no NPU runtime")

    report = patcher.add(AtomicPatch(f"{pkg}.core.f", lambda: "new", precheck=no_npu)).apply()
    core = __import__(f"{pkg}.core", fromlist=["f"])
    record = report.get(f"{pkg}.core.f")
    assert (record.status, record.reason) == (Status.SKIPPED, "no NPU runtime")
    assert core.f() == "orig"


def test_precheck_of_a_slot_to_be_created_sees_original_none(
    make_package, patcher: Patcher
) -> None:
    """With create=True and no slot yet, the precheck's 'original' is None, not an internal sentinel."""
    pkg = make_package({"core.py": "REG = {}\n"})
    seen = []

    def precheck(original: object) -> bool:
        seen.append(original)
        return True

    patcher.add(AtomicPatch(f"{pkg}.core.REG['k']", 1, create=True, precheck=precheck)).apply()
    core = __import__(f"{pkg}.core", fromlist=["REG"])
    assert seen == [None]
    assert core.REG == {"k": 1}
    patcher.revert()
    assert core.REG == {}


@pytest.mark.torch
def test_torch_npu_requirement_uses_the_emulated_version(make_package, npu_emulator) -> None:
    """Under the emulator, requires='torch-npu>=2.6' is judged against the emulated version, not 'not installed'."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    version = npu_emulator.version if hasattr(npu_emulator, "version") else None
    patcher = Patcher().add(
        AtomicPatch(f"{pkg}.core.f", lambda: "new", requires="torch-npu>=2.6"),
        AtomicPatch(f"{pkg}.core.g", lambda: "x", requires="torch-npu<2.0", create=True),
    )
    try:
        report = patcher.apply()
        ok, too_old = report.get(f"{pkg}.core.f"), report.get(f"{pkg}.core.g")
        assert ok.status is Status.PENDING, ok.reason
        assert too_old.status is Status.SKIPPED
        assert "is installed" in (too_old.reason or "") and (
            version is None or version in too_old.reason
        )
    finally:
        patcher.revert()


@pytest.mark.parametrize("value", [0, "", None])
def test_falsy_precheck_results_skip(make_package, patcher: Patcher, value: object) -> None:
    """Any falsy precheck result skips with the generic reason."""
    pkg = make_package({"core.py": "def f():\n    return 'orig'\n"})
    report = patcher.add(
        AtomicPatch(f"{pkg}.core.f", lambda: "new", precheck=lambda: value)
    ).apply()
    __import__(f"{pkg}.core")
    assert report.get(f"{pkg}.core.f").reason == "precheck returned False"


def test_create_applies_to_aliases_and_revert_removes_them(make_package, patcher: Patcher) -> None:
    """create=True makes missing alias slots too (same object as the target); revert deletes both."""
    pkg = make_package({"a.py": "X = 1\n", "b.py": "Y = 2\n"})

    class NCCL:
        pass

    report = patcher.add(
        AtomicPatch(f"{pkg}.a.PG", NCCL, aliases=[f"{pkg}.b.PG"], create=True)
    ).apply()
    a = __import__(f"{pkg}.a", fromlist=["X"])
    b = __import__(f"{pkg}.b", fromlist=["Y"])
    assert a.PG is NCCL and b.PG is NCCL
    assert report.get(f"{pkg}.a.PG").aliases == {f"{pkg}.b.PG": "applied"}
    patcher.revert()
    assert not hasattr(a, "PG") and not hasattr(b, "PG")


def test_group_requirement_is_checked_before_its_patches_are_built(patcher: Patcher) -> None:
    """A Patch group whose requires= is unmet is one SKIPPED group record; patches() never runs."""
    from ascend_patch_core import Patch

    calls = []

    class NeedsNpu(Patch):
        requires = "not-a-real-dist-xyz>=1"

        @classmethod
        def patches(cls, options=None):
            calls.append(1)
            return [AtomicPatch("nowhere.mod.f", lambda: None)]

    report = patcher.add(NeedsNpu).apply()
    record = report.get("NeedsNpu")
    assert (record.kind, record.status) == ("group", Status.SKIPPED)
    assert "not-a-real-dist-xyz" in (record.reason or "") and "not installed" in (
        record.reason or ""
    )
    assert calls == []


def test_a_bare_distribution_name_is_checked_without_packaging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """requires='dist' (no version) needs only the metadata: packaging is not imported for it."""
    import sys

    from ascend_patch_core._discovery.metadata import MetadataCache
    from ascend_patch_core._discovery.requires import check_requirement

    for name in [m for m in sys.modules if m == "packaging" or m.startswith("packaging.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "packaging", None)  # any import of it now raises
    monkeypatch.setenv("ASCEND_PATCH_CACHE", "0")  # answer from metadata, not from a cache
    cache = MetadataCache()
    ok, why = check_requirement("pluggy", cache)
    assert ok and why.startswith("pluggy ")
    assert check_requirement("apx-never-installed-dist", cache) == (
        False,
        "apx-never-installed-dist is not installed",
    )
    assert check_requirement("apx-never-installed-dist | pluggy", cache)[0]


def test_a_version_range_of_an_absent_distribution_is_checked_without_packaging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """requires='dist>=1,<2' where dist is not installed: "not installed", packaging unimported.

    Most of a plugin's groups name libraries a program does not have (the transformers
    groups in an mmcv program); on a cache miss, parsing their ranges imported packaging
    (~10 ms) for answers that need no version.
    """
    import sys

    from ascend_patch_core._discovery.metadata import MetadataCache
    from ascend_patch_core._discovery.requires import check_requirement

    for name in [m for m in sys.modules if m == "packaging" or m.startswith("packaging.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "packaging", None)  # any import of it now raises
    monkeypatch.setenv("ASCEND_PATCH_CACHE", "0")
    cache = MetadataCache()
    for text in ("apx-never-installed-dist>=4.51,<6", "apx-never-installed-dist ==1.0.*"):
        assert check_requirement(text, cache) == (
            False,
            "apx-never-installed-dist is not installed",
        )


def test_a_malformed_range_of_an_absent_distribution_is_still_reported() -> None:
    """The fast path takes only well-formed ranges: a malformed one is parsed and named."""
    from ascend_patch_core._discovery.metadata import MetadataCache
    from ascend_patch_core._discovery.requires import check_requirement

    ok, why = check_requirement("apx-never-installed-dist>>1", MetadataCache())
    assert not ok and why.startswith("invalid requirement 'apx-never-installed-dist>>1'")
