"""Neighbour queries of the point-cloud ``mmcv._ext`` functions: ball query, knn, three_nn.

Semantics and kernels: see :mod:`ascend_patch_mmcv.served.mmcv_ext.points`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ._points_common import chunks
from ._points_common import mx_driving_for
from ._points_common import on_npu
from ._points_common import planes
from ._points_common import squared_distances
from .registry import implements


__all__ = ["ball_query_forward", "knn_forward", "three_nn_forward"]


# --- neighbours ---------------------------------------------------------------------------


@implements("ball_query_forward")
def ball_query_forward(
    new_xyz_tensor: torch.Tensor,
    xyz_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    b: int,
    n: int,
    m: int,
    min_radius: float,
    max_radius: float,
    nsample: int,
) -> None:
    """Write ``[B, m, nsample]`` neighbour indices (rows without any are left as given)."""
    if b == 0 or m == 0 or n == 0 or nsample <= 0:
        return
    centres = new_xyz_tensor.reshape(b, m, 3)
    points = xyz_tensor.reshape(b, n, 3)
    # The kernel squares the radii in float32 and compares in the points' precision.
    low = torch.tensor(min_radius, dtype=torch.float32) ** 2
    high = torch.tensor(max_radius, dtype=torch.float32) ** 2
    take = min(nsample, n)
    index = torch.arange(n, device=points.device)
    point_planes = planes(points)
    for part in chunks(m, b * n):
        d2 = squared_distances(centres[:, part], point_planes).float()
        hit = (d2 == 0) | ((d2 >= low) & (d2 < high))
        # The first `take` hits in index order: smallest indices, misses pushed past n.
        first = torch.where(hit, index, n).topk(take, dim=2, largest=False, sorted=True).values
        count = hit.sum(dim=2, keepdim=True).clamp(max=nsample)
        if take < nsample:
            first = torch.cat((first, first.new_full((*first.shape[:2], nsample - take), n)), 2)
        slots = torch.arange(nsample, device=points.device)
        rows = torch.where(slots < count, first, first[..., :1])
        found = count.squeeze(2) > 0
        out = idx_tensor[:, part]  # a view: written in place
        out[found] = rows[found].to(out.dtype)


def _knn(
    xyz_tensor: torch.Tensor,
    new_xyz_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    dist2_tensor: torch.Tensor,
    b: int,
    n: int,
    m: int,
    nsample: int,
) -> None:
    if b == 0 or m == 0 or nsample <= 0:
        return
    points = xyz_tensor.reshape(b, n, 3)
    centres = new_xyz_tensor.reshape(b, m, 3)
    take = min(nsample, n)
    if on_npu(points) and n > 0:
        mx = mx_driving_for("knn_forward", "knn")
        if mx is not None:
            found = mx.knn(nsample, points, centres, False).transpose(1, 2).long()
            near = points.unsqueeze(1).expand(b, m, n, 3)
            picked = near.gather(2, found.unsqueeze(3).expand(b, m, nsample, 3))
            diff = picked - centres.unsqueeze(2)
            square = diff * diff
            idx_tensor.copy_(found)
            dist2_tensor.copy_(square[..., 0] + square[..., 1] + square[..., 2])
            return
    point_planes = planes(points)
    for part in chunks(m, b * max(n, 1)):
        width = part.stop - part.start
        dist = torch.full((b, width, nsample), 1e10, dtype=dist2_tensor.dtype, device=points.device)
        index = torch.zeros((b, width, nsample), dtype=torch.long, device=points.device)
        if take > 0:
            d2 = squared_distances(centres[:, part], point_planes)
            values, order = d2.topk(take, dim=2, largest=False, sorted=True)
            # The kernel's heap starts at 1e10 and takes only smaller distances.
            kept = values < 1e10
            dist[..., :take] = torch.where(kept, values.to(dist.dtype), dist[..., :take])
            index[..., :take] = torch.where(kept, order, 0)
        idx_tensor[:, part] = index.to(idx_tensor.dtype)
        dist2_tensor[:, part] = dist


_KNN = inspect.signature(_knn)
# mmcv's pybind declares knn_forward twice over the same C++ function, the second time
# with its names in another order (``b`` names the xyz tensor). pybind11 tries them in
# turn and takes the first whose argument types fit: so do these.
_KNN_SECOND = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in (
            "b",
            "n",
            "m",
            "nsample",
            "xyz_tensor",
            "new_xyz_tensor",
            "idx_tensor",
            "dist2_tensor",
        )
    ]
)


def _fits(values: list[Any]) -> bool:
    tensors, numbers = values[:4], values[4:]
    return all(isinstance(t, torch.Tensor) for t in tensors) and not any(
        isinstance(v, (torch.Tensor, bool)) for v in numbers
    )


@implements("knn_forward", npu="mx_driving knn")
def knn_forward(*args: Any, **kwargs: Any) -> None:
    """Write the ``nsample`` nearest points of each centre: ``idx`` and ``dist2 [B, m, k]``.

    ``knn_forward(xyz_tensor, new_xyz_tensor, idx_tensor, dist2_tensor, b, n, m, nsample)``;
    the second spelling mmcv declares binds too.
    """
    for signature in (_KNN, _KNN_SECOND):
        try:
            values = list(signature.bind(*args, **kwargs).arguments.values())
        except TypeError:
            continue
        if _fits(values):
            _knn(*values)
            return
    raise TypeError(f"knn_forward(): incompatible function arguments; takes {_KNN}")


knn_forward.__signature__ = _KNN  # type: ignore[attr-defined]


@implements("three_nn_forward", npu="mx_driving three_nn")
def three_nn_forward(
    unknown_tensor: torch.Tensor,
    known_tensor: torch.Tensor,
    dist2_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    b: int,
    n: int,
    m: int,
) -> None:
    """Write the three nearest known points of each unknown one: ``dist2``, ``idx [B, n, 3]``."""
    if b == 0 or n == 0:
        return
    targets = unknown_tensor.reshape(b, n, 3)
    known = known_tensor.reshape(b, m, 3)
    if on_npu(targets) and m >= 3:
        mx = mx_driving_for("three_nn_forward", "three_nn")
        if mx is not None:
            found = mx.three_nn(targets, known)[1].long()
            picked = (
                known.unsqueeze(1)
                .expand(b, n, m, 3)
                .gather(2, found.unsqueeze(3).expand(b, n, 3, 3))
            )
            diff = targets.unsqueeze(2) - picked
            square = diff * diff
            idx_tensor.copy_(found)
            dist2_tensor.copy_(square[..., 0] + square[..., 1] + square[..., 2])
            return
    known_planes = planes(known)
    for part in chunks(n, b * max(m, 1)):
        width = part.stop - part.start
        dist = torch.full(
            (b, width, 3), float("inf"), dtype=dist2_tensor.dtype, device=known.device
        )
        index = torch.zeros((b, width, 3), dtype=torch.long, device=known.device)
        if m > 0:
            d2 = squared_distances(targets[:, part], known_planes)
            d2.nan_to_num_(nan=float("inf"), posinf=float("inf"))  # the kernel never takes a NaN
            # Three passes of argmin (first of equal minima): a stable partial sort.
            for slot in range(min(3, m)):
                best = d2.argmin(dim=2, keepdim=True)
                dist[..., slot : slot + 1] = d2.gather(2, best).to(dist.dtype)
                index[..., slot : slot + 1] = best
                d2.scatter_(2, best, float("inf"))
        dist2_tensor[:, part] = dist
        idx_tensor[:, part] = index.to(idx_tensor.dtype)
