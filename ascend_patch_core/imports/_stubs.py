"""Stand-ins for modules that ``skip_import`` keeps from loading (flash_attn, apex, spconv ...).

What code does with an optional dependency, and what a stub must therefore allow:

* probe it: ``importlib.util.find_spec`` returns a real spec (transformers-style
  availability checks must not raise); ``importlib.metadata`` still finds no
  distribution, so such checks report it unavailable;
* import from it at any depth: ``from flash_attn.ops.triton import rotary``;
* decorate with it: ``@stub.jit`` and ``@stub.jit(nopython=True)`` return the
  decorated object unchanged;
* subclass it and use it in ``isinstance``: every attribute is a real class;
* test it: stubs are falsy, empty and contain nothing, like an absent optional module.

What a stub must not allow: being *used*. Calling one with real arguments returns a
marker whose every use raises :class:`StubUsageError` naming the skipped module and
the call, so the failure points at the cause rather than at a ``NoneType`` later.
"""

from __future__ import annotations

import inspect
import types
from typing import Any
from typing import NoReturn

from .._model.errors import StubUsageError


__all__ = ["StubModule", "is_stub"]

_REASON = "it is skipped by ascend-patch skip_import"


def _is_decoratable(obj: object) -> bool:
    return (
        inspect.isfunction(obj)
        or inspect.isclass(obj)
        or inspect.ismethod(obj)
        or isinstance(obj, (staticmethod, classmethod, property, types.BuiltinFunctionType))
    )


def _describe_call(path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [type(a).__name__ for a in args] + [f"{k}=" for k in kwargs]
    return f"{path}({', '.join(parts)})"


def _stub_call(path: str, module: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(args) == 1 and not kwargs and _is_decoratable(args[0]):
        return args[0]  # used as a decorator
    return _StubResult(_describe_call(path, args, kwargs), module)


class _StubMeta(type):
    """Metaclass of stub attributes: they are classes, so subclassing works.

    Deliberately ``type``, not ``abc.ABCMeta``: every method of the metaclass hides a
    stub attribute of that name, and ``ABCMeta.register`` would hide the
    ``@stub.register(...)`` decorators registries use. The price: a class cannot
    derive from both a stub and an ``abc.ABC`` (metaclass conflict).
    """

    __stub_path__: str
    __stub_module__: str

    def _pure(cls) -> bool:
        return "__stub_path__" in cls.__dict__

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_") or not cls._pure():
            raise AttributeError(name)
        child = _make_stub_class(f"{cls.__stub_path__}.{name}", cls.__stub_module__)
        type.__setattr__(cls, name, child)
        return child

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls._pure():  # a user's subclass of a stub: a normal class
            return super().__call__(*args, **kwargs)
        return _stub_call(cls.__stub_path__, cls.__stub_module__, args, kwargs)

    def __bool__(cls) -> bool:
        return not cls._pure()

    def __len__(cls) -> int:
        if cls._pure():
            return 0
        raise TypeError(f"object of type {type(cls).__name__!r} has no len()")

    def __iter__(cls) -> Any:
        if cls._pure():
            return iter(())
        raise TypeError(f"{cls.__name__!r} object is not iterable")

    def __contains__(cls, item: object) -> bool:
        return False

    def __getitem__(cls, item: object) -> Any:
        return cls  # generic alias use in annotations: Stub[int]

    def __repr__(cls) -> str:
        if cls._pure():
            return f"<stub {cls.__stub_path__} ({_REASON})>"
        return super().__repr__()


class _StubBase(metaclass=_StubMeta):
    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Class keywords meant for the skipped library's base class are dropped.
        super().__init_subclass__()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A user class deriving from a stub may call super().__init__(...) with
        # arguments meant for a real base further along the MRO: pass them on, unless
        # only object is left (object.__init__ takes none).
        mro = type(self).__mro__
        if mro[mro.index(_StubBase) + 1] is not object:
            super().__init__(*args, **kwargs)


def _make_stub_class(path: str, module: str) -> type:
    name = path.rpartition(".")[2]
    namespace = {
        "__stub_path__": path,
        "__stub_module__": module,
        "__module__": module,
        "__qualname__": name,
    }
    return _StubMeta(name, (_StubBase,), namespace)


class _StubResult:
    """What calling a stub returns: usable only as a decorator, any other use raises."""

    __slots__ = ("_call", "_module")

    def __init__(self, call: str, module: str) -> None:
        object.__setattr__(self, "_call", call)
        object.__setattr__(self, "_module", module)

    def _fail(self, *_: Any, **__: Any) -> NoReturn:
        call = object.__getattribute__(self, "_call")
        module = object.__getattribute__(self, "_module")
        raise StubUsageError(
            f"{call} was called and its result used, but {module} is not really imported: {_REASON}. "
            f"Install {module.partition('.')[0]} or give this code path an NPU replacement."
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and _is_decoratable(args[0]):
            return args[0]  # decorator factory: @stub.deco(option=1)
        self._fail()

    def __getattr__(self, name: str) -> Any:
        self._fail()

    def __repr__(self) -> str:
        return f"<result of {object.__getattribute__(self, '_call')} ({_REASON})>"


for _dunder in (
    "__bool__",
    "__len__",
    "__iter__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__setattr__",
    "__enter__",
    "__exit__",
    "__await__",
    "__index__",
    "__int__",
    "__float__",
    "__complex__",
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__matmul__",
    "__rmatmul__",
    "__truediv__",
    "__rtruediv__",
    "__floordiv__",
    "__rfloordiv__",
    "__mod__",
    "__pow__",
    "__neg__",
    "__pos__",
    "__abs__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__array__",
    "__fspath__",
):
    setattr(_StubResult, _dunder, _StubResult._fail)


class StubModule(types.ModuleType):
    """A module served in place of a skipped one. Its attributes are stub classes."""

    __stub_module__: str

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"module {self.__name__!r} ({_REASON}) has no attribute {name!r}")
        child = _make_stub_class(f"{self.__name__}.{name}", self.__name__)
        setattr(self, name, child)
        return child

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Any:
        return iter(())

    def __contains__(self, item: object) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub module {self.__name__!r} ({_REASON})>"


def new_stub_module(name: str) -> StubModule:
    module = StubModule(name, f"Stub for {name}: {_REASON}.")
    module.__path__ = []  # a package, so any submodule can be imported
    vars(module)["__all__"] = []
    return module


def is_stub(obj: object) -> bool:
    """True for a stub module, a stub attribute, or the result of calling one."""
    return isinstance(obj, (StubModule, _StubResult)) or (
        isinstance(obj, _StubMeta) and obj._pure()
    )
