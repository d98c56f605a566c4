"""Stub modules served by skip_import: what optional-dependency code may do with them, and what it may not."""

from __future__ import annotations

import importlib
import itertools
import types
import uuid
from collections.abc import Iterator
from typing import Any
from typing import Optional

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ascend_patch_core import Patcher
from ascend_patch_core import PatchError
from ascend_patch_core import StubUsageError
from ascend_patch_core import is_stub


_ids = itertools.count()


@pytest.fixture
def stub_name(patcher: Patcher) -> str:
    """The name of a module that exists nowhere and is skipped by ``patcher``."""
    name = f"apstub{next(_ids)}_{uuid.uuid4().hex[:8]}"
    patcher.skip_import(name)
    return name


@pytest.fixture
def stub(stub_name: str) -> types.ModuleType:
    """The stub module served for ``stub_name``."""
    return importlib.import_module(stub_name)


# ================================================================================ decorators


def test_bare_decorator_returns_the_function_unchanged(stub: Any) -> None:
    """@stub.deco returns the decorated function itself, which still runs."""

    @stub.jit
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    assert add.__name__ == "add"
    assert not is_stub(add)


def test_decorator_with_options_returns_the_function_unchanged(stub: Any) -> None:
    """@stub.deco(opt=1) and @stub.deco() return the decorated function itself."""

    def original(x: int) -> int:
        return x * 2

    decorated = stub.jit(nopython=True, cache=False)(original)
    assert decorated is original
    assert stub.jit()(original) is original
    assert stub.ops.triton.autotune(configs=[1, 2], key=["n"])(original) is original

    @stub.jit(nopython=True)
    def double(x: int) -> int:
        return x * 2

    assert double(4) == 8


def test_decorators_on_classes_and_methods(stub: Any) -> None:
    """Class decorators and decorators on static/class methods and properties return their argument."""

    @stub.register_module
    class Plain:
        @stub.amp.custom_fwd
        def forward(self, x: int) -> int:
            return x + 1

        @stub.amp.custom_bwd(cast_inputs="float16")
        @staticmethod
        def helper() -> str:
            return "static"

    @stub.registry.register(name="Other")
    class Other:
        pass

    assert Plain().forward(1) == 2
    assert Plain.helper() == "static"
    assert Other.__name__ == "Other" and not is_stub(Other)
    assert not is_stub(Plain)


# ============================================================================== subclassing


def test_subclass_of_a_stub_is_a_normal_class(stub: Any) -> None:
    """class C(stub.Base) instantiates with arguments and super().__init__(...) is accepted."""

    class Layer(stub.nn.Module):
        def __init__(self, width: int, *, scale: float = 1.0) -> None:
            super().__init__(width, scale=scale)
            self.width = width
            self.scale = scale

        def forward(self, x: float) -> float:
            return x * self.width * self.scale

    layer = Layer(3, scale=2.0)
    assert layer.forward(1.0) == 6.0
    assert not is_stub(Layer) and not is_stub(layer)
    assert Layer.__name__ == "Layer"
    assert bool(layer) is True

    class NoInit(stub.Base):
        pass

    assert isinstance(NoInit(1, 2, key="v"), NoInit)


def test_isinstance_and_issubclass_with_stubs(stub: Any) -> None:
    """Instances of user subclasses are instances of the stub; unrelated objects are not."""

    class Child(stub.Base):
        pass

    class GrandChild(Child):
        def __init__(self) -> None:
            super().__init__()

    assert isinstance(Child(), stub.Base)
    assert isinstance(GrandChild(), stub.Base)
    assert not isinstance(1, stub.Base)
    assert not isinstance(object(), stub.Base)
    assert not isinstance(Child(), stub.Other)
    assert issubclass(Child, stub.Base)
    assert issubclass(GrandChild, stub.Base)
    assert not issubclass(int, stub.Base)
    assert not issubclass(Child, stub.Other)
    # the typical guard in library code
    assert isinstance(5, (int, stub.Tensor))
    assert not isinstance("x", (int, stub.Tensor))


def test_multiple_stub_bases(stub: Any) -> None:
    """A class may derive from two stubs (mixins) and from a stub plus a real class."""

    class Mixed(stub.ModelMixin, stub.ConfigMixin, dict):
        pass

    obj = Mixed()
    obj["k"] = 1
    assert obj == {"k": 1}
    assert isinstance(obj, stub.ModelMixin) and isinstance(obj, stub.ConfigMixin)


def test_stub_mixin_before_a_real_base_lets_the_real_init_run(stub: Any) -> None:
    """class C(stub.Mixin, RealBase): super().__init__() still reaches RealBase.__init__ (cooperative MRO)."""

    class RealBase:  # stands for torch.nn.Module, whose __init__ must run before attributes are set
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.base_args = (args, kwargs)

    class Model(stub.ModelMixin, RealBase):
        def __init__(self) -> None:
            super().__init__()
            self.ready = True

    model = Model()
    assert model.ready is True
    assert getattr(model, "base_args", None) == ((), {})
    assert isinstance(model, RealBase) and isinstance(model, stub.ModelMixin)


def test_user_subclass_misuse_raises_type_or_attribute_error(stub: Any) -> None:
    """A user subclass behaves like a normal class: unknown attributes and bad signatures fail normally."""

    class Strict(stub.Base):
        def __init__(self, a: int) -> None:
            super().__init__(a)

    with pytest.raises(TypeError):
        Strict()
    with pytest.raises(AttributeError):
        _ = Strict.missing
    with pytest.raises(AttributeError):
        _ = Strict(1).missing
    with pytest.raises(TypeError):
        len(Strict)
    with pytest.raises(TypeError):
        iter(Strict)
    assert bool(Strict) is True


# ==================================================================== attributes and falsiness


def test_stub_attributes_are_stable(stub: Any, stub_name: str) -> None:
    """The same attribute path always gives the very same stub object."""
    assert stub.X is stub.X
    assert stub.a.b.c is stub.a.b.c
    assert stub.X is not stub.Y
    again = importlib.import_module(stub_name)
    assert again is stub and again.X is stub.X
    namespace: dict[str, Any] = {}
    exec(f"from {stub_name} import X", namespace)
    assert namespace["X"] is stub.X


def test_stubs_are_falsy_and_empty(stub: Any) -> None:
    """Stub modules and attributes are falsy, have len 0, iterate empty and contain nothing."""
    for obj in (stub, stub.X, stub.X.Y):
        assert not obj
        assert bool(obj) is False
        assert len(obj) == 0
        assert list(obj) == []
        assert 1 not in obj
        assert "X" not in obj
        assert obj not in obj
    assert stub.__all__ == []


def test_absent_module_idioms_work_with_stubs(stub: Any, stub_name: str) -> None:
    """'if module:' and 'from m import *' behave as for an absent optional dependency."""
    used = "cuda" if stub else "npu"
    assert used == "npu"
    namespace: dict[str, Any] = {}
    exec(f"from {stub_name} import *", namespace)
    assert [k for k in namespace if not k.startswith("__")] == []


def test_underscore_attributes_raise_attribute_error(stub: Any) -> None:
    """Private and dunder names are not invented: getattr with a default returns the default."""
    assert getattr(stub, "__version__", "n/a") == "n/a"
    assert getattr(stub.X, "__version__", "n/a") == "n/a"
    assert not hasattr(stub, "_C")
    assert not hasattr(stub.X, "_private")
    with pytest.raises(AttributeError, match="__version__"):
        _ = stub.__version__
    with pytest.raises(AttributeError):
        _ = stub.X._impl


def test_stubs_in_type_annotations(stub: Any) -> None:
    """Stubs work where annotations use them: subscripting, Optional and X | None."""
    assert stub.Tensor[int] is stub.Tensor
    assert Optional[stub.Tensor] == Optional[stub.Tensor]  # noqa: UP045

    union = stub.Tensor | None
    assert isinstance(union, types.UnionType)
    assert union.__args__ == (stub.Tensor, type(None))
    assert Optional[stub.Tensor].__args__ == (stub.Tensor, type(None))  # noqa: UP045


# ================================================================================== use fails


def test_calling_with_arguments_returns_a_marker(stub: Any, stub_name: str) -> None:
    """Calling a stub with real arguments returns a stub marker, not None or a value."""
    result = stub.ops.flash_attn_func(1, "q", causal=True)
    assert is_stub(result)
    assert result is not None
    assert f"{stub_name}.ops.flash_attn_func(int, str, causal=)" in repr(result)


@pytest.mark.parametrize(
    "use",
    [
        pytest.param(lambda r: r + 1, id="add"),
        pytest.param(lambda r: 1 + r, id="radd"),
        pytest.param(lambda r: r * 2, id="mul"),
        pytest.param(lambda r: r @ r, id="matmul"),
        pytest.param(lambda r: -r, id="neg"),
        pytest.param(lambda r: r < 1, id="lt"),
        pytest.param(lambda r: r.shape, id="getattr"),
        pytest.param(lambda r: r.cuda(), id="method"),
        pytest.param(lambda r: bool(r), id="bool"),
        pytest.param(lambda r: len(r), id="len"),
        pytest.param(lambda r: list(r), id="iter"),
        pytest.param(lambda r: 1 in r, id="contains"),
        pytest.param(lambda r: r[0], id="getitem"),
        pytest.param(lambda r: r.__setitem__(0, 1), id="setitem"),
        pytest.param(lambda r: setattr(r, "x", 1), id="setattr"),
        pytest.param(lambda r: r(1), id="call"),
        pytest.param(lambda r: r(x=1), id="call-kw"),
        pytest.param(lambda r: int(r), id="int"),
        pytest.param(lambda r: float(r), id="float"),
        pytest.param(lambda r: [0, 1][r], id="index"),
        pytest.param(lambda r: r.__enter__(), id="enter"),
    ],
)
def test_using_a_call_result_raises_stub_usage_error(stub: Any, stub_name: str, use: Any) -> None:
    """Every use of a stub call's result raises StubUsageError naming the skipped module and the call."""
    result = stub.ops.rotary(3, 4.0, interleaved=False)
    with pytest.raises(StubUsageError) as info:
        use(result)
    message = str(info.value)
    assert stub_name in message
    assert f"{stub_name}.ops.rotary(int, float, interleaved=)" in message
    assert "ascend-patch" in message
    assert isinstance(info.value, PatchError) and isinstance(info.value, RuntimeError)


def test_with_statement_on_a_call_result_fails(stub: Any) -> None:
    """'with stub.autocast(...)' fails loudly instead of silently doing nothing."""
    with pytest.raises(StubUsageError, match="autocast"), stub.autocast("cuda"):
        pass


def test_submodule_stub_names_its_module(stub_name: str) -> None:
    """A call result from a deep stub names the deep module and the top-level package to install."""
    deep = importlib.import_module(f"{stub_name}.ops.triton")
    result = deep.rotary([1, 2])
    with pytest.raises(StubUsageError) as info:
        result + 1
    message = str(info.value)
    assert f"{stub_name}.ops.triton" in message
    assert f"{stub_name}.ops.triton.rotary(list)" in message
    assert f"Install {stub_name} " in message


def test_is_stub() -> None:
    """is_stub is True for stub modules, their attributes and call results, False otherwise."""
    p = Patcher()
    name = f"apstub{next(_ids)}_{uuid.uuid4().hex[:8]}"
    try:
        p.skip_import(name)
        stub: Any = importlib.import_module(name)

        class User(stub.Base):
            pass

        assert is_stub(stub)
        assert is_stub(stub.X)
        assert is_stub(stub.X.Y)
        assert is_stub(stub.X(1))
        assert is_stub(importlib.import_module(f"{name}.sub"))
        assert not is_stub(User)
        assert not is_stub(User())
        assert not is_stub(types)
        assert not is_stub(None)
        assert not is_stub(object)
    finally:
        p.revert()


def test_reprs_mention_ascend_patch(stub: Any, stub_name: str) -> None:
    """repr of a stub module, attribute and call result says it is ascend-patch's stub."""
    texts = [repr(stub), repr(stub.X), repr(stub.X.Y), repr(stub.X(1)), str(stub.X(1))]
    for text in texts:
        assert "ascend-patch" in text
        assert stub_name in text
    assert f"{stub_name}.X.Y" in repr(stub.X.Y)


# ================================================================================= property


_NAMES = st.from_regex(r"\A_{0,2}[A-Za-z][A-Za-z0-9_]{0,10}\Z").filter(
    # ``mro`` is the one public attribute every class has (type.mro); it is a real
    # method, not a stub, so chains through it leave the stub domain.
    lambda n: not hasattr(type, n)
)
_SIMPLE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=3),
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("getattr"), _NAMES),
        st.tuples(
            st.just("call"),
            st.lists(_SIMPLE, max_size=3),
            st.dictionaries(st.from_regex(r"\A[a-z]{1,5}\Z"), _SIMPLE, max_size=2),
        ),
        st.tuples(st.just("bool")),
        st.tuples(st.just("len")),
        st.tuples(st.just("iter")),
        st.tuples(st.just("contains"), _SIMPLE),
        st.tuples(st.just("subclass"), st.integers(-1, 2)),
    ),
    min_size=1,
    max_size=12,
)


def _subclass(base: Any, arity: int) -> type:
    """A user class deriving from ``base``; arity >= 0 gives it an __init__ taking exactly that many arguments."""
    if arity < 0:
        return types.new_class("User", (base,))

    def __init__(self: Any, *args: Any) -> None:
        if len(args) != arity:
            raise TypeError(
                f"__init__() takes {arity} positional arguments but {len(args)} were given"
            )
        super(cls, self).__init__(*args)

    cls = types.new_class("User", (base,), exec_body=lambda ns: ns.update(__init__=__init__))
    return cls


def _run(start: Any, ops: list[tuple[Any, ...]]) -> Iterator[str]:
    """Apply ops to a stub; yields a line per op. Raises AssertionError on a forbidden outcome."""
    cur = start
    user = False  # True once the chain reached a user subclass or its instance
    for op in ops:
        kind = op[0]
        if isinstance(cur, types.ModuleType) and kind in ("call", "subclass"):
            continue  # a module is neither callable nor a base class, stub or not
        try:
            if kind == "getattr":
                result = getattr(cur, op[1])
            elif kind == "call":
                result = cur(*op[1], **op[2])
            elif kind == "bool":
                result = bool(cur)
            elif kind == "len":
                result = len(cur)
            elif kind == "iter":
                result = list(iter(cur))
            elif kind == "contains":
                result = op[1] in cur
            else:
                result = _subclass(cur, op[1])
        except StubUsageError as exc:
            assert not user, f"{op}: a user object raised StubUsageError"
            assert "ascend-patch" in str(exc)
            yield f"{op[0]}: StubUsageError"
            continue
        except AttributeError:
            assert kind == "getattr" and (user or op[1].startswith("_")), (
                f"{op}: AttributeError on {cur!r}"
            )
            yield f"{op[0]}: AttributeError"
            continue
        except TypeError:
            assert user, f"{op}: TypeError from the stub {cur!r}"
            yield f"{op[0]}: TypeError"
            continue
        yield f"{op[0]}: ok"
        if user:
            if kind == "subclass" or (kind == "call" and isinstance(cur, type)):
                cur = result
            elif kind == "getattr":
                return  # a real attribute of a normal class: outside the stub's contract
            continue
        if kind == "getattr":
            if op[1].startswith("_"):
                if not is_stub(result):
                    return  # a real dunder of the class (__name__, __doc__ ...)
            else:
                assert is_stub(result), f"{cur!r}.{op[1]} is not a stub: {result!r}"
                assert getattr(cur, op[1]) is result, "stub attributes are stable"
            cur = result
        elif kind == "call":
            assert is_stub(result), f"calling {cur!r} gave {result!r}"
            cur = result
        elif kind == "bool":
            assert result is False
        elif kind == "len":
            assert result == 0
        elif kind == "iter":
            assert result == []
        elif kind == "contains":
            assert result is False
        else:
            assert isinstance(result, type) and issubclass(result, cur)
            cur = result
            user = True


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, from_module=st.booleans())
def test_random_use_of_a_stub_raises_only_documented_errors(
    stub: Any, ops: list[tuple[Any, ...]], from_module: bool
) -> None:
    """Random op chains on a stub raise only StubUsageError, AttributeError (_names), TypeError (user classes)."""
    start = stub if from_module else stub.Entry
    trace = list(_run(start, ops))
    assert len(trace) <= len(ops)
