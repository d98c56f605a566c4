"""The emulated ``mx_driving`` (DrivingSDK's op library), served while the emulator is on.

On an Ascend machine the mmcv plugin prefers ``mx_driving``'s kernels; under the
emulator they must exist too. :func:`serve` builds a module ``mx_driving`` with every
public name of the recorded mx-driving version (``data/mx_driving-<version>.json``,
read from the wheel by ``tools/mx_driving_signatures.py``), each with the wheel's
Python signature (``inspect.signature`` shows it), and serves it to ``import
mx_driving`` through the same kind of meta-path finder as the emulated torch_npu.
It does so only when no real mx_driving can be imported.

Names with a reference kernel (``_mx_kernels``) compute it on the CPU. The others
are stand-ins of the right kind: a function raises :class:`KernelNotImplementedError`
(a ``NotImplementedError``) once its arguments bind, an autograd Function class
raises in ``forward``, a class at instantiation; the message names the op, says
"emulated mx_driving" and lists the names that do have kernels. Every call of a
public function is reported to the contract recorder (``library="mx_driving"``).
Undoing the serve removes the finder and the module from ``sys.modules``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from ._errors import KernelNotImplementedError
from ._modules import EmulatedPackage
from ._modules import install_finder
from ._modules import remove_finder
from ._mx_data import DEFAULT_MX_VERSION
from ._mx_data import MxName
from ._mx_data import load_mx_api
from ._mx_kernels import MxFunction
from ._mx_kernels import called
from ._mx_kernels import implementations


__all__ = ["ROOT", "STAND_IN", "build", "serve", "served_version"]

ROOT = "mx_driving"
#: Set (True) on every stand-in -- a name without a kernel -- so that code choosing a
#: kernel can tell, without calling it, that the emulated mx_driving cannot compute it.
STAND_IN = "__ascend_patch_stand_in__"
_log = logging.getLogger("ascend_patch.emulator")
_served: str | None = None


def served_version() -> str | None:
    """The mx-driving version the emulator serves now, or None."""
    return _served


def _missing_message(name: str, version: str, implemented: list[str]) -> str:
    return (
        f"mx_driving.{name} has no reference kernel in ascend-patch's emulated mx_driving "
        f"{version} (CPU): the name and its signature are the real ones, but the emulator "
        f"cannot compute it. Emulated mx_driving kernels: {', '.join(implemented)}. Add one "
        f"in kits/emulator/ascend_patch_emulator/_mx_kernels/, or keep the op off the "
        f"emulated code path."
    )


def _stub_function(entry: MxName, message: str) -> Callable[..., Any]:
    signature = entry.call_signature

    def stub(*args: Any, **kwargs: Any) -> Any:
        if signature is not None:
            signature.bind(*args, **kwargs)  # a wrong call fails as it would on the NPU
        called(entry.name, args, kwargs)
        raise KernelNotImplementedError(message)

    stub.__name__ = stub.__qualname__ = entry.name
    stub.__module__ = entry.module
    stub.__doc__ = f"mx_driving.{entry.name}: emulated stand-in without a kernel."
    setattr(stub, STAND_IN, True)
    if signature is not None:
        stub.__signature__ = signature  # type: ignore[attr-defined]
    return stub


def _with_ctx(signature: inspect.Signature) -> inspect.Signature:
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return signature.replace(parameters=[ctx, *signature.parameters.values()])


def _stub_function_class(entry: MxName, message: str) -> type:
    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        raise KernelNotImplementedError(message)

    if entry.signature is not None:
        forward.__signature__ = _with_ctx(entry.signature)  # type: ignore[attr-defined]
    namespace = {"forward": staticmethod(forward), "__module__": entry.module, STAND_IN: True}
    return type(entry.name, (MxFunction,), namespace)


def _stub_class(entry: MxName, message: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise KernelNotImplementedError(message)

    base: type = torch.nn.Module if entry.kind == "module" else object
    namespace: dict[str, Any] = {"__init__": __init__, "__module__": entry.module, STAND_IN: True}
    if entry.init is not None:
        namespace["__signature__"] = entry.init
    return type(entry.name, (base,), namespace)


def _check_kernel(entry: MxName, found: Any) -> None:
    """A kernel must take exactly the recorded parameters (names, kinds, defaults)."""
    if entry.kind == "autograd_function" or (isinstance(found, type) and entry.kind == "apply"):
        actual = inspect.signature(found.forward)
        actual = actual.replace(parameters=list(actual.parameters.values())[1:])
        expected = entry.signature
    elif entry.kind == "module":
        actual, expected = inspect.signature(found), entry.init
    else:
        target = getattr(found, "__wrapped_function__", None)
        if target is not None:
            actual = inspect.signature(target.forward)
            actual = actual.replace(parameters=list(actual.parameters.values())[1:])
        else:
            actual = inspect.signature(getattr(found, "__wrapped__", found))
        expected = entry.signature
    if expected is None:
        return
    names = [(p.name, p.kind, repr(p.default)) for p in expected.parameters.values()]
    have = [(p.name, p.kind, repr(p.default)) for p in actual.parameters.values()]
    if names != have:
        raise RuntimeError(
            f"the emulated mx_driving.{entry.name} takes {actual}, but mx_driving's is "
            f"{expected}: fix the kernel in _mx_kernels"
        )


def build(version: str = DEFAULT_MX_VERSION) -> types.ModuleType:
    """The emulated ``mx_driving`` module of ``version`` (not yet importable)."""
    api = load_mx_api(version)
    kernels = implementations()
    unknown = sorted(set(kernels) - set(api))
    if unknown:
        raise RuntimeError(f"emulated mx_driving kernels for names it lacks: {unknown}")
    implemented = sorted(kernels)
    module = types.ModuleType(
        ROOT, f"mx_driving {version}, emulated on CPU by ascend-patch: real signatures."
    )
    module.__path__ = []  # a package, as the real one (its submodules are not emulated)
    module.__emulated__ = True  # type: ignore[attr-defined]
    module.__emulated_version__ = version  # type: ignore[attr-defined]
    for name, entry in api.items():
        message = _missing_message(name, version, implemented)
        if name in kernels:
            _check_kernel(entry, kernels[name])
            value = kernels[name]
            # inspect.signature shows the wheel's signature, not the kernel's annotations.
            if entry.kind in ("function", "apply") and entry.signature is not None:
                value.__signature__ = entry.signature
            elif entry.kind == "autograd_function" and entry.signature is not None:
                value.forward.__signature__ = _with_ctx(entry.signature)
            elif entry.kind == "module" and entry.init is not None:
                value.__signature__ = entry.init
        elif entry.kind == "autograd_function":
            value = _stub_function_class(entry, message)
        elif entry.kind in ("module", "class"):
            value = _stub_class(entry, message)
        else:
            value = _stub_function(entry, message)
        setattr(module, name, value)
    module.__all__ = sorted(api)  # type: ignore[attr-defined]

    def missing(name: str) -> Any:
        raise AttributeError(
            f"module 'mx_driving' has no attribute {name!r} (emulated mx_driving {version}: "
            f"only the public names of its __all__ exist; submodules such as mx_driving._C "
            f"are not emulated)"
        )

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def _real_importable() -> bool:
    present = sys.modules.get(ROOT)
    if present is not None:
        return not getattr(present, "__emulated__", False)
    try:
        return importlib.util.find_spec(ROOT) is not None
    except (ImportError, ValueError):
        return False


def serve(version: str = DEFAULT_MX_VERSION) -> Callable[[], None] | None:
    """Serve the emulated mx_driving to ``import``; the undo step, or None when a real
    mx_driving is importable (then it is left alone)."""
    global _served
    if _real_importable():
        _log.info("a real mx_driving is importable: the emulator does not serve its own")
        return None
    package = EmulatedPackage({ROOT: build(version)}, {})
    install_finder(package)
    _served = version

    def undo() -> None:
        global _served
        remove_finder(package)
        package.forget()
        _served = None

    try:
        # Imported now, through the import system: the core's import hub sees it
        # (patches waiting for mx_driving run), and sys.modules holds it while active.
        importlib.import_module(ROOT)
    except BaseException:
        undo()
        raise
    return undo
