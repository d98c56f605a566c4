"""The causal mask ``npu_fusion_attention`` takes in its compressed sparse modes.

With ``sparse_mode`` 2 (top-left causal), 3 (down-right causal) or 4 (band) the op reads
a fixed 2048 x 2048 boolean upper triangle (True = masked out) whatever the sequence
lengths, so one mask per device serves every call: building it per call would allocate
4 MB and launch a kernel each time. The attention interface
(:mod:`.attention_kernels`) and the ``flash_attn`` stand-in (:mod:`.served.flash_attn`)
share this cache: one mask per device in the process, as transformers' own NPU
flash-attention integration (4.53+) keeps. :func:`release` frees them (a long-lived process that stops using attention
on a device).
"""

from __future__ import annotations

import threading
from typing import Any


__all__ = ["SIZE", "compressed_causal_mask", "release"]

#: The side of the compressed mask the op's sparse modes 2, 3 and 4 expect.
SIZE = 2048

_masks: dict[Any, Any] = {}
_lock = threading.Lock()


def compressed_causal_mask(device: Any) -> Any:
    """The ``SIZE`` x ``SIZE`` upper triangle (above the diagonal True) on ``device``."""
    mask = _masks.get(device)
    if mask is None:
        import torch

        with _lock:  # two threads starting together build it once
            mask = _masks.get(device)
            if mask is None:
                ones = torch.ones(SIZE, SIZE, dtype=torch.bool, device=device)
                mask = _masks[device] = torch.triu(ones, 1)
    return mask


def release() -> None:
    """Forget every cached mask (their memory is freed once no running call holds one)."""
    with _lock:
        _masks.clear()
