"""Rotary position embedding: ``npu_rotary_mul``.

``out = x * r1 + rotate(x) * r2`` (r1 = cos, r2 = sin, broadcast against x). ``half``
mode rotates ``cat(-x2, x1)`` of the two halves of the last dim, ``interleave``
rotates the (even, odd) pairs, and a ``rotate`` matrix gives ``rotate(x) = x @ rotate``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import compute_dtype
from . import kernel


@kernel("npu_rotary_mul", differentiable=True)
def rotary_mul(self: Any, r1: Any, r2: Any, rotary_mode: str = "half", rotate: Any = None) -> Any:
    if rotary_mode not in ("half", "interleave"):
        # op-plugin's check, before anything else (also with ``rotate``), in its words.
        raise RuntimeError(
            f"The rotary_mode of npu_rotary_mul should be half or interleave, but got {rotary_mode}"
        )
    wide = compute_dtype(self)
    x = self.to(wide)
    if rotate is not None:
        turned = x @ rotate.to(wide)
    elif rotary_mode == "half":
        if x.shape[-1] % 2:
            raise RuntimeError(f"npu_rotary_mul: the last dim must be even, got {x.shape[-1]}")
        x1, x2 = x.chunk(2, -1)
        turned = torch.cat((-x2, x1), -1)
    else:
        if x.shape[-1] % 2:
            raise RuntimeError(f"npu_rotary_mul: the last dim must be even, got {x.shape[-1]}")
        turned = torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    return (x * r1.to(wide) + turned * r2.to(wide)).to(self.dtype)
