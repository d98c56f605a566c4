"""Target paths: parsing, side-effect-free resolution, and every installation kind.

Installation tests run the patched code and compare it with the original's behaviour,
then revert and check that the original is back by identity.
"""

from __future__ import annotations

import importlib
import string
import sys
import types
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ascend_patch_core import AtomicPatch
from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Patcher
from ascend_patch_core import Status
from ascend_patch_core._install.target import Missing
from ascend_patch_core._install.target import Slot
from ascend_patch_core._install.target import Waiting
from ascend_patch_core._install.target import resolve
from ascend_patch_core._model.paths import TargetPath


PackageFactory = Callable[..., str]


def _import(name: str) -> types.ModuleType:
    return importlib.import_module(name)


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "module", "names", "keys"),
    [
        ("a.b", None, ["a", "b"], [False, False]),
        ("torch.nn.functional.gelu", None, ["torch", "nn", "functional", "gelu"], [False] * 4),
        ("a.b:C.d", "a.b", ["a", "b", "C", "d"], [False] * 4),
        ("a:C", "a", ["a", "C"], [False, False]),
        ("a.reg['x.y']", None, ["a", "reg", "x.y"], [False, False, True]),
        ('a.reg["k"]', None, ["a", "reg", "k"], [False, False, True]),
        ("a.reg['k'].attr", None, ["a", "reg", "k", "attr"], [False, False, True, False]),
        ("a.reg['k']['j']", None, ["a", "reg", "k", "j"], [False, False, True, True]),
        ("a.reg['']", None, ["a", "reg", ""], [False, False, True]),
        ("_a1.B_2.c3", None, ["_a1", "B_2", "c3"], [False] * 3),
    ],
)
def test_parse_valid_forms(
    text: str, module: str | None, names: list[str], keys: list[bool]
) -> None:
    """Valid target paths parse into the expected segments, module part and key flags."""
    path = TargetPath.parse(text)
    assert path.text == text
    assert str(path) == text
    assert path.module == module
    assert [s.name for s in path.segments] == names
    assert [s.is_key for s in path.segments] == keys
    assert path.root == names[0]


@pytest.mark.parametrize(
    "text",
    [
        "",  # empty
        "torch",  # one segment
        "a.",  # trailing dot
        "a.b.",  # trailing dot
        ".a.b",  # leading dot
        "a..b",  # empty segment
        "a.b-c",  # bad character
        "a.b c",  # space
        "a.1b",  # segment starting with a digit
        "a.b$",  # bad character
        "a.reg[x]",  # unquoted key
        "a.reg['x'",  # unclosed bracket
        "a.reg['x\"]",  # mismatched quotes
        "a.reg[",  # bracket at the end
        "['a'].b",  # starts with a key
        "a:",  # empty attribute part
        ":a.b",  # empty module part
        "a:b:c",  # two colons
        "a-b:c",  # bad module name
    ],
)
def test_parse_invalid_forms_raise_definition_error(text: str) -> None:
    """Malformed target paths raise PatchDefinitionError (a ValueError), never anything else."""
    with pytest.raises(PatchDefinitionError):
        TargetPath.parse(text)


@pytest.mark.parametrize("text", ["a.reg['x']y", "a.reg['x'].", "a.reg['x']['y']z"])
def test_parse_rejects_garbage_after_a_bracket_key(text: str) -> None:
    """After a bracketed key only '.', '[' or the end may follow; a trailing dot is an error."""
    with pytest.raises(PatchDefinitionError):
        TargetPath.parse(text)


@pytest.mark.parametrize("value", [None, 3, b"a.b", ["a", "b"]])
def test_parse_rejects_non_strings(value: object) -> None:
    """A target path that is not a string is a definition error."""
    with pytest.raises(PatchDefinitionError):
        TargetPath.parse(value)  # type: ignore[arg-type]


def test_atomic_patch_validates_its_target_eagerly() -> None:
    """Declaring an AtomicPatch with a bad path fails at declaration, naming the path."""
    with pytest.raises(PatchDefinitionError, match="torch"):
        AtomicPatch("torch", lambda: None)
    with pytest.raises(PatchDefinitionError):
        AtomicPatch("a.b", lambda: None, aliases=["a."])


_PATH_ALPHABET = string.ascii_letters[:6] + "_019.:[]'\" -$é"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=_PATH_ALPHABET, max_size=20))
def test_parse_random_strings_parse_or_raise_definition_error(text: str) -> None:
    """Any string either parses (and keeps its text) or raises PatchDefinitionError -- nothing else."""
    try:
        path = TargetPath.parse(text)
    except PatchDefinitionError:
        return
    assert path.text == text
    assert len(path.segments) >= 2
    assert not path.segments[0].is_key


def test_unicode_identifiers_parse_alike_with_and_without_keys() -> None:
    """Python identifiers may be non-ASCII; both parsing paths accept the same names."""
    plain = TargetPath.parse("pkg.modèle.Größe")
    keyed = TargetPath.parse("pkg.modèle.REG['k'].Größe")
    assert [s.name for s in plain.segments] == ["pkg", "modèle", "Größe"]
    assert [s.name for s in keyed.segments] == ["pkg", "modèle", "REG", "k", "Größe"]
    assert [s.name for s in TargetPath.parse("m.℘['k']").segments] == ["m", "℘", "k"]
    for bad in ("pkg.1x", "pkg.a-b", "pkg.REG['k'].1x", "m.x²['k']", "m.x²"):
        with pytest.raises(PatchDefinitionError):
            TargetPath.parse(bad)


_identifier = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(_identifier, min_size=2, max_size=6), st.integers(min_value=0, max_value=6))
def test_parse_dotted_identifiers_always_round_trip(names: list[str], cut: int) -> None:
    """Dotted identifiers always parse; .text round-trips and segments are the dotted parts."""
    text = ".".join(names)
    path = TargetPath.parse(text)
    assert path.text == text
    assert [s.name for s in path.segments] == names
    assert TargetPath.parse(path.text) == path
    cut = min(max(cut, 1), len(names) - 1)
    explicit = ".".join(names[:cut]) + ":" + ".".join(names[cut:])
    parsed = TargetPath.parse(explicit)
    assert parsed.module == ".".join(names[:cut])
    assert [s.name for s in parsed.segments] == names
    assert parsed.text == explicit


# ----------------------------------------------------------------------------- resolution


def test_resolving_a_not_imported_package_waits_and_imports_nothing(
    make_package: PackageFactory,
) -> None:
    """Resolving a target of a package that is not imported returns Waiting and imports nothing."""
    pkg = make_package(
        {"__init__.py": "raise RuntimeError('must not run')\n", "core.py": "def f(): pass\n"}
    )
    before = set(sys.modules)
    found = resolve(TargetPath.parse(f"{pkg}.core.f"))
    assert found == Waiting(pkg)
    assert set(sys.modules) == before


def test_resolving_below_an_imported_package_waits_for_the_submodule(
    make_package: PackageFactory,
) -> None:
    """A target in a submodule whose file exists but is not imported waits for that submodule."""
    pkg = make_package({"__init__.py": "", "core.py": "raise RuntimeError('must not run')\n"})
    _import(pkg)
    before = set(sys.modules)
    assert resolve(TargetPath.parse(f"{pkg}.core.f")) == Waiting(f"{pkg}.core")
    assert resolve(TargetPath.parse(f"{pkg}.core.Class.method")) == Waiting(f"{pkg}.core")
    assert set(sys.modules) == before


def test_resolution_never_triggers_a_lazy_module_getattr(make_package: PackageFactory) -> None:
    """A PEP 562 module __getattr__ is never called by resolution (it could import anything)."""
    pkg = make_package(
        {
            "lazy.py": """
                CALLS = []
                def __getattr__(name):
                    CALLS.append(name)
                    if name == "Thing":
                        class Thing:
                            def method(self):
                                return 1
                        return Thing
                    raise AttributeError(name)
            """,
        }
    )
    lazy = _import(f"{pkg}.lazy")
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.lazy.Thing")), Missing)
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.lazy.Thing.method")), Missing)
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.lazy:Thing.method")), Missing)
    assert lazy.CALLS == []


def test_lazy_package_getattr_not_triggered_and_submodule_awaited(
    make_package: PackageFactory,
) -> None:
    """A lazy package (transformers-style) is read from __dict__ only; existing submodules are awaited."""
    pkg = make_package(
        {
            "__init__.py": """
                CALLS = []
                def __getattr__(name):
                    CALLS.append(name)
                    import importlib
                    return importlib.import_module("." + name, __name__)
            """,
            "models.py": "def build():\n    return 'built'\n",
        }
    )
    package = _import(pkg)
    assert resolve(TargetPath.parse(f"{pkg}.models.build")) == Waiting(f"{pkg}.models")
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.nothing_here")), Missing)
    assert package.CALLS == []
    assert f"{pkg}.models" not in sys.modules


def test_missing_attribute_on_plain_module_is_missing(make_package: PackageFactory) -> None:
    """A name absent from an imported non-package module resolves to Missing with a reason."""
    pkg = make_package({"core.py": "def f():\n    return 1\n"})
    _import(f"{pkg}.core")
    found = resolve(TargetPath.parse(f"{pkg}.core.g"))
    assert isinstance(found, Missing)
    assert "g" in found.reason and f"{pkg}.core" in found.reason
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.core.f.nope")), Missing)
    # A package without a submodule of that name is Missing, not Waiting.
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.nomodule")), Missing)


def test_explicit_module_form_resolves_through_sys_modules(make_package: PackageFactory) -> None:
    """'pkg.sub:Attr' names the module explicitly: it waits for pkg.sub even when pkg shadows 'sub'."""
    pkg = make_package(
        {
            "__init__.py": "sub = 'a string that shadows the submodule'\n",
            "sub.py": "def f():\n    return 1\n",
        }
    )
    _import(pkg)
    assert resolve(TargetPath.parse(f"{pkg}.sub:f")) == Waiting(f"{pkg}.sub")
    sub = _import(f"{pkg}.sub")
    found = resolve(TargetPath.parse(f"{pkg}.sub:f"))
    assert isinstance(found, Slot)
    assert found.owner is sub and found.raw is sub.f and found.kind == "module"
    assert found.module == f"{pkg}.sub"


def test_resolved_slots_describe_their_kind(make_package: PackageFactory) -> None:
    """Resolution returns module/class/item/object slots holding the raw objects."""
    pkg = make_package(
        {
            "mod.py": """
                class Base:
                    @staticmethod
                    def s():
                        return 's'
                class Sub(Base):
                    pass
                REG = {'a.b': 1}
                class Holder:
                    pass
                obj = Holder()
                obj.value = 3
            """
        }
    )
    mod = _import(f"{pkg}.mod")
    slot = resolve(TargetPath.parse(f"{pkg}.mod.Sub.s"))
    assert isinstance(slot, Slot)
    assert (slot.kind, slot.owner, slot.own) == ("class", mod.Sub, False)
    assert isinstance(slot.raw, staticmethod) and slot.raw is vars(mod.Base)["s"]
    item = resolve(TargetPath.parse(f"{pkg}.mod.REG['a.b']"))
    assert isinstance(item, Slot) and (item.kind, item.owner, item.raw) == ("item", mod.REG, 1)
    attr = resolve(TargetPath.parse(f"{pkg}.mod.obj.value"))
    assert isinstance(attr, Slot) and (attr.kind, attr.owner, attr.raw, attr.own) == (
        "object",
        mod.obj,
        3,
        True,
    )
    assert isinstance(resolve(TargetPath.parse(f"{pkg}.mod.REG['zz']")), Missing)
    created = resolve(TargetPath.parse(f"{pkg}.mod.REG['zz']"), create=True)
    assert isinstance(created, Slot) and created.own is False


# ----------------------------------------------------------------------------- installation kinds


def test_module_function_is_replaced_and_restored(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A module function is replaced (callers see the replacement) and revert restores it by identity."""
    pkg = make_package(
        {
            "core.py": "def scale(x, k=2):\n    return x * k\n",
            "user.py": "from {name} import core\ndef run(x):\n    return core.scale(x)\n",
        }
    )
    core = _import(f"{pkg}.core")
    user = _import(f"{pkg}.user")
    original = core.scale
    assert user.run(3) == 6

    def scale(x, k=2):
        return x * k + 1

    report = patcher.add(AtomicPatch(f"{pkg}.core.scale", scale)).apply()
    assert report.get(f"{pkg}.core.scale").status is Status.APPLIED
    assert core.scale is scale
    assert user.run(3) == 7
    patcher.revert()
    assert core.scale is original
    assert user.run(3) == 6


def test_class_method_replacement_receives_self(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A plain method replacement is called as a method (receives self) and revert restores it."""
    pkg = make_package(
        {
            "mod.py": """
                class Model:
                    def __init__(self, w):
                        self.w = w
                    def forward(self, x):
                        return ('orig', self.w * x)
            """
        }
    )
    mod = _import(f"{pkg}.mod")
    original = vars(mod.Model)["forward"]
    model = mod.Model(3)

    def forward(self, x):
        return ("new", self.w + x)

    patcher.add(AtomicPatch(f"{pkg}.mod.Model.forward", forward)).apply()
    assert model.forward(2) == ("new", 5)
    assert mod.Model.forward(model, 2) == ("new", 5)
    patcher.revert()
    assert vars(mod.Model)["forward"] is original
    assert model.forward(2) == ("orig", 6)


def test_staticmethod_target_keeps_static_semantics(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A plain function replacing a staticmethod gets no self, called on the class or an instance."""
    pkg = make_package(
        {
            "mod.py": """
                class Ops:
                    @staticmethod
                    def add(a, b=1):
                        return ('orig', a + b)
            """
        }
    )
    mod = _import(f"{pkg}.mod")
    raw = vars(mod.Ops)["add"]
    seen: list[object] = []

    def add(a, b=1):
        seen.append(a)
        return ("new", a * b)

    patcher.add(AtomicPatch(f"{pkg}.mod.Ops.add", add)).apply()
    assert isinstance(vars(mod.Ops)["add"], staticmethod)
    assert mod.Ops.add(3, 4) == ("new", 12)
    assert mod.Ops().add(3, 4) == ("new", 12)
    assert mod.Ops().add(5) == ("new", 5)
    assert seen == [3, 3, 5], "no instance may be injected as the first argument"
    patcher.revert()
    assert vars(mod.Ops)["add"] is raw
    assert mod.Ops().add(3, 4) == ("orig", 7)


def test_classmethod_target_receives_cls_also_on_subclass(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """A plain function replacing a classmethod receives the class it is called on, subclasses included."""
    pkg = make_package(
        {
            "mod.py": """
                class Base:
                    tag = 'base'
                    @classmethod
                    def make(cls, x):
                        return ('orig', cls.tag, x)
                class Child(Base):
                    tag = 'child'
            """
        }
    )
    mod = _import(f"{pkg}.mod")
    raw = vars(mod.Base)["make"]

    def make(cls, x):
        return ("new", cls.tag, x)

    patcher.add(AtomicPatch(f"{pkg}.mod.Base.make", make)).apply()
    assert isinstance(vars(mod.Base)["make"], classmethod)
    assert mod.Base.make(1) == ("new", "base", 1)
    assert mod.Child.make(2) == ("new", "child", 2)
    assert mod.Child().make(3) == ("new", "child", 3)
    patcher.revert()
    assert vars(mod.Base)["make"] is raw
    assert mod.Child.make(2) == ("orig", "child", 2)


def test_property_getter_replaced_setter_kept(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Replacing a property's getter keeps the property, its setter, deleter and docstring."""
    pkg = make_package(
        {
            "mod.py": """
                class Box:
                    def __init__(self):
                        self._v = 1
                    def _get(self):
                        return self._v
                    def _set(self, v):
                        self._v = v
                    def _del(self):
                        self._v = None
                    value = property(_get, _set, _del, 'the value')
            """
        }
    )
    mod = _import(f"{pkg}.mod")
    raw = vars(mod.Box)["value"]

    def value(self):
        return self._v * 100

    patcher.add(AtomicPatch(f"{pkg}.mod.Box.value", value)).apply()
    box = mod.Box()
    new = vars(mod.Box)["value"]
    assert isinstance(new, property) and new.fget is value
    assert box.value == 100
    box.value = 2
    assert box._v == 2 and box.value == 200
    assert new.__doc__ == "the value"
    del box.value
    assert box._v is None
    patcher.revert()
    assert vars(mod.Box)["value"] is raw
    box.value = 4
    assert box.value == 4


def test_inherited_attribute_is_shadowed_then_deleted(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Patching an inherited attribute sets it on the subclass; revert deletes it, exposing the base's."""
    pkg = make_package(
        {
            "mod.py": """
                class Base:
                    def run(self):
                        return 'base'
                    @staticmethod
                    def helper():
                        return 'base-helper'
                class Sub(Base):
                    pass
            """
        }
    )
    mod = _import(f"{pkg}.mod")

    def run(self):
        return "patched-" + type(self).__name__

    def helper():
        return "patched-helper"

    patcher.add(
        AtomicPatch(f"{pkg}.mod.Sub.run", run),
        AtomicPatch(f"{pkg}.mod.Sub.helper", helper),
    ).apply()
    assert mod.Sub().run() == "patched-Sub"
    assert mod.Base().run() == "base", "the base class is untouched"
    assert mod.Sub.helper() == "patched-helper" and mod.Sub().helper() == "patched-helper"
    assert isinstance(vars(mod.Sub)["helper"], staticmethod)
    patcher.revert()
    assert "run" not in vars(mod.Sub) and "helper" not in vars(mod.Sub)
    assert mod.Sub().run() == "base"
    assert mod.Sub().helper() == "base-helper"


def test_dict_entries_by_dotted_path_and_bracket(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """Mapping entries are patched by dotted key or by bracketed key (with dots inside) and restored."""
    pkg = make_package(
        {
            "reg.py": """
                def conv(x):
                    return ('conv', x)
                def dotted(x):
                    return ('dotted', x)
                class Registry:
                    def __init__(self):
                        self._module_dict = {'Conv': conv, 'a.b': dotted}
                    def build(self, key, x):
                        return self._module_dict[key](x)
                MODELS = Registry()
            """
        }
    )
    reg = _import(f"{pkg}.reg")

    def conv(x):
        return ("npu-conv", x)

    def dotted(x):
        return ("npu-dotted", x)

    patcher.add(
        AtomicPatch(f"{pkg}.reg.MODELS._module_dict.Conv", conv),
        AtomicPatch(f"{pkg}.reg.MODELS._module_dict['a.b']", dotted),
    ).apply()
    assert reg.MODELS.build("Conv", 1) == ("npu-conv", 1)
    assert reg.MODELS.build("a.b", 2) == ("npu-dotted", 2)
    patcher.revert()
    assert reg.MODELS._module_dict == {"Conv": reg.conv, "a.b": reg.dotted}
    assert reg.MODELS.build("a.b", 2) == ("dotted", 2)


def test_create_registry_entry_removed_on_revert(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """create=True adds a missing registry entry; revert removes it; without create it is skipped."""
    pkg = make_package({"reg.py": "REG = {'old': 1}\n"})
    reg = _import(f"{pkg}.reg")

    def new_op():
        return "new-op"

    report = patcher.add(
        AtomicPatch(f"{pkg}.reg.REG['new.op']", new_op, create=True),
        AtomicPatch(f"{pkg}.reg.REG['absent']", new_op),
    ).apply()
    assert reg.REG["new.op"]() == "new-op"
    assert report.get(f"{pkg}.reg.REG['new.op']").status is Status.APPLIED
    absent = report.get(f"{pkg}.reg.REG['absent']")
    assert absent.status is Status.SKIPPED and "absent" in (absent.reason or "")
    assert "absent" not in reg.REG
    patcher.revert()
    assert reg.REG == {"old": 1}


def test_create_module_attribute_removed_on_revert(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """create=True on a module attribute that does not exist installs it and revert deletes it."""
    pkg = make_package({"core.py": "X = 1\n"})
    core = _import(f"{pkg}.core")
    patcher.add(AtomicPatch(f"{pkg}.core.helper", lambda: "made", create=True)).apply()
    assert core.helper() == "made"
    patcher.revert()
    assert not hasattr(core, "helper")


def test_object_attribute_patched_and_restored(
    make_package: PackageFactory, patcher: Patcher
) -> None:
    """An attribute of a plain object (own or from its class) is patched on the object and restored."""
    pkg = make_package(
        {
            "mod.py": """
                class Config:
                    mode = 1
                    def __init__(self):
                        self.device = 10
                    def describe(self):
                        return (self.device, self.mode)
                config = Config()
            """
        }
    )
    mod = _import(f"{pkg}.mod")
    patcher.add(
        AtomicPatch(f"{pkg}.mod.config.device", 20),
        AtomicPatch(f"{pkg}.mod.config.mode", 2),
    ).apply()
    assert mod.config.describe() == (20, 2)
    assert mod.Config.mode == 1, "the class is untouched"
    patcher.revert()
    assert mod.config.describe() == (10, 1)
    assert "mode" not in vars(mod.config)
