"""MmengineCheckpointNumpy: mmengine's checkpoint loader under torch >= 2.6.

torch 2.6 made ``weights_only=True`` the default of ``torch.load``, and mmengine
0.10.x calls ``torch.load(filename, map_location=...)`` without the argument. A
checkpoint whose ``meta`` holds numpy objects (``CheckpointHook`` and user code put
numpy scalars and arrays there: seeds, dataset metadata) then fails with
``UnpicklingError: Weights only load failed``.

The fix keeps the safe unpickler on and allows exactly the numpy globals that an
array or scalar of a plain dtype (bool, number, fixed-width string, date) pickles to, for the duration of one call
of ``CheckpointLoader.load_checkpoint`` (every scheme -- local, http, openmmlab://
-- goes through it), with ``torch.serialization.safe_globals``: nothing stays
allow-listed after the call or after ``revert()``. Anything else a checkpoint pickles
(``builtins.getattr``, arbitrary classes, object or structured arrays) is still
refused -- mmengine's ``HistoryBuffer`` in a resume checkpoint's ``message_hub``
among them: it pickles through ``builtins.getattr``, which is not safe to allow.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = [
    "PLAIN_DTYPES",
    "checkpoint_numpy_patches",
    "numpy_checkpoint_globals",
    "with_numpy_safe_globals",
]

TARGET = "mmengine.runner.checkpoint:CheckpointLoader.load_checkpoint"


#: The dtype classes (``numpy.dtypes``, numpy >= 1.25) of arrays and scalars whose
#: unpickling builds no arbitrary object: booleans, numbers, fixed-width strings and
#: dates. Not ObjectDType (its elements are any pickled object), VoidDType
#: (structured records) nor StringDType.
PLAIN_DTYPES = (
    "BoolDType",
    "Int8DType",
    "UInt8DType",
    "Int16DType",
    "UInt16DType",
    "Int32DType",
    "UInt32DType",
    "Int64DType",
    "UInt64DType",
    "LongDType",
    "ULongDType",
    "LongLongDType",
    "ULongLongDType",
    "Float16DType",
    "Float32DType",
    "Float64DType",
    "LongDoubleDType",
    "Complex64DType",
    "Complex128DType",
    "CLongDoubleDType",
    "BytesDType",
    "StrDType",
    "DateTime64DType",
    "TimeDelta64DType",
)


def numpy_checkpoint_globals() -> list[Any]:
    """The globals a plain ndarray, a numpy scalar and their dtype are pickled with."""
    numpy = importlib.import_module("numpy")
    # numpy 2 pickles through numpy._core; numpy 1.x through numpy.core.
    major = int(numpy.__version__.split(".", 1)[0])
    multiarray = importlib.import_module(
        "numpy._core.multiarray" if major >= 2 else "numpy.core.multiarray"
    )
    allowed: list[Any] = [multiarray._reconstruct, multiarray.scalar, numpy.ndarray, numpy.dtype]
    # A checkpoint names the module of the numpy that wrote it: numpy.core.multiarray
    # (1.x, so most old checkpoints) or numpy._core.multiarray (2.x). Both names are
    # allowed, for the same two functions (torch's ``(global, "module.name")`` form).
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed.append((multiarray._reconstruct, f"{module}._reconstruct"))
        allowed.append((multiarray.scalar, f"{module}.scalar"))
    dtypes = getattr(numpy, "dtypes", None)  # older numpy: dtypes are plain numpy.dtype
    for name in PLAIN_DTYPES:
        dtype_class = getattr(dtypes, name, None)
        if dtype_class is not None and dtype_class not in allowed:
            allowed.append(dtype_class)
    return allowed


def with_numpy_safe_globals(original: Any) -> classmethod[Any, Any, Any]:
    """``target_wrapper``: the original classmethod, run with the numpy globals allowed."""
    inner: Callable[..., Any] = original.__func__ if isinstance(original, classmethod) else original

    @functools.wraps(inner)
    def load_checkpoint(cls: type, *args: Any, **kwargs: Any) -> Any:
        torch = sys.modules["torch"]  # mmengine.runner.checkpoint imported it
        with torch.serialization.safe_globals(numpy_checkpoint_globals()):
            return inner(cls, *args, **kwargs)

    return classmethod(load_checkpoint)


def checkpoint_numpy_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patch of :class:`ascend_patch_mmcv.groups.MmengineCheckpointNumpy`."""
    yield AtomicPatch(TARGET, target_wrapper=with_numpy_safe_globals)
