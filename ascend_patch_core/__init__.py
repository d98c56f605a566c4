"""ascend_patch_core: lazy, reversible runtime patches for moving CUDA-era PyTorch code to Ascend NPUs."""

from __future__ import annotations

from ._hookspecs import hookimpl


__all__ = ["hookimpl"]
