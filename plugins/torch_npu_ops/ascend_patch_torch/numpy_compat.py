"""NumpyCompat: the numpy aliases that 1.24 and 2.0 removed, restored for old code.

Each alias is its own patch on ``numpy.<name>`` with ``create=True``: it lands right
after numpy's ``__init__`` has run (the import hub), so module-level code such as
``DTYPES = {"f": np.float}`` in a library imported later works. An alias numpy
still (or again) has is never touched -- numpy 2 defines ``np.bool`` as ``np.bool_``
and ``np.long`` as the C long, and those keep numpy's meaning. ``revert()`` removes
what was added.

Old meanings: ``np.int`` was the builtin ``int`` (not ``np.int64``), ``np.float`` the
builtin ``float``, and so on (numpy 1.20 release notes); the 2.0 removals (NEP 52)
were aliases of numpy names. Importing this module imports neither numpy nor torch.
"""

from __future__ import annotations

import builtins
import math
import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = ["ALIASES", "asfarray", "in1d", "msort", "numpy_compat_patches", "numpy_lacks"]


def asfarray(a: Any, dtype: Any = None) -> Any:
    """``np.asfarray`` (removed in numpy 2.0): an array of an inexact type (float64 by default)."""
    np = sys.modules["numpy"]
    if dtype is None or not np.issubdtype(dtype, np.inexact):
        dtype = np.float64
    return np.asarray(a, dtype=dtype)


def in1d(
    ar1: Any, ar2: Any, assume_unique: bool = False, invert: bool = False, **kwargs: Any
) -> Any:
    """``np.in1d`` (removed in numpy 2.4): ``np.isin`` on the flattened first argument."""
    np = sys.modules["numpy"]
    return np.isin(np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert, **kwargs)


def msort(a: Any) -> Any:
    """``np.msort`` (removed in numpy 2.0): a copy sorted along the first axis."""
    np = sys.modules["numpy"]
    return np.sort(a, axis=0)


#: name -> what it meant: a Python object, or ``"numpy:<name>"`` resolved when numpy is imported
#: (the colon names the module: no import is tried for ``numpy.float64`` itself).
ALIASES: dict[str, Any] = {
    # removed in numpy 1.24 (deprecated in 1.20): aliases of Python builtins
    "bool": builtins.bool,
    "int": builtins.int,
    "float": builtins.float,
    "complex": builtins.complex,
    "object": builtins.object,
    "str": builtins.str,
    "long": builtins.int,
    "unicode": builtins.str,
    # removed in numpy 2.0 (NEP 52)
    "float_": "numpy:float64",
    "complex_": "numpy:complex128",
    "cfloat": "numpy:complex128",
    "singlecomplex": "numpy:complex64",
    "longfloat": "numpy:longdouble",
    "longcomplex": "numpy:clongdouble",
    "clongfloat": "numpy:clongdouble",
    "string_": "numpy:bytes_",
    "unicode_": "numpy:str_",
    "int0": "numpy:intp",
    "uint0": "numpy:uintp",
    "bool8": "numpy:bool_",
    "object0": "numpy:object_",
    "str0": "numpy:str_",
    "bytes0": "numpy:bytes_",
    "void0": "numpy:void",
    "Inf": math.inf,
    "Infinity": math.inf,
    "infty": math.inf,
    "PINF": math.inf,
    "NINF": -math.inf,
    "NaN": math.nan,
    "PZERO": 0.0,
    "NZERO": -0.0,
    "round_": "numpy:round",
    "product": "numpy:prod",
    "cumproduct": "numpy:cumprod",
    "sometrue": "numpy:any",
    "alltrue": "numpy:all",
    "trapz": "numpy:trapezoid",
    "asfarray": asfarray,
    "msort": msort,
    "in1d": in1d,
}


def numpy_lacks(target: str) -> bool:
    """The precheck of every alias: numpy does not define ``target``'s name (any more).

    One function for all 41 patches (it takes the target path by keyword), rather
    than a closure per alias: they are built on every apply() where numpy is installed.
    """
    # vars(), not hasattr(): numpy's module __getattr__ warns for removed names.
    return target.rpartition(".")[2] not in vars(sys.modules["numpy"])


def numpy_compat_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.NumpyCompat`."""
    for name, meaning in ALIASES.items():
        yield AtomicPatch(
            f"numpy.{name}",
            meaning,
            create=True,
            precheck=numpy_lacks,
        )
