"""``mmcv._ext`` point-cloud functions: points in boxes, sampling, neighbours, gathers.

Semantics are those of mmcv 2.1.0's kernels (its CUDA kernels where mmcv has no CPU
one -- every function here but ``points_in_boxes_cpu_forward``):

- points in boxes: a box is ``(x, y, z, dx, dy, dz, heading)`` with ``z`` its bottom;
  a point is inside when ``|z - (z + dz/2)| <= dz/2`` and, rotated by ``-heading``
  about the box centre, strictly inside ``(-dx/2, dx/2) x (-dy/2, dy/2)``. ``part``
  writes the first box holding each point (others keep the caller's ``-1``), ``all``
  writes 1 where a point is in a box (others keep the caller's 0), ``cpu`` writes every
  ``[box, point]`` flag.
- furthest point sampling starts at index 0 and then takes the point with the largest
  squared distance to the chosen set (``temp`` holds those distances and is updated in
  place, as mmcv's kernel does); ties go to the lowest index. ``_with_dist`` reads the
  distances from a ``[B, N, N]`` matrix.
- ball query lists, in index order, the first ``nsample`` points with squared distance
  0 or in ``[min_radius², max_radius²)``, repeating the first one to fill the row; a
  centre without any keeps the caller's row.
- knn writes the ``nsample`` nearest points (squared distances ascending; when fewer
  points than ``nsample`` exist, the rest are index 0 at distance 1e10) as ``[B, m,
  nsample]`` -- mmcv's Python transposes. Equal distances may come in either order.
- three_nn writes the three nearest known points (squared distances ascending, equal
  distances by lowest index; missing ones are index 0 at distance inf).
- the gathers and ``three_interpolate`` are indexing; their backwards add into the
  caller's gradient buffer, as mmcv's atomicAdd kernels do.
- ``assign_score_withk`` computes ``sum_m s[n,k,m] * (p[idx[n,k],m,o] - c[idx[n,0],m,o])``
  added into ``output``; as in mmcv's kernel, ``aggregate`` is accepted and not used, and
  a neighbour index outside ``[0, N0)`` contributes nothing.

Kernels: on NPU tensors the ``mx_driving`` kernel where one exists and was chosen
(:mod:`ascend_patch_mmcv._kernel_source`): furthest point sampling (both), knn,
three_nn (indices; the squared distances are then gathered exactly), group_points
and three_interpolate forward, points in boxes (part, all); otherwise portable
PyTorch. Portable code is vectorised over points and boxes; the only loops are
over the samples of furthest point sampling (each step needs the previous pick) and
over chunks of centres that bound the memory of ``[centres, points]`` matrices.
"""

from __future__ import annotations

from typing import Any

import torch

from ._points_common import chunks
from ._points_common import mx_driving_for
from ._points_common import on_npu
from ._points_neighbours import ball_query_forward
from ._points_neighbours import knn_forward
from ._points_neighbours import three_nn_forward
from ._points_scores import assign_score_withk_backward
from ._points_scores import assign_score_withk_forward
from .registry import implements


__all__ = [
    "assign_score_withk_backward",
    "assign_score_withk_forward",
    "ball_query_forward",
    "furthest_point_sampling_forward",
    "furthest_point_sampling_with_dist_forward",
    "gather_points_backward",
    "gather_points_forward",
    "group_points_backward",
    "group_points_forward",
    "knn_forward",
    "points_in_boxes_all_forward",
    "points_in_boxes_cpu_forward",
    "points_in_boxes_part_forward",
    "three_interpolate_backward",
    "three_interpolate_forward",
    "three_nn_forward",
]

# --- points in boxes -------------------------------------------------------------------


def _in_boxes(boxes: torch.Tensor, points: torch.Tensor, boxes_first: bool = False) -> torch.Tensor:
    """``[B, M, T]`` bool: point ``m`` inside box ``t`` (float32, mmcv's arithmetic).

    ``boxes_first``: ``[B, T, M]`` instead.
    """
    boxes = boxes.float()
    points = points.float()
    box_axis, point_axis = (2, 1) if boxes_first else (1, 2)
    cx, cy, cz, dx, dy, dz, heading = (boxes[..., i].unsqueeze(box_axis) for i in range(7))
    # cos/sin correctly rounded to float32, as the kernels' float cos/sin.
    cos = torch.cos(-heading.double()).float()
    sin = torch.sin(-heading.double()).float()
    centre_z = cz + dz / 2
    x, y, z = (points[..., i].unsqueeze(point_axis) for i in range(3))
    shift_x, shift_y = x - cx, y - cy
    local_x = shift_x * cos + shift_y * (-sin)
    local_y = shift_x * sin + shift_y * cos
    half_x, half_y = dx / 2, dy / 2
    return (
        ((z - centre_z).abs() <= dz / 2)
        & (local_x > -half_x)
        & (local_x < half_x)
        & (local_y > -half_y)
        & (local_y < half_y)
    )


@implements("points_in_boxes_part_forward", npu="mx_driving npu_points_in_box")
def points_in_boxes_part_forward(
    boxes_tensor: torch.Tensor, pts_tensor: torch.Tensor, box_idx_of_points_tensor: torch.Tensor
) -> None:
    """Write into ``[B, M]`` the first box holding each point (others untouched)."""
    boxes, points, out = boxes_tensor, pts_tensor, box_idx_of_points_tensor
    if points.shape[1] == 0 or boxes.shape[1] == 0:
        return
    if on_npu(points):
        mx = mx_driving_for("points_in_boxes_part_forward", "npu_points_in_box")
        if mx is not None:
            found = mx.npu_points_in_box(boxes.contiguous(), points.contiguous())
            out.copy_(torch.where(found >= 0, found.to(out.dtype), out))
            return
    for part in chunks(points.shape[1], boxes.shape[0] * boxes.shape[1]):
        inside = _in_boxes(boxes, points[:, part])
        first = inside.int().argmax(dim=2)
        out[:, part] = torch.where(inside.any(dim=2), first.to(out.dtype), out[:, part])


@implements("points_in_boxes_all_forward", npu="mx_driving npu_points_in_box_all")
def points_in_boxes_all_forward(
    boxes_tensor: torch.Tensor, pts_tensor: torch.Tensor, box_idx_of_points_tensor: torch.Tensor
) -> None:
    """Write 1 into ``[B, M, T]`` where point ``m`` is in box ``t`` (others untouched)."""
    boxes, points, out = boxes_tensor, pts_tensor, box_idx_of_points_tensor
    if points.shape[1] == 0 or boxes.shape[1] == 0:
        return
    if on_npu(points):
        mx = mx_driving_for("points_in_boxes_all_forward", "npu_points_in_box_all")
        if mx is not None:
            flags = mx.npu_points_in_box_all(boxes.contiguous(), points.contiguous())
            out.masked_fill_(flags.bool(), 1)
            return
    for part in chunks(points.shape[1], boxes.shape[0] * boxes.shape[1]):
        out[:, part] = out[:, part].masked_fill(_in_boxes(boxes, points[:, part]), 1)


@implements("points_in_boxes_cpu_forward")
def points_in_boxes_cpu_forward(
    boxes_tensor: torch.Tensor, pts_tensor: torch.Tensor, pts_indices_tensor: torch.Tensor
) -> None:
    """Write every flag of ``[T, M]`` (1 inside, 0 outside) for one scene."""
    boxes, points, out = boxes_tensor, pts_tensor, pts_indices_tensor
    if points.shape[0] == 0 or boxes.shape[0] == 0:
        return
    for part in chunks(points.shape[0], boxes.shape[0]):
        inside = _in_boxes(boxes.unsqueeze(0), points[part].unsqueeze(0), boxes_first=True)
        out[:, part] = inside[0].to(out.dtype)


# --- furthest point sampling ------------------------------------------------------------


def _furthest(distance_to: Any, temp: torch.Tensor, idx: torch.Tensor, m: int) -> None:
    """The sampling loop: ``distance_to(chosen [B]) -> [B, N]`` squared distances."""
    batch = temp.shape[0]
    chosen = torch.zeros(batch, dtype=torch.long, device=temp.device)
    picks = [chosen]
    in_place = temp.dtype == torch.float32 and temp.is_contiguous()
    nearest = temp if in_place else temp.float().contiguous()
    # One step per sample: each pick depends on the previous one (vectorised over points).
    for _ in range(1, m):
        torch.minimum(nearest, distance_to(chosen), out=nearest)
        chosen = nearest.argmax(dim=1)  # the first of equal maxima: the lowest index
        picks.append(chosen)
    if not in_place:
        temp.copy_(nearest)
    idx.copy_(torch.stack(picks, dim=1))


@implements("furthest_point_sampling_forward", npu="mx_driving furthest_point_sampling")
def furthest_point_sampling_forward(
    points_tensor: torch.Tensor,
    temp_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    b: int,
    n: int,
    m: int,
) -> None:
    """Write ``m`` sample indices ``[B, m]`` of points ``[B, N, 3]``; updates ``temp``."""
    if m <= 0 or b == 0:
        return
    if n == 0:  # no distance ever beats the kernel's initial pick: every sample is 0
        idx_tensor.fill_(0)
        return
    if on_npu(points_tensor) and n > 0:
        mx = mx_driving_for("furthest_point_sampling_forward", "furthest_point_sampling")
        if mx is not None:
            idx_tensor.copy_(mx.furthest_point_sampling(points_tensor, m))
            return
    points = points_tensor.reshape(b, n, 3)
    xyz = points.permute(2, 0, 1).contiguous()  # [3, B, N]: one op per step for all axes
    rows = torch.arange(b, device=points.device)

    def distance_to(chosen: torch.Tensor) -> torch.Tensor:
        diff = xyz - xyz[:, rows, chosen].unsqueeze(2)
        diff.mul_(diff)
        return (diff[0] + diff[1]).add_(diff[2])  # dx² + dy², then + dz², as the kernel

    _furthest(distance_to, temp_tensor, idx_tensor, m)


@implements(
    "furthest_point_sampling_with_dist_forward", npu="mx_driving furthest_point_sample_with_dist"
)
def furthest_point_sampling_with_dist_forward(
    points_tensor: torch.Tensor,
    temp_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    b: int,
    n: int,
    m: int,
) -> None:
    """As :func:`furthest_point_sampling_forward`, distances from ``[B, N, N]``."""
    if m <= 0 or b == 0:
        return
    if n == 0:  # no distance ever beats the kernel's initial pick: every sample is 0
        idx_tensor.fill_(0)
        return
    if on_npu(points_tensor) and n > 0:
        mx = mx_driving_for(
            "furthest_point_sampling_with_dist_forward", "furthest_point_sample_with_dist"
        )
        if mx is not None:
            idx_tensor.copy_(mx.furthest_point_sample_with_dist(points_tensor, m))
            return
    distances = points_tensor.reshape(b, n, n)
    rows = torch.arange(b, device=distances.device)
    _furthest(lambda chosen: distances[rows, chosen], temp_tensor, idx_tensor, m)


# --- gathers --------------------------------------------------------------------------


@implements("gather_points_forward")
def gather_points_forward(
    points_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    out_tensor: torch.Tensor,
    b: int,
    c: int,
    n: int,
    npoints: int,
) -> None:
    """``out[b, c, j] = points[b, c, idx[b, j]]`` (``[B, C, N]`` -> ``[B, C, npoints]``)."""
    index = idx_tensor.long().reshape(b, 1, npoints).expand(b, c, npoints)
    out_tensor.copy_(points_tensor.reshape(b, c, n).gather(2, index))


@implements("gather_points_backward")
def gather_points_backward(
    grad_out_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    grad_points_tensor: torch.Tensor,
    b: int,
    c: int,
    n: int,
    npoints: int,
) -> None:
    """Add ``grad_out [B, C, npoints]`` into ``grad_points [B, C, N]`` at ``idx``."""
    index = idx_tensor.long().reshape(b, 1, npoints).expand(b, c, npoints)
    grad = grad_out_tensor.reshape(b, c, npoints).to(grad_points_tensor.dtype)
    grad_points_tensor.scatter_add_(2, index, grad)


@implements("group_points_forward", npu="mx_driving group_points")
def group_points_forward(
    points_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    out_tensor: torch.Tensor,
    b: int,
    c: int,
    n: int,
    npoints: int,
    nsample: int,
) -> None:
    """``out[b, c, p, s] = points[b, c, idx[b, p, s]]``."""
    if on_npu(points_tensor) and out_tensor.numel() > 0:
        mx = mx_driving_for("group_points_forward", "group_points")
        if mx is not None:
            out_tensor.copy_(mx.group_points(points_tensor, idx_tensor))
            return
    index = idx_tensor.long().reshape(b, 1, npoints * nsample).expand(b, c, npoints * nsample)
    grouped = points_tensor.reshape(b, c, n).gather(2, index)
    out_tensor.copy_(grouped.reshape(b, c, npoints, nsample))


@implements("group_points_backward")
def group_points_backward(
    grad_out_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    grad_points_tensor: torch.Tensor,
    b: int,
    c: int,
    n: int,
    npoints: int,
    nsample: int,
) -> None:
    """Add ``grad_out [B, C, npoints, nsample]`` into ``grad_points [B, C, N]`` at ``idx``."""
    index = idx_tensor.long().reshape(b, 1, npoints * nsample).expand(b, c, npoints * nsample)
    grad = grad_out_tensor.reshape(b, c, npoints * nsample).to(grad_points_tensor.dtype)
    grad_points_tensor.scatter_add_(2, index, grad)


@implements("three_interpolate_forward", npu="mx_driving three_interpolate")
def three_interpolate_forward(
    points_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    weight_tensor: torch.Tensor,
    out_tensor: torch.Tensor,
    b: int,
    c: int,
    m: int,
    n: int,
) -> None:
    """``out[b, c, i] = sum_k weight[b, i, k] * points[b, c, idx[b, i, k]]`` (k = 0, 1, 2)."""
    if on_npu(points_tensor) and out_tensor.numel() > 0:
        mx = mx_driving_for("three_interpolate_forward", "three_interpolate")
        if mx is not None:
            out_tensor.copy_(mx.three_interpolate(points_tensor, idx_tensor, weight_tensor))
            return
    points = points_tensor.reshape(b, c, m)
    index = idx_tensor.long().reshape(b, n, 3)
    weight = weight_tensor.reshape(b, n, 3)
    terms = [
        weight[:, :, k].unsqueeze(1) * points.gather(2, index[:, :, k].unsqueeze(1).expand(b, c, n))
        for k in range(3)
    ]
    out_tensor.copy_(terms[0] + terms[1] + terms[2])


@implements("three_interpolate_backward")
def three_interpolate_backward(
    grad_out_tensor: torch.Tensor,
    idx_tensor: torch.Tensor,
    weight_tensor: torch.Tensor,
    grad_points_tensor: torch.Tensor,
    b: int,
    c: int,
    n: int,
    m: int,
) -> None:
    """Add ``weight * grad_out`` into ``grad_points [B, C, M]`` at the three indices."""
    grad = grad_out_tensor.reshape(b, c, n)
    index = idx_tensor.long().reshape(b, n, 3)
    weight = weight_tensor.reshape(b, n, 3)
    for k in range(3):  # the three neighbours, not points
        grad_points_tensor.scatter_add_(
            2,
            index[:, :, k].unsqueeze(1).expand(b, c, n),
            (grad * weight[:, :, k].unsqueeze(1)).to(grad_points_tensor.dtype),
        )
