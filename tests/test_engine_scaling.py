"""add(), apply(), disable(), report and revert() cost the same per patch at any size (issue 22, item 9).

``Patcher.add()`` called once per patch used to be quadratic: every call looked for
``conflicts_with`` pairs among all the declarations added so far (37 µs per patch at
500, 222 µs at 4 000). After ``apply()`` more of the same hid behind it: a strict
check of every record, ``after=`` names matched against every entry and a cycle walk
from each, disable() taking patches out of the undo log one search at a time.

Work is counted, not timed: a profile hook counts every Python and C call the
measured statement makes (deterministic, whatever the machine's load), and the
per-patch count at 8n is compared with the count at n. Linear: about 1 (fixed
costs make it less); quadratic: about 8. The bound, 2, is generous both ways.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import pytest

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch
from ascend_patch_core import Patcher
from ascend_patch_core import Status


SMALL, LARGE = 250, 2000
#: The largest ratio of per-patch work at LARGE to that at SMALL still called linear.
LINEAR = 2.0
_unique = itertools.count()


def replacement() -> str:
    return "patched"


def calls_made(statement: Callable[[], object]) -> int:
    """How many Python and C calls ``statement()`` makes."""
    count = 0

    def tick(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += 1

    sys.setprofile(tick)
    try:
        statement()
    finally:
        sys.setprofile(None)
    return count


@pytest.fixture
def loaded_module() -> Iterator[Callable[[int], str]]:
    """A factory of imported modules ``name`` holding ``f0 .. f{n-1}``; removed afterwards."""
    names: list[str] = []

    def make(n: int) -> str:
        name = f"_ap_scaling_{next(_unique)}"
        module = types.ModuleType(name)
        for i in range(n):
            setattr(module, f"f{i}", lambda i=i: i)
        sys.modules[name] = module
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


Scenario = Callable[[int, Callable[[int], str]], tuple[Callable[[], object], Callable[[], None]]]


def _patches(module: str, n: int, **options: Any) -> list[AtomicPatch]:
    return [AtomicPatch(f"{module}.f{i}", replacement, **options) for i in range(n)]


def add_one_at_a_time(n: int, make: Callable[[int], str]) -> Any:
    patches = _patches(f"_ap_not_imported_{next(_unique)}", n)
    patcher = Patcher()
    return (lambda: [patcher.add(p) for p in patches]), patcher.revert


def add_all_at_once(n: int, make: Callable[[int], str]) -> Any:
    patches = _patches(f"_ap_not_imported_{next(_unique)}", n)
    patcher = Patcher()
    return (lambda: patcher.add(*patches)), patcher.revert


def add_one_at_a_time_after_apply(n: int, make: Callable[[int], str]) -> Any:
    """Each add() installs at once (the module is imported)."""
    patches = _patches(make(n), n)
    patcher = Patcher()
    patcher.apply()
    return (lambda: [patcher.add(p) for p in patches]), patcher.revert


def add_one_at_a_time_after_apply_strict(n: int, make: Callable[[int], str]) -> Any:
    patches = _patches(make(n), n)
    patcher = Patcher(strict=True)
    patcher.apply()
    return (lambda: [patcher.add(p) for p in patches]), patcher.revert


def add_a_chain_of_after_one_at_a_time(n: int, make: Callable[[int], str]) -> Any:
    """f{i} after f{i-1}: each add() links to the patch before it, and checks for cycles."""
    module = make(n)
    patches = [
        AtomicPatch(f"{module}.f{i}", replacement, after=(f"{module}.f{i - 1}",) if i else ())
        for i in range(n)
    ]
    patcher = Patcher()
    patcher.apply()
    return (lambda: [patcher.add(p) for p in patches]), patcher.revert


def add_many_after_one_at_once(n: int, make: Callable[[int], str]) -> Any:
    """Every patch after the last one declared, in one add(): the plan orders and links them."""
    module = make(n)
    first = f"{module}.f{n - 1}"
    patches = [AtomicPatch(f"{module}.f{i}", replacement, after=(first,)) for i in range(n - 1)]
    patcher = Patcher()
    patcher.add(*patches, AtomicPatch(first, replacement))
    return patcher.apply, patcher.revert


def add_groups_one_at_a_time(n: int, make: Callable[[int], str]) -> Any:
    groups = [
        type(
            f"Group{i}",
            (Patch,),
            {"conflicts_with": (f"other{i}",), "patches": classmethod(lambda cls, o=None: [])},
        )
        for i in range(n)
    ]
    patcher = Patcher()
    return (lambda: [patcher.add(g) for g in groups]), patcher.revert


def apply_after_adding_one_at_a_time(n: int, make: Callable[[int], str]) -> Any:
    patcher = Patcher()
    for p in _patches(make(n), n):
        patcher.add(p)
    return patcher.apply, patcher.revert


def revert(n: int, make: Callable[[int], str]) -> Any:
    patcher = Patcher()
    for p in _patches(make(n), n):
        patcher.add(p)
    patcher.apply()
    return patcher.revert, lambda: None


def report(n: int, make: Callable[[int], str]) -> Any:
    patcher = Patcher().add(*_patches(make(n), n))
    patcher.apply()
    return (lambda: str(patcher.report)), patcher.revert


def disable_a_group_after_apply(n: int, make: Callable[[int], str]) -> Any:
    patches = _patches(make(n), n)
    group = type("Big", (Patch,), {"patches": classmethod(lambda cls, o=None: patches)})
    patcher = Patcher().add(group)
    patcher.apply()
    return (lambda: patcher.disable("Big")), patcher.revert


def disable_one_at_a_time_after_apply(n: int, make: Callable[[int], str]) -> Any:
    patches = _patches(make(n), n)
    patcher = Patcher().add(*patches)
    patcher.apply()
    return (lambda: [patcher.disable(p) for p in patches]), patcher.revert


SCENARIOS = [
    add_one_at_a_time,
    add_all_at_once,
    add_one_at_a_time_after_apply,
    add_one_at_a_time_after_apply_strict,
    add_a_chain_of_after_one_at_a_time,
    add_many_after_one_at_once,
    add_groups_one_at_a_time,
    apply_after_adding_one_at_a_time,
    revert,
    report,
    disable_a_group_after_apply,
    disable_one_at_a_time_after_apply,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_work_per_patch_does_not_grow_with_the_number_of_patches(
    scenario: Scenario, loaded_module: Callable[[int], str]
) -> None:
    per_patch = {}
    for n in (SMALL, LARGE):
        measured, cleanup = scenario(n, loaded_module)
        try:
            per_patch[n] = calls_made(measured) / n
        finally:
            cleanup()
    ratio = per_patch[LARGE] / per_patch[SMALL]
    assert ratio <= LINEAR, (
        f"{scenario.__name__}: {per_patch[SMALL]:.0f} calls per patch at {SMALL}, "
        f"{per_patch[LARGE]:.0f} at {LARGE} (x{ratio:.1f}; linear is about 1)"
    )


def test_patches_added_one_at_a_time_all_apply_and_revert(
    loaded_module: Callable[[int], str],
) -> None:
    """What the linear paths do is still right: a chain of after=, groups and conflicts."""
    module = sys.modules[loaded_module(300)]
    originals = [getattr(module, f"f{i}") for i in range(300)]
    patcher = Patcher()
    for i in reversed(range(300)):  # chains of ten, each patch after the one before it
        after = (f"{module.__name__}.f{i - 1}",) if i % 10 else ()
        patcher.add(AtomicPatch(f"{module.__name__}.f{i}", replacement, after=after))
    report = patcher.apply()
    assert {r.status for r in report.records} == {Status.APPLIED}
    assert all(getattr(module, f"f{i}")() == "patched" for i in range(300))
    patcher.disable(f"{module.__name__}.f7")
    assert module.f7 is originals[7] and module.f8() == "patched"
    patcher.revert()
    assert all(getattr(module, f"f{i}") is originals[i] for i in range(300))


def test_a_conflict_is_still_found_among_groups_added_one_at_a_time() -> None:
    groups = [
        type(f"G{i}", (Patch,), {"patches": classmethod(lambda c, o=None: [])}) for i in range(50)
    ]
    late = type(
        "Late", (Patch,), {"conflicts_with": ("G7",), "patches": classmethod(lambda c, o=None: [])}
    )
    patcher = Patcher()
    for group in groups:
        patcher.add(group)
    with pytest.warns(UserWarning, match=r"patch groups 'Late' and 'G7' conflict"):
        patcher.add(late)
    early = type("Early", (Patch,), {"patches": classmethod(lambda c, o=None: [])})
    naming = type(
        "Naming",
        (Patch,),
        {"conflicts_with": ("Early",), "patches": classmethod(lambda c, o=None: [])},
    )
    with pytest.warns(UserWarning, match=r"patch groups 'Naming' and 'Early' conflict"):
        Patcher().add(naming).add(early)
    # A cycle through after= made one add() at a time is still failed, not left waiting.
    first = AtomicPatch("_ap_cycle_mod.a", replacement, after=("_ap_cycle_mod.b",))
    second = AtomicPatch("_ap_cycle_mod.b", replacement, after=("_ap_cycle_mod.a",))
    patcher = Patcher().add(first, second)
    statuses = {r.name: r.status for r in patcher.apply().records}
    patcher.revert()
    assert statuses == {"_ap_cycle_mod.a": Status.FAILED, "_ap_cycle_mod.b": Status.FAILED}
