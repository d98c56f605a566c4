"""TorchScatter: torch_scatter on the NPU, whether or not torch_scatter is installed.

* Not installed (it does not build against torch_npu):
  :func:`ascend_patch_torch.groups.import_rules` serves
  :mod:`ascend_patch_torch.served.torch_scatter` as ``torch_scatter`` (and its
  ``composite`` / ``utils`` submodules), so ``import torch_scatter`` works unchanged.
* Installed: its compiled kernels accept CPU and CUDA tensors only, so
  :class:`~ascend_patch_torch.groups.TorchScatter` (declared only then) routes calls
  whose ``src`` is an NPU tensor to the served module's functions and leaves the others
  to torch_scatter (each call counted in the report).

Both apply only where an NPU runtime is importable. Importing this module imports
neither torch nor torch_scatter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from .runtime import npu_runtime_importable


__all__ = ["on_npu", "torch_scatter_patches"]

#: The served stand-in, whose functions replace torch_scatter's for NPU tensors.
_SERVED = "ascend_patch_torch.served.torch_scatter"

# defining module (under torch_scatter) -> functions it defines
_FUNCTIONS = {
    "scatter": (
        "scatter_sum",
        "scatter_add",
        "scatter_mul",
        "scatter_mean",
        "scatter_min",
        "scatter_max",
        "scatter",
    ),
    "segment_csr": (
        "segment_sum_csr",
        "segment_add_csr",
        "segment_mean_csr",
        "segment_min_csr",
        "segment_max_csr",
        "segment_csr",
        "gather_csr",
    ),
    "segment_coo": (
        "segment_sum_coo",
        "segment_add_coo",
        "segment_mean_coo",
        "segment_min_coo",
        "segment_max_coo",
        "segment_coo",
        "gather_coo",
    ),
    "composite.softmax": ("scatter_softmax", "scatter_log_softmax"),
    "composite.std": ("scatter_std",),
    "composite.logsumexp": ("scatter_logsumexp",),
}


def on_npu(src: Any, *args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: the call's ``src`` is an NPU tensor (torch_scatter cannot take it)."""
    return bool(getattr(src, "is_npu", False))


def torch_scatter_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_torch.groups.TorchScatter`."""
    for module, names in _FUNCTIONS.items():
        for name in names:
            aliases = [f"torch_scatter.{name}"]
            if module.startswith("composite"):
                aliases.append(f"torch_scatter.composite.{name}")
            yield AtomicPatch(
                f"torch_scatter.{module}:{name}",
                f"{_SERVED}:{name}",
                runtime_check=on_npu,
                precheck=npu_runtime_importable,
                aliases=aliases,
            )
