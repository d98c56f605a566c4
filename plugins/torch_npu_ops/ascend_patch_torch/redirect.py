"""CUDA device arguments redirected to the NPU, as declared, counted, reversible patches.

Each group below lists the torch callables that take a device, and where the device
sits in their arguments (:class:`~ascend_patch_torch._calls.Param`). A call naming a
CUDA device (``ascend_patch_torch.devices`` decides what does) runs the original with
the NPU equivalent and counts as a *replacement* call in the report; any other call
runs the original untouched and counts as a *fallback*.

What is deliberately different from torch_npu's ``transfer_to_npu``:

* only real device specifications are rewritten -- never a file path or a backend
  string that merely contains ``"cuda"``;
* ``torch.jit.script`` is left alone;
* no dtype changes (``torch.cuda.DoubleTensor`` stays double);
* ``torch.device("cuda")`` still builds a CUDA device object: every consumer listed
  here maps it, but a comparison such as ``tensor.device == torch.device("cuda:0")``
  in user code stays False on the NPU (replacing ``torch.device`` itself would break
  pickling and TorchScript's type checks).

Importing this module does not import torch.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from ascend_patch_core import AtomicPatch

from ._calls import Param
from ._calls import always
from ._calls import cuda_check
from ._calls import cuda_rewriter
from ._calls import device
from .devices import NPU
from .devices import is_cuda_spec
from .devices import to_npu_spec
from .runtime import npu_module
from .runtime import npu_runtime_importable


__all__ = [
    "autocast_patches",
    "device_context_patches",
    "factory_devices_patches",
    "generator_and_event_patches",
    "module_devices_patches",
    "redirect_patch",
    "script_builtins_patches",
    "serialization_patches",
    "storages_patches",
    "tensor_devices_patches",
]


def redirect_patch(
    target: str,
    params: Sequence[Param],
    *,
    aliases: Sequence[str] = (),
    name: str | None = None,
) -> AtomicPatch:
    """A patch running ``target`` with the CUDA devices named by ``params`` moved to the NPU."""
    params = tuple(params)
    return AtomicPatch(
        target,
        target_wrapper=cuda_rewriter(params),
        runtime_check=cuda_check(params),
        precheck=npu_runtime_importable,
        aliases=tuple(aliases),
        name=name,
    )


# --------------------------------------------------------------------------- factories

# Factories whose device is keyword-only. torch reads an int there as a device index.
# (transfer_to_npu also wraps frombuffer, which takes no device.)
_KEYWORD_FACTORIES = (
    "arange",
    "as_tensor",
    "asarray",
    "bartlett_window",
    "blackman_window",
    "empty",
    "empty_like",
    "empty_permuted",
    "empty_quantized",
    "empty_strided",
    "eye",
    "from_file",
    "full",
    "full_like",
    "hamming_window",
    "hann_window",
    "kaiser_window",
    "linspace",
    "logspace",
    "normal",
    "ones",
    "ones_like",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "randperm",
    "range",
    "scalar_tensor",
    "sparse_bsc_tensor",
    "sparse_bsr_tensor",
    "sparse_compressed_tensor",
    "sparse_coo_tensor",
    "sparse_csc_tensor",
    "sparse_csr_tensor",
    "tensor",
    "tril_indices",
    "triu_indices",
    "zeros",
    "zeros_like",
    "_cudnn_init_dropout_state",
    "_empty_affine_quantized",
    "_empty_per_channel_affine_quantized",
)
_DEVICE_KW = (device(ints=True),)


def _unpatched(function: Any) -> Any:
    """The original behind ``function``'s runtime_check wrappers (any patcher's), or itself."""
    while True:
        # Only an attribute of the function itself: a class-level __getattr__ could answer anything.
        inner = (getattr(function, "__dict__", None) or {}).get("__ascend_patch_original__")
        if inner is None:
            return function
        function = inner


def _constructors_of_originals(original: Callable[[], Any]) -> Callable[[], Any]:
    """``torch.utils._device._device_constructors`` answering with the unpatched factories.

    ``with torch.device(X)`` and ``torch.set_default_device(X)`` push a
    ``DeviceContext`` mode whose ``__torch_function__`` adds ``device=X`` only when
    ``func in _device_constructors()``. ``func`` is always torch's own builtin (the
    C++ dispatch hands the mode the function of ``torch._C._VariableFunctions``),
    but torch builds that set, once (``lru_cache``), from the *current*
    ``torch.empty``, ``torch.zeros``, ...: built while this group's wrappers sit
    there, it holds the wrappers, and no factory gets the context's device any more
    -- in the whole process, and after revert(), since the cache outlives the patch.
    This replacement builds the same set from torch's undecorated function and
    unwraps every member, so the set is torch's own whenever it is built, and
    torch's cache is not filled through ``torch.utils._device`` while the factories
    are wrapped: revert() puts back torch's function with its cache as it was. (A
    module that imported torch's function before apply() -- torch._inductor.codecache
    does -- still calls torch's own; the core leaves torch's modules alone.)
    """
    build = getattr(original, "__wrapped__", original)

    @functools.lru_cache(1)
    def _device_constructors() -> set[Any]:
        return {_unpatched(function) for function in build()}

    return _device_constructors


def factory_devices_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.FactoryDevices`."""
    # First: the factories wrapped below must keep honouring `with torch.device(...)`.
    yield AtomicPatch(
        "torch.utils._device._device_constructors",
        target_wrapper=_constructors_of_originals,
        precheck=npu_runtime_importable,
    )
    for name in _KEYWORD_FACTORIES:
        yield redirect_patch(f"torch.{name}", _DEVICE_KW)
    yield redirect_patch("torch._pin_memory", (device(1),))
    yield redirect_patch("torch.set_default_device", (device(0, ints=True),))
    yield redirect_patch("torch.get_device_module", (device(0),))
    for name in ("fftfreq", "rfftfreq"):
        yield redirect_patch(f"torch.fft.{name}", _DEVICE_KW)


# --------------------------------------------------------------------------- torch.load


def _restore_cuda_on_npu(storage: Any, location: str) -> Any:
    """``map_location`` for checkpoints written on CUDA: their storages land on the NPU."""
    torch = sys.modules["torch"]
    moved = to_npu_spec(location)
    return torch.serialization.default_restore_location(storage, moved)


def _load_check(*args: Any, **kwargs: Any) -> bool:
    location = args[1] if len(args) > 1 else kwargs.get("map_location")
    return location is None or is_cuda_spec(location)


def _load_rewriter(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_on_npu(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1:
            location = args[1]
            new = _restore_cuda_on_npu if location is None else to_npu_spec(location)
            args = (args[0], new, *args[2:])
        else:
            location = kwargs.get("map_location")
            new = _restore_cuda_on_npu if location is None else to_npu_spec(location)
            kwargs = {**kwargs, "map_location": new}
        return original(*args, **kwargs)

    return load_on_npu


def serialization_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.Serialization`."""
    yield AtomicPatch(
        "torch.serialization.load",
        target_wrapper=_load_rewriter,
        runtime_check=_load_check,
        precheck=npu_runtime_importable,
        aliases=("torch.load",),
    )


# --------------------------------------------------------------------------- Tensor, Module


def _npu_target(spec: Any) -> Any:
    """The device ``.cuda(spec)`` means, on the NPU."""
    if spec is None:
        return NPU
    if type(spec) is int:
        return f"{NPU}:{spec}"
    return to_npu_spec(spec)


def tensor_cuda(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    """``Tensor.cuda`` on the NPU: the same as ``Tensor.to(npu device)``."""
    return self.to(_npu_target(device), non_blocking=non_blocking, **kwargs)


def module_cuda(self: Any, device: Any = None) -> Any:
    """``Module.cuda`` on the NPU: the same as ``Module.to(npu device)``."""
    return self.to(_npu_target(device))


def _tensor_is_npu(self: Any) -> bool:
    return bool(self.is_npu)


_TO = (device(1, ints=True),)


def tensor_devices_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.TensorDevices`."""
    yield AtomicPatch(
        "torch.Tensor.cuda",
        tensor_cuda,
        runtime_check=always,
        precheck=npu_runtime_importable,
    )
    yield AtomicPatch(
        "torch.Tensor.is_cuda",
        property(_tensor_is_npu, doc="True for a tensor on the NPU (ascend-patch)."),
        precheck=npu_runtime_importable,
    )
    yield redirect_patch("torch.Tensor.to", _TO)
    for name in (
        "new_empty",
        "new_empty_strided",
        "new_full",
        "new_ones",
        "new_tensor",
        "new_zeros",
    ):
        yield redirect_patch(f"torch.Tensor.{name}", _DEVICE_KW)
    yield redirect_patch("torch.Tensor.pin_memory", (device(1),))


def module_devices_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.ModuleDevices`."""
    yield AtomicPatch(
        "torch.nn.modules.module.Module.cuda",
        module_cuda,
        runtime_check=always,
        precheck=npu_runtime_importable,
    )
    yield redirect_patch("torch.nn.modules.module.Module.to", _TO)
    yield redirect_patch("torch.nn.modules.module.Module.to_empty", _DEVICE_KW)


# --------------------------------------------------------------------------- storages


def _storage_is_npu(self: Any) -> bool:
    return bool(self.is_npu)


def storages_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.Storages`."""
    yield redirect_patch("torch.storage.UntypedStorage.__new__", (device(None, ints=True),))
    yield AtomicPatch(
        "torch.storage.TypedStorage.is_cuda",
        property(_storage_is_npu, doc="True for a storage on the NPU (ascend-patch)."),
        precheck=npu_runtime_importable,
    )


# --------------------------------------------------------------------------- context, generator


def device_context_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.DeviceContext`."""
    yield redirect_patch("torch.utils._device.DeviceContext.__init__", (device(1, ints=True),))


def _proxy_of(original: Any) -> Any:
    from ._proxies import torch_proxy_of

    return torch_proxy_of(original)


def _default_generators(original: Any) -> Any:
    return npu_module().default_generators


def _npu_has_default_generators() -> bool:
    return npu_runtime_importable() and hasattr(npu_module(), "default_generators")


def generator_and_event_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.GeneratorAndEvent`."""
    for name in ("Generator", "Event"):
        yield AtomicPatch(
            f"torch.{name}",
            target_wrapper=_proxy_of,
            precheck=npu_runtime_importable,
        )
    yield AtomicPatch(
        "torch.cuda.default_generators",
        target_wrapper=_default_generators,
        aliases=("torch.cuda.random.default_generators",),
        precheck=_npu_has_default_generators,
        after_import="torch_npu",
    )


# --------------------------------------------------------------------------- TorchScript


def _script_sees_originals(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def find_builtin(fn: Any) -> Any:
        found = original(fn)
        if found is None:
            try:
                wrapped = fn.__ascend_patch_original__
            except Exception:
                return None
            found = original(wrapped)
        return found

    return find_builtin


def script_builtins_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.ScriptBuiltins`."""
    yield AtomicPatch(
        "torch.jit._builtins._find_builtin",
        target_wrapper=_script_sees_originals,
        precheck=npu_runtime_importable,
        aliases=("torch.jit._recursive._find_builtin",),
    )


# --------------------------------------------------------------------------- autocast


def _set_autocast_enabled_check(*args: Any, **kwargs: Any) -> bool:
    if len(args) + len(kwargs) == 1 and "device_type" not in kwargs:
        return True  # the legacy one-argument form meant CUDA
    device_type = args[0] if args else kwargs.get("device_type")
    return is_cuda_spec(device_type)


def _set_autocast_enabled_rewriter(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_autocast_enabled_on_npu(*args: Any, **kwargs: Any) -> Any:
        if len(args) + len(kwargs) == 1 and "device_type" not in kwargs:
            enabled = args[0] if args else kwargs["enabled"]
            return original(NPU, enabled)
        if args:
            args = (to_npu_spec(args[0]), *args[1:])
        else:
            kwargs = {**kwargs, "device_type": to_npu_spec(kwargs.get("device_type"))}
        return original(*args, **kwargs)

    return set_autocast_enabled_on_npu


def _gpu_dtype_getter(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_autocast_gpu_dtype() -> Any:
        return sys.modules["torch"].get_autocast_dtype(NPU)

    return get_autocast_gpu_dtype


def _gpu_dtype_setter(original: Callable[..., Any]) -> Callable[..., Any]:
    def set_autocast_gpu_dtype(dtype: Any) -> Any:
        return sys.modules["torch"].set_autocast_dtype(NPU, dtype)

    return set_autocast_gpu_dtype


def autocast_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.Autocast`."""
    yield redirect_patch("torch.amp.autocast_mode.autocast.__init__", (Param(1, "device_type"),))
    # GradScaler's device defaults to "cuda"; torch.cuda.amp.GradScaler passes "cuda".
    yield redirect_patch(
        "torch.amp.grad_scaler.GradScaler.__init__", (device(1, absent_is_cuda=True),)
    )
    for name in ("custom_fwd", "custom_bwd"):
        yield redirect_patch(
            f"torch.amp.autocast_mode.{name}",
            (Param(None, "device_type"),),
            aliases=(f"torch.amp.{name}",),
        )
    yield redirect_patch(
        "torch.is_autocast_enabled", (Param(0, "device_type", absent_is_cuda=True),)
    )
    yield redirect_patch("torch.get_autocast_dtype", (Param(0, "device_type"),))
    yield redirect_patch("torch.set_autocast_dtype", (Param(0, "device_type"),))
    yield AtomicPatch(
        "torch.set_autocast_enabled",
        target_wrapper=_set_autocast_enabled_rewriter,
        runtime_check=_set_autocast_enabled_check,
        precheck=npu_runtime_importable,
    )
    for target, wrapper in (
        ("torch.get_autocast_gpu_dtype", _gpu_dtype_getter),
        ("torch.set_autocast_gpu_dtype", _gpu_dtype_setter),
    ):
        yield AtomicPatch(
            target,
            target_wrapper=wrapper,
            runtime_check=always,
            precheck=npu_runtime_importable,
        )
