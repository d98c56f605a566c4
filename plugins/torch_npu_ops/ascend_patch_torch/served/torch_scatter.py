"""A ``torch_scatter``-compatible module for machines where torch_scatter cannot be built (NPU).

Same names, signatures and results as torch_scatter 2.1.2: ``scatter`` and
``scatter_{sum,add,mul,mean,min,max}`` (min/max return ``(out, argmax)``, with
``src.size(dim)`` as the argmax of empty slots and 0 as their value),
``segment_*_csr`` / ``segment_*_coo``, ``gather_csr`` / ``gather_coo``,
``scatter_softmax`` / ``scatter_log_softmax`` / ``scatter_std`` / ``scatter_logsumexp``,
and the ``torch_scatter.utils`` / ``torch_scatter.composite`` submodules.
Gradients match too: min/max send the gradient to the arg element only.

Kernels: ``mx_driving.scatter_add`` / ``scatter_mean`` / ``scatter_max`` when mx_driving
is importable and the input is a float32 NPU tensor in their domain (the DrivingSDK patcher's
patch called ``scatter_max`` with five arguments for its three, and cast every input
to float32); otherwise ``Tensor.scatter_add_`` / ``scatter_reduce_``, which torch_npu
runs on the NPU.

Served as ``torch_scatter`` by a ``ReplaceImport`` rule when torch_scatter is not
installed (see :func:`build`); when it is installed, :class:`TorchScatter` patches its
functions to these for NPU tensors only.
"""

from __future__ import annotations

import sys
import types

# The functions live in three modules, one per torch_scatter family; this module is
# the one to import (and the one served as torch_scatter).
from ._scatter_composite import scatter_log_softmax
from ._scatter_composite import scatter_logsumexp
from ._scatter_composite import scatter_softmax
from ._scatter_composite import scatter_std
from ._scatter_ops import _out_size as _out_size
from ._scatter_ops import _scatter_arg as _scatter_arg
from ._scatter_ops import broadcast
from ._scatter_ops import scatter
from ._scatter_ops import scatter_add
from ._scatter_ops import scatter_max
from ._scatter_ops import scatter_mean
from ._scatter_ops import scatter_min
from ._scatter_ops import scatter_mul
from ._scatter_ops import scatter_sum
from ._scatter_segment import gather_coo
from ._scatter_segment import gather_csr
from ._scatter_segment import segment_add_coo
from ._scatter_segment import segment_add_csr
from ._scatter_segment import segment_coo
from ._scatter_segment import segment_csr
from ._scatter_segment import segment_max_coo
from ._scatter_segment import segment_max_csr
from ._scatter_segment import segment_mean_coo
from ._scatter_segment import segment_mean_csr
from ._scatter_segment import segment_min_coo
from ._scatter_segment import segment_min_csr
from ._scatter_segment import segment_sum_coo
from ._scatter_segment import segment_sum_csr


__all__ = [
    "broadcast",
    "build",
    "gather_coo",
    "gather_csr",
    "scatter",
    "scatter_add",
    "scatter_log_softmax",
    "scatter_logsumexp",
    "scatter_max",
    "scatter_mean",
    "scatter_min",
    "scatter_mul",
    "scatter_softmax",
    "scatter_std",
    "scatter_sum",
    "segment_add_coo",
    "segment_add_csr",
    "segment_coo",
    "segment_csr",
    "segment_max_coo",
    "segment_max_csr",
    "segment_mean_coo",
    "segment_mean_csr",
    "segment_min_coo",
    "segment_min_csr",
    "segment_sum_coo",
    "segment_sum_csr",
]

#: The torch_scatter release whose behaviour this module reproduces.
VERSION = "2.1.2"

# --------------------------------------------------------------------------- the module

_TOP_LEVEL = [n for n in __all__ if n not in ("build", "broadcast")]
_COMPOSITE = ["scatter_std", "scatter_logsumexp", "scatter_softmax", "scatter_log_softmax"]


def build(name: str) -> types.ModuleType:
    """``ReplaceImport`` factory: the module served as ``torch_scatter`` (or a submodule)."""
    this = sys.modules[__name__]
    module = types.ModuleType(
        name,
        f"torch_scatter {VERSION}-compatible functions served by ascend-patch "
        f"({__name__}); torch_scatter itself is not installed.",
    )
    if name == "torch_scatter":
        module.__path__ = []  # a package, so torch_scatter.composite / .utils import
        names = _TOP_LEVEL
        module.__version__ = VERSION  # type: ignore[attr-defined]
    elif name == "torch_scatter.composite":
        names = _COMPOSITE
    elif name == "torch_scatter.utils":
        names = ["broadcast"]
    else:
        raise ImportError(f"ascend-patch serves no module {name!r} in place of torch_scatter")
    for attr in names:
        setattr(module, attr, getattr(this, attr))
    module.__all__ = list(names)  # type: ignore[attr-defined]
    return module
