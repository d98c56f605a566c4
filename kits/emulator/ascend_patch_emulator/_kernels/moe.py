"""Mixture-of-experts routing: ``npu_moe_gating_top_k_softmax``.

``p = softmax(x, -1)``; ``(y, expert_idx) = topk(p, k)`` (sorted, descending);
``row_idx[r, j] = j * R + r`` for ``R`` rows. The order is op-plugin's golden's
(test_npu_moe_gating_top_k_softmax.py): a stable descending sort of ``p`` in ``x``'s
dtype, so probabilities equal there go to the lower expert index. Rows with ``finished`` True keep
their ``y`` but get expert index ``E`` (one past the last expert), as in the
FasterTransformer kernel this op reproduces. Indices are int32. Forward only.
"""

from __future__ import annotations

from typing import Any

import torch

from . import compute_dtype
from . import kernel


@kernel("npu_moe_gating_top_k_softmax")
def moe_gating_top_k_softmax(x: Any, finished: Any = None, k: int = 1) -> tuple[Any, Any, Any]:
    experts = x.shape[-1]
    if not 1 <= k <= experts:
        raise RuntimeError(f"npu_moe_gating_top_k_softmax: k must be in [1, {experts}], got {k}")
    probs = torch.softmax(x.to(compute_dtype(x)), dim=-1)
    # Sorted as op-plugin's golden sorts: stable, on p rounded to x's dtype (topk breaks
    # ties in no documented order).
    order = torch.sort(probs.to(x.dtype), dim=-1, descending=True, stable=True).indices
    expert_idx = order[..., :k]
    y = probs.gather(-1, expert_idx)
    expert_idx = expert_idx.to(torch.int32)
    if finished is not None:
        if tuple(finished.shape) != tuple(x.shape[:-1]):
            raise RuntimeError(
                f"npu_moe_gating_top_k_softmax: finished shape {tuple(finished.shape)} must be "
                f"{tuple(x.shape[:-1])}"
            )
        done = finished.bool().unsqueeze(-1).expand_as(expert_idx)
        expert_idx = torch.where(done, torch.full_like(expert_idx, experts), expert_idx)
    rows = y[..., 0].numel()
    row_idx = torch.arange(rows * k, dtype=torch.int32).view(k, rows).T.reshape(y.shape)
    return y.to(x.dtype), expert_idx, row_idx.contiguous()
