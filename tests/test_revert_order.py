"""Several patches on one slot, reverted in any order (issue 22, item 6).

``p1.apply(); p2.apply(); p1.revert(); p2.revert()`` left p1's replacement installed
for ever while p1's record said ``reverted``: p2's revert put back what p2 had
found, p1's replacement. Now every installation is a layer of its slot: the top
one's revert restores the layer below (or the original), a lower one's is spliced
out, and the layer above it stands on what it stood on -- its runtime_check
fallback and its target_wrapper replacement included. docs/core.md, "Reverting".
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ascend_patch_core import AtomicPatch
from ascend_patch_core import Patch
from ascend_patch_core import Patcher
from ascend_patch_core import Status


PackageFactory = Callable[..., str]
CHANGED = "was changed by someone else"


def imp(name: str) -> types.ModuleType:
    return importlib.import_module(name)


def _core(make_package: PackageFactory) -> types.ModuleType:
    pkg = make_package({"core.py": "def f(x):\n    return 'orig'\n"})
    return imp(f"{pkg}.core")


def _replacement(tag: str) -> Callable[[Any], str]:
    def replacement(x: Any) -> str:
        return tag

    return replacement


def _run(tmp_path: Path, code: str, **switches: str) -> list[str]:
    """``code`` in a fresh interpreter, the way a user's script runs; its stdout lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_PATCH_")}
    env.update(switches)
    env["ASCEND_PATCH_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


# ----------------------------------------------------------------------------- as the issue says it


def test_two_patchers_reverted_first_in_first_out_restore_the_original(tmp_path: Path) -> None:
    """The issue's sequence in a user's script: the original is back and both records tell the truth."""
    (tmp_path / "shop.py").write_text("def price(x):\n    return x\n")
    lines = _run(
        tmp_path,
        """
        import warnings
        import shop
        from ascend_patch_core import AtomicPatch, Patcher

        original = shop.price
        p1 = Patcher().add(AtomicPatch("shop.price", lambda x: x * 10))
        p2 = Patcher().add(AtomicPatch("shop.price", lambda x: x * 100))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p1.apply(); p2.apply()
            print("both", shop.price(1))
            first = p1.revert()
            print("p1 reverted", shop.price(1), [r.status.value for r in first], first.warnings)
            print("p2", [r.status.value for r in p2.report])
            second = p2.revert()
            print("p2 reverted", shop.price(1), shop.price is original, second.warnings)
        print("warned", [str(w.message) for w in caught if "changed by" in str(w.message)])
        """,
    )
    assert lines == [
        "both 100",
        "p1 reverted 100 ['reverted'] []",
        "p2 ['applied']",
        "p2 reverted 1 True []",
        "warned []",
    ]


def test_every_way_of_applying_stacks_and_unstacks_in_any_order(tmp_path: Path) -> None:
    """The default patcher, a Patcher, AtomicPatch(...).apply() and a group's apply_all() on
    one function, reverted oldest first: each revert leaves the newest live layer visible."""
    (tmp_path / "shop.py").write_text("def price(x):\n    return x\n")
    lines = _run(
        tmp_path,
        """
        import shop
        import ascend_patch_core
        from ascend_patch_core import AtomicPatch, Patch, Patcher, default_patcher

        class Discount(Patch):
            @classmethod
            def patches(cls, options=None):
                return [AtomicPatch("shop.price", lambda x: x - 1)]

        original = shop.price
        default_patcher.add(AtomicPatch("shop.price", lambda x: x * 2))
        ascend_patch_core.apply()
        mine = Patcher().add(AtomicPatch("shop.price", lambda x: x * 3))
        mine.apply()
        alone = AtomicPatch("shop.price", lambda x: x * 5)
        alone.apply()
        Discount.apply_all()
        print(shop.price(10))
        ascend_patch_core.revert(); print(shop.price(10))
        mine.revert(); print(shop.price(10))
        Discount.revert_all(); print(shop.price(10), alone.is_applied)
        alone.revert(); print(shop.price(10), shop.price is original, alone.is_applied)
        """,
        ASCEND_PATCH_AUTOLOAD="0",  # the default patcher holds only what the script adds
    )
    assert lines == ["9", "9", "9", "50 True", "10 True False"]


# ----------------------------------------------------------------------------- what the layer above calls


def test_a_runtime_check_above_a_reverted_patch_falls_back_to_the_original(
    make_package: PackageFactory,
) -> None:
    """p2's runtime_check fallback called p1's replacement; after p1.revert() it calls the original."""
    core = _core(make_package)
    original = core.f
    p1 = Patcher().add(AtomicPatch(f"{core.__name__}.f", _replacement("p1")))
    p2 = Patcher().add(
        AtomicPatch(f"{core.__name__}.f", _replacement("p2"), runtime_check=lambda x: x > 0)
    )
    p1.apply()
    p2.apply()
    wrapper = core.f
    assert (core.f(1), core.f(0)) == ("p2", "p1")
    p1.revert()
    assert core.f is wrapper, "the wrapper stays installed (modules that imported it keep it)"
    assert (core.f(1), core.f(0)) == ("p2", "orig")
    assert (core.f(1), core.f(0)) == ("p2", "orig")  # after its first call chose its code again
    counters = p2.report.records[0].counters
    assert counters is not None and counters.fallback_calls == 3
    p2.revert()
    assert core.f is original


def test_a_target_wrapper_above_a_reverted_patch_is_made_again_over_the_original(
    make_package: PackageFactory,
) -> None:
    core = _core(make_package)
    original = core.f
    made_from: list[Any] = []

    def wrap(orig: Callable[[Any], str]) -> Callable[[Any], str]:
        made_from.append(orig)
        return lambda x: f"wrapped({orig(x)})"

    p1 = Patcher().add(AtomicPatch(f"{core.__name__}.f", _replacement("p1")))
    p2 = Patcher().add(AtomicPatch(f"{core.__name__}.f", target_wrapper=wrap))
    p1.apply()
    p2.apply()
    assert core.f(0) == "wrapped(p1)"
    p1.revert()
    assert core.f(0) == "wrapped(orig)"
    assert made_from[-1] is original
    assert p2.installed()[0].original is original
    p2.revert()
    assert core.f is original


def test_a_layer_that_cannot_be_made_again_is_reported(make_package: PackageFactory) -> None:
    """target_wrapper refusing the new original: the layer stays as it was, and the revert says so."""
    core = _core(make_package)
    calls = []

    def wrap_once(orig: Callable[[Any], str]) -> Callable[[Any], str]:
        calls.append(orig)
        if len(calls) > 1:
            raise RuntimeError("only once")
        return lambda x: f"wrapped({orig(x)})"

    p1 = Patcher().add(AtomicPatch(f"{core.__name__}.f", _replacement("p1")))
    p2 = Patcher().add(AtomicPatch(f"{core.__name__}.f", target_wrapper=wrap_once))
    p1.apply()
    p2.apply()
    report = p1.revert()
    assert core.f(0) == "wrapped(p1)"
    assert any("could not be made again" in w and "only once" in w for w in report.warnings)
    assert any("could not be made again" in w for w in p2.report.records[0].warnings)
    assert p2.report.records[0].status is Status.APPLIED
    p2.revert()
    assert core.f(0) == "orig"


# ----------------------------------------------------------------------------- lazy layers, disable(), three deep


def test_layers_installed_when_their_module_is_imported_unstack_in_any_order(
    make_package: PackageFactory,
) -> None:
    pkg = make_package({"core.py": "def f(x):\n    return 'orig'\n"})
    target = f"{pkg}.core.f"
    patchers = [Patcher().add(AtomicPatch(target, _replacement(f"p{i}"))) for i in range(3)]
    for p in patchers:
        assert p.apply().records[0].status is Status.PENDING
    core = imp(f"{pkg}.core")
    assert core.f(0) == "p2"
    patchers[1].revert()
    assert core.f(0) == "p2"
    patchers[2].revert()
    assert core.f(0) == "p0"
    patchers[0].revert()
    assert core.f(0) == "orig"
    assert [p.report.records[0].status for p in patchers] == [Status.REVERTED] * 3


def test_disable_after_apply_takes_out_a_lower_layer(make_package: PackageFactory) -> None:
    core = _core(make_package)
    original = core.f
    patch = AtomicPatch(f"{core.__name__}.f", _replacement("p1"), name="lower")
    p1 = Patcher().add(patch)
    p2 = Patcher().add(
        AtomicPatch(f"{core.__name__}.f", target_wrapper=lambda o: lambda x: o(x) + "!")
    )
    p1.apply()
    p2.apply()
    assert core.f(0) == "p1!"
    p1.disable("lower")
    assert core.f(0) == "orig!"
    assert p1.report.records[0].status is Status.SKIPPED
    p2.revert()
    p1.revert()
    assert core.f is original


def test_a_class_attribute_and_a_reapplied_layer(make_package: PackageFactory) -> None:
    """A staticmethod keeps its kind through every layer; re-applying puts a patcher on top."""
    pkg = make_package(
        {"core.py": "class K:\n    @staticmethod\n    def s(x):\n        return 'orig'\n"}
    )
    core = imp(f"{pkg}.core")
    raw = core.K.__dict__["s"]
    target = f"{pkg}.core.K.s"
    p1 = Patcher().add(AtomicPatch(target, _replacement("p1")))
    p2 = Patcher().add(AtomicPatch(target, _replacement("p2"), runtime_check=lambda x: x))
    p1.apply()
    p2.apply()
    p1.revert()
    p1.apply()  # now above p2
    assert (core.K.s(1), core.K().s(0)) == ("p1", "p1")
    p1.revert()
    assert (core.K.s(1), core.K().s(0)) == ("p2", "orig")
    p2.revert()
    assert core.K.__dict__["s"] is raw


def test_an_inherited_method_and_a_mapping_entry_come_back_exactly(
    make_package: PackageFactory,
) -> None:
    """A shadowed inherited method is deleted again, a mapping entry holds its value again,
    whichever of two patches goes first."""
    pkg = make_package(
        {
            "core.py": """
                class Base:
                    def f(self):
                        return "base"

                class Sub(Base):
                    pass

                TABLE = {"key": lambda: "orig"}
            """
        }
    )
    core = imp(f"{pkg}.core")
    entry = core.TABLE["key"]
    wrap = {"target_wrapper": lambda orig: lambda *a: f"w({orig(*a)})"}
    for target, call in (
        (f"{pkg}.core.Sub.f", lambda: core.Sub().f()),
        (f"{pkg}.core.TABLE.key", lambda: core.TABLE["key"]()),
    ):
        p1 = Patcher().add(AtomicPatch(target, lambda *a: "p1"))
        p2 = Patcher().add(AtomicPatch(target, **wrap))
        p1.apply()
        p2.apply()
        assert call() == "w(p1)"
        p1.revert()
        assert call() in ("w(base)", "w(orig)")
        p2.revert()
    assert "f" not in vars(core.Sub) and core.Sub().f() == "base"
    assert core.TABLE["key"] is entry


def test_a_stale_reference_rebound_by_two_layers_gets_the_original_back(
    make_package: PackageFactory,
) -> None:
    """``from core import f`` before apply(), rebound by both patchers, reverted oldest first."""
    pkg = make_package(
        {"core.py": "def f(x):\n    return 'orig'\n", "user.py": "from {name}.core import f\n"}
    )
    core, user = imp(f"{pkg}.core"), imp(f"{pkg}.user")
    original = core.f
    target = f"{pkg}.core.f"
    p1 = Patcher(rebind_stale=True).add(AtomicPatch(target, _replacement("p1")))
    p2 = Patcher(rebind_stale=True).add(
        AtomicPatch(target, _replacement("p2"), runtime_check=lambda x: x)
    )
    p1.apply()
    p2.apply()
    assert (user.f(1), user.f(0)) == ("p2", "p1")
    p1.revert()
    assert (user.f(1), user.f(0)) == ("p2", "orig")
    p2.revert()
    assert user.f is original and core.f is original


# ----------------------------------------------------------------------------- someone else's value


def test_a_value_assigned_by_user_code_is_left_and_reported_whatever_the_order(
    make_package: PackageFactory,
) -> None:
    core = _core(make_package)
    target = f"{core.__name__}.f"

    def mine(x: Any) -> str:
        return "mine"

    for order in ((0, 1), (1, 0)):
        patchers = [Patcher().add(AtomicPatch(target, _replacement(f"p{i}"))) for i in range(2)]
        for p in patchers:
            p.apply()
        core.f = mine  # the user's own patch, after ours
        said = [any(CHANGED in w for w in patchers[i].revert().warnings) for i in order]
        assert core.f is mine
        # A layer at the top finds the user's value where its own should be, and says
        # so; a lower one (p0 while p1 is live) only hands its place over.
        assert said == ([False, True] if order == (0, 1) else [True, True])


def test_a_patch_over_a_users_value_restores_that_value(make_package: PackageFactory) -> None:
    core = _core(make_package)
    target = f"{core.__name__}.f"
    p1 = Patcher().add(AtomicPatch(target, _replacement("p1")))
    p1.apply()

    def mine(x: Any) -> str:
        return "mine"

    core.f = mine
    p2 = Patcher().add(AtomicPatch(target, target_wrapper=lambda o: lambda x: o(x) + "!"))
    p2.apply()
    assert core.f(0) == "mine!"
    # p1 lies under the user's value: what it would put back is not its to restore.
    assert any(CHANGED in w for w in p1.revert().warnings)
    assert core.f(0) == "mine!"
    p2.revert()
    assert core.f is mine


# ----------------------------------------------------------------------------- any order, any mix


KINDS = ("plain", "check", "wrap")
TARGETS = ("f", "s")
PROBES = (-1, 0, 1, 2, 3, 4)


def _behaviour(kind: str, index: int, below: Callable[[int], str]) -> Callable[[int], str]:
    if kind == "plain":
        return lambda x: f"r{index}"
    if kind == "check":
        return lambda x: f"r{index}" if x == index else below(x)
    return lambda x: f"w{index}({below(x)})"


def _patch(kind: str, index: int, target: str) -> AtomicPatch:
    if kind == "plain":
        return AtomicPatch(target, lambda x, i=index: f"r{i}")
    if kind == "check":
        return AtomicPatch(
            target, lambda x, i=index: f"r{i}", runtime_check=lambda x, i=index: x == i
        )
    return AtomicPatch(target, target_wrapper=lambda orig, i=index: lambda x: f"w{i}({orig(x)})")


class _Layer:
    """One way of applying: a Patcher, AtomicPatch(...).apply(), or a group's apply_all()."""

    def __init__(self, how: str, kind: str, index: int, targets: list[str]) -> None:
        self.how, self.kind, self.index, self.targets = how, kind, index, targets
        self.records: list[Any] = []
        patches = [_patch(kind, index, t) for t in targets]
        if how == "patcher":
            self.patcher = Patcher().add(*patches)
        elif how == "alone":
            self.alone = patches[0]
        else:
            self.group = type(
                f"Layer{index}", (Patch,), {"patches": classmethod(lambda cls, o=None: patches)}
            )

    def apply(self) -> None:
        if self.how == "patcher":
            self.records = list(self.patcher.apply().records)
        elif self.how == "alone":
            self.records = [self.alone.apply()]
        else:
            self.records = [r for r in self.group.apply_all() if r.kind == "patch"]

    def revert(self) -> None:
        if self.how == "patcher":
            self.patcher.revert()
        elif self.how == "alone":
            self.alone.revert()
        else:
            self.group.revert_all()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, int]]]:
    count = draw(st.integers(2, 5))
    layers = []
    for _ in range(count):
        targets = draw(st.lists(st.sampled_from(TARGETS), min_size=1, max_size=2, unique=True))
        how = draw(
            st.sampled_from(
                ("patcher", "alone", "group") if len(targets) == 1 else ("patcher", "group")
            )
        )
        layers.append((how, draw(st.sampled_from(KINDS)), sorted(targets)))
    step = st.one_of(
        st.tuples(st.sampled_from(("apply", "revert")), st.integers(0, count - 1)),
        st.tuples(st.just("assign"), st.integers(0, len(TARGETS) - 1)),
    )
    return layers, draw(st.lists(step, min_size=1, max_size=24))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.randoms(use_true_random=False), st.booleans())
def test_any_sequence_of_apply_and_revert_shows_the_top_live_layer(
    scenario: tuple[list[tuple[str, str, list[str]]], list[tuple[str, int]]],
    random: Any,
    allow_assign: bool,
) -> None:
    """Random apply/revert (and user assignments) over k layers on one or two slots.

    The model: each slot's chain of live layers over a base (the original, or the
    value the user last assigned; layers under an assignment are out of sight). After
    every step each slot behaves as its chain's top does, every record says whether
    its layer is live, and no warning speaks of a foreign value unless there was one.
    """
    layers_spec, steps = scenario
    name = f"_ap_layers_{abs(hash((repr(scenario), random.random())))}"
    module = types.ModuleType(name)
    exec(
        "def f(x):\n    return 'orig'\nclass K:\n    @staticmethod\n    def s(x):\n        return 'orig'\n",
        module.__dict__,
    )
    sys.modules[name] = module
    originals = {"f": module.__dict__["f"], "s": module.K.__dict__["s"]}
    slots = {"f": lambda: module.f, "s": lambda: module.K.s}
    layers = [
        _Layer(how, kind, i, [f"{name}.f" if t == "f" else f"{name}.K.s" for t in targets])
        for i, (how, kind, targets) in enumerate(layers_spec)
    ]
    live: set[int] = set()
    base = {t: (lambda x: "orig") for t in TARGETS}
    chains: dict[str, list[int]] = {t: [] for t in TARGETS}
    assigned = 0
    try:
        for action, arg in steps:
            if action == "assign":
                if not allow_assign:
                    continue
                target = TARGETS[arg]
                assigned += 1
                value = (lambda tag: lambda x: tag)(f"x{assigned}")
                if target == "f":
                    module.f = value
                else:
                    module.K.s = staticmethod(value)
                base[target], chains[target] = value, []  # the layers under it are out of sight
                continue
            layer, (_, _, targets) = layers[arg], layers_spec[arg]
            if action == "apply" and arg not in live:
                layer.apply()
                live.add(arg)
                for t in targets:
                    chains[t].append(arg)
            elif action == "revert" and arg in live:
                layer.revert()
                live.discard(arg)
                for t in targets:
                    if arg in chains[t]:
                        chains[t].remove(arg)
            _check(layers, layers_spec, live, base, chains, slots)
        for arg in random.sample(sorted(live), len(live)):
            layers[arg].revert()
            live.discard(arg)
            for t in TARGETS:
                if arg in chains[t]:
                    chains[t].remove(arg)
            _check(layers, layers_spec, live, base, chains, slots)
        if not assigned:
            assert module.__dict__["f"] is originals["f"]
            assert module.K.__dict__["s"] is originals["s"]
        for layer in layers:
            if layer.how == "patcher" and not assigned:
                assert not any(CHANGED in w for w in layer.patcher.report.warnings)
    finally:
        for layer in layers:
            layer.revert()
        del sys.modules[name]


def _check(
    layers: list[_Layer],
    spec: list[tuple[str, str, list[str]]],
    live: set[int],
    base: dict[str, Callable[[int], str]],
    chains: dict[str, list[int]],
    slots: dict[str, Callable[[], Callable[[int], str]]],
) -> None:
    for target in TARGETS:
        expected = base[target]
        for index in chains[target]:
            expected = _behaviour(spec[index][1], index, expected)
        seen = [slots[target]()(x) for x in PROBES]
        assert seen == [expected(x) for x in PROBES], (target, chains[target])
    for index, layer in enumerate(layers):
        want = Status.APPLIED if index in live else Status.REVERTED
        for record in layer.records:
            assert record.status is want, (index, layer.how, record)
