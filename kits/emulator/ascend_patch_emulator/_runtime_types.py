"""``torch.npu``'s legacy tensor and storage types, emulated: ``torch.npu.FloatTensor`` & co.

torch_npu builds ``torch.npu.<T>Tensor`` in C++ the way torch builds
``torch.cuda.<T>Tensor``: type objects of the metaclass ``torch.tensortype`` whose
``isinstance`` is true for a tensor of that dtype on the NPU, whose call is torch's
legacy constructor (sizes, data, a tensor, a storage; ``device=``) allocating on the
current NPU, and whose ``dtype``/``layout``/``is_npu``/``is_sparse`` are properties of
the type. ``torch.npu.<T>Storage`` are ``torch.storage._LegacyStorage`` subclasses.

Here the same names, with the same construction and the same class properties. The
differences follow from emulated NPU tensors being CPU tensors: ``isinstance(t,
torch.npu.FloatTensor)`` is true for every strided float32 CPU tensor (as
``t.is_npu`` is), and a constructed tensor reports ``device(type='cpu')``. Types
cannot be subclassed, as in torch_npu. ``Tensor.type(torch.npu.FloatTensor)`` and
``Tensor.type("torch.npu.FloatTensor")`` convert, as torch_npu's ``Tensor.type``
does (installed by :func:`patch_tensor_type`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.storage import TypedStorage
from torch.storage import _LegacyStorage
from torch.storage import _LegacyStorageMeta

from ._runtime_state import device_index


__all__ = [
    "STORAGE_TYPES",
    "TENSOR_TYPES",
    "patch_storage_deepcopy",
    "patch_tensor_type",
    "register_storage_classes",
]

#: name prefix -> dtype, in the order torch_npu declares them.
_DTYPES = {
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Double": torch.float64,
    "Float": torch.float32,
    "Int": torch.int32,
    "Long": torch.int64,
    "Short": torch.int16,
    "Half": torch.float16,
    "Bool": torch.bool,
    "BFloat16": torch.bfloat16,
}
_MODULE = "torch.npu"


class _TensorType(type):
    """Metaclass of the emulated ``torch.npu.<T>Tensor`` (torch's ``torch.tensortype``)."""

    _dtype: torch.dtype
    _cpu_type: Any

    @property
    def dtype(cls) -> torch.dtype:
        return cls._dtype

    @property
    def layout(cls) -> torch.layout:
        return torch.strided

    @property
    def is_npu(cls) -> bool:
        return True

    @property
    def is_sparse(cls) -> bool:
        return False

    def __instancecheck__(cls, obj: Any) -> bool:
        # torch_npu: the tensor's dispatch key is the NPU's and its dtype matches.
        # Emulated NPU tensors are strided CPU tensors.
        return (
            isinstance(obj, torch.Tensor)
            and obj.layout == torch.strided
            and obj.device.type in ("cpu", "npu")
            and obj.dtype == cls._dtype
        )

    def __subclasscheck__(cls, sub: Any) -> bool:
        return sub is cls

    def __call__(cls, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        """torch's legacy constructor on the NPU: ``(*sizes)``, ``(data)``, ``(tensor)``, ``(storage)``."""
        # Checked like torch_npu does: a bad index or a non-NPU device raises.
        device_index(device)
        return cls._cpu_type(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        # torch copies torch.Tensor's methods onto each type (torch.npu.FloatTensor.add).
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(torch.Tensor, name)

    def __repr__(cls) -> str:
        return f"<class '{cls.__module__}.{cls.__name__}'>"


def _tensor_type(prefix: str, dtype: torch.dtype) -> type:
    def refuse_subclass(sub: type[Any], /, **kwargs: Any) -> None:
        raise TypeError(f"type '{_MODULE}.{prefix}Tensor' is not an acceptable base type")

    namespace = {
        "__module__": _MODULE,
        "__doc__": f"``torch.npu.{prefix}Tensor`` (emulated): a {dtype} tensor on the NPU.",
        "__init_subclass__": classmethod(refuse_subclass),
        "_dtype": dtype,
        "_cpu_type": getattr(torch, f"{prefix}Tensor"),
    }
    return _TensorType(f"{prefix}Tensor", (), namespace)


class _EmulatedLegacyStorageMeta(_LegacyStorageMeta):  # type: ignore[misc]
    def __instancecheck__(cls, instance: Any) -> bool:
        if type(instance) is TypedStorage:
            return instance.device.type in ("cpu", "npu") and instance.dtype == cls._dtype
        return False


class _NPULegacyStorage(_LegacyStorage, metaclass=_EmulatedLegacyStorageMeta):  # type: ignore[misc]
    """``torch.npu.<T>Storage``: torch's legacy storage on the (emulated) NPU.

    ``__module__`` is ``torch.npu``, so torch's own ``_LegacyStorage.__new__`` asks for
    an ``npu`` storage, which the emulator allocates in host memory. Wrapping an
    existing storage accepts host storages, since emulated NPU storages are those.
    """

    def __new__(
        cls,
        *args: Any,
        wrap_storage: Any = None,
        dtype: Any = None,
        device: Any = None,
        _internal: bool = False,
    ) -> Any:
        if (
            isinstance(wrap_storage, torch.UntypedStorage)
            and wrap_storage.device.type == "cpu"
            and not args
            and dtype is None
            and device is None
        ):
            return TypedStorage(wrap_storage=wrap_storage, dtype=cls._dtype, _internal=True)
        return super().__new__(
            cls, *args, wrap_storage=wrap_storage, dtype=dtype, device=device, _internal=_internal
        )

    @classmethod
    def from_buffer(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("from_buffer: Not available for NPU storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_with_weak_ptr: Not available for NPU storage")

    @classmethod
    def _new_shared_filename(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_shared_filename: Not available for NPU storage")


def _storage_type(prefix: str, dtype: torch.dtype) -> type:
    namespace = {
        "__module__": _MODULE,
        "__doc__": f"``torch.npu.{prefix}Storage`` (emulated): {dtype} storage on the NPU.",
        # torch's own legacy storages answer .dtype/._dtype as class properties.
        "dtype": torch._utils.classproperty(lambda cls: dtype),
        "_dtype": torch._utils.classproperty(lambda cls: dtype),
    }
    return _EmulatedLegacyStorageMeta(f"{prefix}Storage", (_NPULegacyStorage,), namespace)


#: ``torch.npu.<T>Tensor`` by name.
TENSOR_TYPES: dict[str, type] = {
    f"{prefix}Tensor": _tensor_type(prefix, dtype) for prefix, dtype in _DTYPES.items()
}
#: ``torch.npu.<T>Storage`` by name.
STORAGE_TYPES: dict[str, type] = {
    f"{prefix}Storage": _storage_type(prefix, dtype) for prefix, dtype in _DTYPES.items()
}

_BY_NAME = {
    f"{root}.npu.{name}": tensor_type
    for name, tensor_type in TENSOR_TYPES.items()
    for root in ("torch", "torch_npu")
}


def _npu_tensor_type(dtype: Any) -> Any:
    """The emulated type ``Tensor.type(dtype)`` names, or None."""
    if isinstance(dtype, str):
        return _BY_NAME.get(dtype)
    if isinstance(dtype, _TensorType):
        return dtype
    return None


Undo = Callable[[], None]


def patch_tensor_type() -> Undo:
    """``Tensor.type`` converts to an NPU legacy type given by object or name, as torch_npu's does."""
    # Defined on torch._C.TensorBase: the patch shadows it on torch.Tensor, the undo unshadows.
    shadowed = torch.Tensor.__dict__.get("type")
    original = torch.Tensor.type

    def type(self: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        npu_type = _npu_tensor_type(dtype)
        if npu_type is None:
            return original(self, dtype, non_blocking, **kwargs)
        return self.to(dtype=npu_type.dtype, device="npu", non_blocking=non_blocking)

    type.__doc__ = original.__doc__
    type.__wrapped__ = original  # type: ignore[attr-defined]
    torch.Tensor.type = type

    def undo() -> None:
        if shadowed is None:
            del torch.Tensor.type
        else:
            torch.Tensor.type = shadowed

    return undo


def register_storage_classes() -> Undo:
    """Add the NPU storage types to ``torch._storage_classes``, as torch_npu does."""
    classes: set[Any] = torch._storage_classes
    added = [cls for cls in STORAGE_TYPES.values() if cls not in classes]
    classes.update(added)

    def undo() -> None:
        for cls in added:
            classes.discard(cls)

    return undo


def patch_storage_deepcopy() -> Undo:
    """``copy.deepcopy`` of a tensor keeps its NPU format, as torch_npu's storage deepcopy does.

    torch_npu deep-copies an NPU storage by cloning it and casting the clone to the
    source's format; here the clone takes the source storage's format record.
    """
    from ._kernels.layout import copy_format

    storage_class = torch.UntypedStorage
    shadowed = storage_class.__dict__.get("__deepcopy__")
    original = storage_class.__deepcopy__

    def __deepcopy__(self: Any, memo: Any) -> Any:
        copied = original(self, memo)
        copy_format(self, copied)
        return copied

    __deepcopy__.__wrapped__ = original  # type: ignore[attr-defined]
    storage_class.__deepcopy__ = __deepcopy__

    def undo() -> None:
        if shadowed is None:
            del storage_class.__deepcopy__
        else:
            storage_class.__deepcopy__ = shadowed

    return undo
