"""The ``npu`` device on CPU: torch's PrivateUse1 backend, named ``npu``, allocating CPU tensors.

How ``torch.zeros(2, device="npu:1")`` and ``t.to("npu")`` work here: the PrivateUse1
backend is renamed ``npu`` (what torch_npu itself does at import), a Python device
guard and hooks object are registered, and the backend's two allocation kernels
(``aten::empty.memory_format`` and ``aten::empty_strided``) return CPU tensors.
Every factory function and every copy to the device allocates through those two,
so they all produce CPU tensors, in every thread, with no per-op Python overhead
for ordinary CPU work. The price: tensors report ``device(type='cpu')``;
``Tensor.is_npu`` (added here) is True for them while the emulator is active.

Why not a ``TorchFunctionMode`` that rewrites device arguments: modes are
thread-local (DataLoader threads, autograd engine threads would not see it) and
put Python on the path of every torch call. Why not a tensor subclass reporting
``device='npu'``: every op would go through ``__torch_dispatch__``, and custom op
kernels, autograd and serialization all see the subclass.

What cannot be undone in a process (torch offers no API for it) and stays after
:func:`deactivate`: the PrivateUse1 name ``npu`` (so ``torch.device("npu")`` still
parses), the registered guard and hooks (they report no device once inactive), and
an inactive ``torch.npu`` module whose ``is_available()`` is False. The last is
deliberate: once PrivateUse1 has a name, torch's accelerator queries (which
``torch.optim`` and ``DataLoader`` make) look up ``torch.npu`` and would raise
without it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from . import _runtime
from . import _runtime_types
from ._modules import clear
from ._runtime_state import invalid_ordinal


__all__ = ["install", "make_inactive", "npu_module"]

_BACKEND = "npu"
#: Python objects torch keeps raw pointers to: they must live as long as the process.
_registered: list[Any] = []

Undo = Callable[[], None]


def _register_backend_once() -> None:
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", _BACKEND):
        raise RuntimeError(
            f"cannot emulate the NPU: torch's PrivateUse1 backend is already named {name!r} "
            f"in this process (another device extension is loaded)"
        )
    if name != _BACKEND:
        torch.utils.rename_privateuse1_backend(_BACKEND)
    if _registered:
        return

    class Hooks(torch._C._acc.PrivateUse1Hooks):  # type: ignore[misc]
        def is_available(self) -> bool:
            return _runtime.state.active

        def has_primary_context(self, dev_id: int) -> bool:
            return _runtime.state.active

        def is_built(self) -> bool:
            return True

    class Guard(torch._C._acc.DeviceGuard):  # type: ignore[misc]
        def type_(self) -> Any:
            return torch._C._autograd.DeviceType.PrivateUse1

    hooks, guard = Hooks(), Guard()
    torch._C._acc.register_python_privateuseone_hook(hooks)
    torch._C._acc.register_python_privateuseone_device_guard(guard)
    _registered.extend([hooks, guard])


def _check_index(device: Any) -> None:
    index = getattr(device, "index", None)
    if index is not None and not 0 <= index < _runtime.state.device_count:
        raise invalid_ordinal(index)


def _empty(
    size: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> Any:
    _check_index(device)
    return torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format)


def _empty_strided(
    size: Any,
    stride: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> Any:
    _check_index(device)
    return torch.empty_strided(size, stride, dtype=dtype, layout=layout)


def _pin_memory(self: Any, device: Any = None) -> Any:
    # Pinned host memory has no meaning when the "device" is the host: a copy keeps
    # pin_memory()'s contract (a new tensor, same values) for DataLoader(pin_memory=True).
    return self.clone()


def _is_pinned(self: Any, device: Any = None) -> bool:
    return False


def _device_index(device: Any) -> Any:
    if device is None:
        return torch.device(_BACKEND, _runtime.state.current)
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device(_BACKEND, device)
    return torch.device(device)


def _tensor_npu(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    """``Tensor.npu()``: a copy on the emulated device (a CPU tensor)."""
    return self.to(device=_device_index(device), non_blocking=non_blocking, **kwargs)


def _tensor_is_npu(self: Any) -> bool:
    """Emulated NPU tensors are CPU tensors, so every CPU tensor counts."""
    return bool(self.device.type in ("cpu", _BACKEND))


def _module_npu(self: Any, device: Any = None) -> Any:
    """``Module.npu()``: parameters and buffers onto the emulated device."""
    return self._apply(lambda t: _tensor_npu(t, device))


def _storage_npu(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
    """``Storage.npu()``: storages stay in host memory."""
    return self


def _storage_is_npu(self: Any) -> bool:
    return bool(self.device.type in ("cpu", _BACKEND))


def _is_npu_device(device: Any) -> bool:
    if isinstance(device, str):
        return device.partition(":")[0] == _BACKEND
    return getattr(device, "type", None) == _BACKEND


def _patch_storages() -> Undo:
    """Storage allocation on ``npu`` goes to host memory.

    Storages allocate through the device's C++ allocator, not the dispatcher, and
    PrivateUse1 has none: ``UntypedStorage(n, device="npu")`` and ``storage.to("npu")``
    (which ``torch.load(map_location="npu")`` calls) would crash the interpreter.
    """
    storage = torch.UntypedStorage
    original_to = storage.to
    base_new = storage.__new__

    def to(self: Any, *, device: Any, non_blocking: bool = False) -> Any:
        if _is_npu_device(device):
            return self if self.device.type == "cpu" else original_to(self, device="cpu")
        return original_to(self, device=device, non_blocking=non_blocking)

    def __new__(cls: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None and _is_npu_device(device):
            device = "cpu"
        if device is None:
            return base_new(cls, *args, **kwargs)
        return base_new(cls, *args, device=device, **kwargs)

    return _set_attributes(storage, {"to": to, "__new__": __new__})


def _patch_fake_device() -> Undo:
    """Tracing puts an ``npu`` tensor where the emulated one is: on the CPU.

    Fake tensors (dynamo, ``torch.compile``, ``make_fx``) carry their device as a name:
    ``torch.ones(2, device="npu")`` in a compiled function would be traced onto
    ``npu:0``, next to inputs that -- being emulated NPU tensors -- are on the CPU, and
    tracing fails with "Tensor device mismatch" where eager code runs. On an NPU both are
    ``npu``; here both are the CPU, as they are when the code runs eagerly.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    found = FakeTensor.__dict__.get("_normalize_fake_device")
    if not isinstance(found, staticmethod):  # another torch: nothing to hook
        return lambda: None
    normalize = found.__func__
    cpu = torch.device("cpu")

    def _normalize_fake_device(device: Any) -> Any:
        return normalize(cpu if device.type == _BACKEND else device)

    return _set_attributes(
        FakeTensor, {"_normalize_fake_device": staticmethod(_normalize_fake_device)}
    )


def _set_attributes(owner: Any, values: dict[str, Any]) -> Undo:
    """Set attributes on a class; the undo restores or deletes each one exactly."""
    missing = object()
    previous = {name: owner.__dict__.get(name, missing) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)

    def undo() -> None:
        for name, value in previous.items():
            if value is missing:
                if name in owner.__dict__:
                    delattr(owner, name)
            else:
                setattr(owner, name, value)

    return undo


def _patch_autocast() -> Undo:
    """``torch.autocast("npu")`` becomes CPU autocast, where emulated tensors are."""
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__dict__["__init__"]

    def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        if device_type == _BACKEND:
            device_type = "cpu"
        original(self, device_type, *args, **kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    autocast.__init__ = __init__

    def undo() -> None:
        autocast.__init__ = original

    return undo


def _npu_to_cpu(device_type: Any) -> Any:
    return "cpu" if device_type == _BACKEND else device_type


def _autocast_query(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with a ``"npu"`` device type (first argument or ``device_type=``) read as ``"cpu"``."""

    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_npu_to_cpu(args[0]), *args[1:])
        if "device_type" in kwargs:
            kwargs = {**kwargs, "device_type": _npu_to_cpu(kwargs["device_type"])}
        return original(*args, **kwargs)

    on_cpu.__name__ = on_cpu.__qualname__ = original.__name__
    on_cpu.__doc__ = original.__doc__
    on_cpu.__wrapped__ = original  # type: ignore[attr-defined]
    return on_cpu


def _patch_autocast_queries() -> Undo:
    """``torch.is_autocast_enabled("npu")`` & co. read the CPU autocast state.

    ``torch.autocast("npu")`` runs as CPU autocast here (see :func:`_patch_autocast`),
    so the NPU's own autocast state in torch never changes; the queries and setters
    that name the NPU must see the state that does.
    """
    names = (
        "is_autocast_enabled",
        "set_autocast_enabled",
        "get_autocast_dtype",
        "set_autocast_dtype",
    )
    undos = [_set_attributes(torch, {n: _autocast_query(getattr(torch, n)) for n in names})]
    # custom_fwd(device_type="npu", cast_inputs=...) casts only tensors whose device type
    # is "npu"; emulated NPU tensors report "cpu".
    for module in (torch.amp.autocast_mode, torch.amp):
        decorators = ("custom_fwd", "custom_bwd")
        undos.append(
            _set_attributes(module, {n: _autocast_query(getattr(module, n)) for n in decorators})
        )

    def undo() -> None:
        for step in reversed(undos):
            step()

    return undo


def _generator_class() -> type:
    """``torch.Generator`` whose ``"npu"`` generators are CPU generators.

    torch builds a PrivateUse1 generator through a C++ hook that Python cannot
    register; emulated NPU tensors are CPU tensors and draw from CPU generators
    anyway. The class builds *base* ``torch._C.Generator`` objects (the only type
    torch's C++ accepts for ``generator=``); ``isinstance`` is true for every
    generator; subclasses of it construct normally.
    """
    base = torch._C.Generator
    base_meta = type(base)

    def cpu_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if args and _is_npu_device(args[0]):
            args = ("cpu", *args[1:])
        if _is_npu_device(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        return args, kwargs

    class EmulatedGeneratorMeta(base_meta):  # type: ignore[misc, valid-type]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = cpu_args(args, kwargs)
            if cls is Generator:
                return base(*args, **kwargs)
            return super().__call__(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            if cls is Generator:
                return isinstance(obj, base)
            return bool(super().__instancecheck__(obj))

        def __subclasscheck__(cls, sub: Any) -> bool:
            if cls is Generator:
                return issubclass(sub, base)
            return bool(super().__subclasscheck__(sub))

    class Generator(base, metaclass=EmulatedGeneratorMeta):  # type: ignore[misc, valid-type]
        """``torch.Generator``; under the NPU emulator an ``"npu"`` generator is a CPU one."""

    Generator.__module__ = "torch"
    return Generator


def _patch_generator() -> Undo:
    return _set_attributes(torch, {"Generator": _generator_class()})


_npu: types.ModuleType | None = None


def npu_module() -> types.ModuleType:
    """The one ``torch.npu`` (= ``torch_npu.npu``) module object of this process.

    One object for the whole process, filled on activation and emptied to an
    inactive device module on deactivation: ``torch.get_device_module`` caches the
    object it finds, so a new object per activation would leave torch holding a
    stale one.
    """
    global _npu
    if _npu is None:
        _npu = types.ModuleType("torch_npu.npu")
        _npu.__path__ = []
        make_inactive(_npu)
    return _npu


def make_inactive(module: types.ModuleType) -> None:
    """Empty ``module`` to a device module with no device (``is_available()`` is False)."""
    clear(module)
    module.__doc__ = "torch.npu after ascend-patch's NPU emulator was deactivated: no device."

    def no_device(*args: Any, **kwargs: Any) -> bool:
        return False

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def missing(name: str) -> Any:
        raise AttributeError(
            f"torch.npu.{name}: the NPU emulator is not active "
            f"(ascend_patch_emulator.activate() turns it on)"
        )

    def no_seed(seed: int) -> None:
        """Nothing to seed without a device (torch.cuda's seeding without CUDA does the same)."""

    for name in ("is_available", "is_initialized", "_is_in_bad_fork"):
        setattr(module, name, no_device)
    for name in ("device_count", "current_device"):
        setattr(module, name, zero)
    # torch.manual_seed seeds the PrivateUse1 device module through these two, and warns
    # on every call when either is missing.
    for name in ("manual_seed", "manual_seed_all"):
        setattr(module, name, no_seed)
    module.__getattr__ = missing  # type: ignore[method-assign]


def _clear_device_module_cache() -> None:
    cache_clear = getattr(torch.get_device_module, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()


def install(npu: types.ModuleType) -> Undo:
    """Make the ``npu`` device work and ``torch.npu`` be ``npu`` (filled); returns the undo."""
    _register_backend_once()
    undos: list[Undo] = []

    library = torch.library.Library("aten", "IMPL")
    library.impl("empty.memory_format", _empty, "PrivateUse1")
    library.impl("empty_strided", _empty_strided, "PrivateUse1")
    library.impl("_pin_memory", _pin_memory, "CPU")
    library.impl("is_pinned", _is_pinned, "CPU")

    def unregister() -> None:
        # Safe for an IMPL library: it defines no op, so no op object goes stale.
        library._destroy()

    undos.append(unregister)

    missing = object()
    previous_module = sys.modules.get(f"torch.{_BACKEND}", missing)
    setattr(torch, _BACKEND, npu)
    sys.modules[f"torch.{_BACKEND}"] = npu
    _clear_device_module_cache()

    def restore_module() -> None:
        # torch.npu stays, emptied: torch's accelerator queries need it once PrivateUse1 has a name.
        make_inactive(npu)
        if previous_module is not missing:
            sys.modules[f"torch.{_BACKEND}"] = previous_module  # type: ignore[assignment]
        else:
            sys.modules.pop(f"torch.{_BACKEND}", None)
        _clear_device_module_cache()

    undos.append(restore_module)

    undos.append(
        _set_attributes(
            torch.Tensor, {_BACKEND: _tensor_npu, f"is_{_BACKEND}": property(_tensor_is_npu)}
        )
    )
    undos.append(_set_attributes(torch.nn.Module, {_BACKEND: _module_npu}))
    for storage in (torch.UntypedStorage, torch.TypedStorage):
        undos.append(
            _set_attributes(
                storage, {_BACKEND: _storage_npu, f"is_{_BACKEND}": property(_storage_is_npu)}
            )
        )
    undos.append(_patch_storages())
    undos.append(_patch_fake_device())
    undos.append(_patch_autocast())
    undos.append(_patch_autocast_queries())
    undos.append(_patch_generator())
    undos.append(_runtime_types.patch_tensor_type())
    undos.append(_runtime_types.register_storage_classes())
    undos.append(_runtime_types.patch_storage_deepcopy())
    # torch_npu.npu.default_generators: one per device; every emulated device draws from the CPU's.
    npu.default_generators = (torch.random.default_generator,) * _runtime.state.device_count  # type: ignore[attr-defined]

    def undo_all() -> None:
        for undo in reversed(undos):
            undo()

    return undo_all
