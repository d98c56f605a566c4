"""``assign_score_withk`` (PAConv) of the point-cloud ``mmcv._ext`` functions.

Semantics: see :mod:`ascend_patch_mmcv.served.mmcv_ext.points`. Portable on every device:
``mx_driving.assign_score_withk`` passes ``aggregate`` on to its kernel, while mmcv's
kernel ignores it (always the sum), so the two need not agree.
"""

from __future__ import annotations

import torch

from ._points_common import chunks
from .registry import implements


__all__ = ["assign_score_withk_backward", "assign_score_withk_forward"]


# --- assign_score_withk ------------------------------------------------------------------


def _neighbours(knn_idx: torch.Tensor, n0: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(neighbour [B, N1, K], centre [B, N1], valid [B, N1, K])`` with safe indices."""
    index = knn_idx.long()
    valid = (index >= 0) & (index < n0)
    return index.clamp(0, max(n0 - 1, 0)), index[..., 0].clamp(0, max(n0 - 1, 0)), valid


def _rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table [B, N0, ...]`` rows at ``index [B, ...]`` -> ``[B, ..., ...]``."""
    batch = torch.arange(table.shape[0], device=table.device).reshape(
        -1, *([1] * (index.dim() - 1))
    )
    return table[batch, index]


@implements("assign_score_withk_forward")
def assign_score_withk_forward(
    points: torch.Tensor,
    centers: torch.Tensor,
    scores: torch.Tensor,
    knn_idx: torch.Tensor,
    output: torch.Tensor,
    B: int,
    N0: int,
    N1: int,
    M: int,
    K: int,
    O: int,  # noqa: E741
    aggregate: int,
) -> None:
    """Add the scored neighbour features ``[B, O, N1, K]`` into ``output``."""
    if 0 in (B, N1, K, O) or N0 == 0:
        return
    neighbour, centre, valid = _neighbours(knn_idx.reshape(B, N1, K), N0)
    points = points.reshape(B, N0, M, O)
    centers = centers.reshape(B, N0, M, O)
    scores = scores.reshape(B, N1, K, M)
    for part in chunks(N1, B * K * M * O):
        s = scores[:, part]
        gathered = _rows(points, neighbour[:, part])  # [B, n, K, M, O]
        own = _rows(centers, centre[:, part])  # [B, n, M, O]
        value = torch.einsum("bnkm,bnkmo->bonk", s, gathered) - torch.einsum(
            "bnkm,bnmo->bonk", s, own
        )
        value = value * valid[:, part].unsqueeze(1).to(value.dtype)
        output[:, :, part] += value.to(output.dtype)


@implements("assign_score_withk_backward")
def assign_score_withk_backward(
    grad_out: torch.Tensor,
    points: torch.Tensor,
    centers: torch.Tensor,
    scores: torch.Tensor,
    knn_idx: torch.Tensor,
    grad_points: torch.Tensor,
    grad_centers: torch.Tensor,
    grad_scores: torch.Tensor,
    B: int,
    N0: int,
    N1: int,
    M: int,
    K: int,
    O: int,  # noqa: E741
    aggregate: int,
) -> None:
    """Add the gradients of points, centres and scores into the three buffers."""
    if 0 in (B, N1, K, O) or N0 == 0:
        return
    neighbour, centre, valid = _neighbours(knn_idx.reshape(B, N1, K), N0)
    points = points.reshape(B, N0, M, O)
    centers = centers.reshape(B, N0, M, O)
    scores = scores.reshape(B, N1, K, M)
    grad = grad_out.reshape(B, O, N1, K)
    offsets = (torch.arange(B, device=points.device) * N0).reshape(B, 1, 1)
    for part in chunks(N1, B * K * M * O):
        g = grad[:, :, part] * valid[:, part].unsqueeze(1).to(grad.dtype)  # [B, O, n, K]
        s = scores[:, part]
        to_points = torch.einsum("bnkm,bonk->bnkmo", s, g)
        to_centres = -torch.einsum("bnkm,bonk->bnmo", s, g)
        grad_points.view(B * N0, M, O).index_add_(
            0,
            (neighbour[:, part] + offsets).flatten(),
            to_points.reshape(-1, M, O).to(grad_points.dtype),
        )
        grad_centers.view(B * N0, M, O).index_add_(
            0,
            (centre[:, part] + offsets[..., 0]).flatten(),
            to_centres.reshape(-1, M, O).to(grad_centers.dtype),
        )
        difference = _rows(points, neighbour[:, part]) - _rows(centers, centre[:, part]).unsqueeze(
            2
        )
        grad_scores[:, part] += torch.einsum("bnkmo,bonk->bnkm", difference, g).to(
            grad_scores.dtype
        )
