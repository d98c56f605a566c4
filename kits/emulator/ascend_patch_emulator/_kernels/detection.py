"""Detection ops: ``npu_iou``, ``npu_nms_v4``, ``npu_roi_align``.

* ``npu_iou(bboxes, gtboxes, mode)``: boxes ``(x1, y1, x2, y2)``; result
  ``[num_gt, num_bboxes]`` (transposed against ``box_iou(bboxes, gtboxes)``); mode 0
  is IoU, mode 1 IoF (intersection over the ground-truth box's area).
* ``npu_nms_v4`` (TensorFlow NonMaxSuppressionV4): greedy NMS over boxes whose score
  is above ``scores_threshold``, dropping boxes whose IoU with a kept box is above
  ``iou_threshold``; returns ``(selected int32, valid_count int32 0-d)``, the selection
  zero-padded to ``max_output_size`` with ``pad_to_max_output_size``.
* ``npu_roi_align``: rois ``[K, 5] = (batch index, x1, y1, x2, y2)``, features NCHW,
  ``sample_num`` samples per bin side (0: adaptive, ``ceil(roi size / bins)``), the
  torchvision/mmcv ROIAlign sampling; ``roi_end_mode`` 3 is ``aligned=True`` (pixel
  centres shifted by -0.5), 0 is ``aligned=False`` (rois at least 1x1). Other
  ``roi_end_mode`` values are not emulated. Every sample of every roi is one entry of
  a flat list (each roi's own adaptive count, no loop over rois) and each bin one
  weighted bag of ``embedding_bag`` over the channels-last map, so the graph that
  ``npu_roi_alignbk`` differentiates has a fixed number of nodes whatever the number
  of rois (a loop writing each roi's slice made its backward quadratic in them). A
  sample whose position is not finite (a roi with NaN or infinite corners) gives 0,
  and a roi whose adaptive sample count is not finite or beyond ``2**31 - 1`` gets
  none (its bins are 0); a batch index that names no image is an error.

None of them has a derivative in torch_npu (``npu_roi_alignbk`` is called by the
contrib module's own autograd.Function), so none has one here.
"""

from __future__ import annotations

from typing import Any

import torch

from . import compute_dtype
from . import kernel


def _pairwise(boxes: Any, others: Any) -> tuple[Any, Any, Any]:
    """(intersection, area of boxes, area of others), pairwise ``[len(boxes), len(others)]``."""
    top_left = torch.maximum(boxes[:, None, :2], others[None, :, :2])
    bottom_right = torch.minimum(boxes[:, None, 2:], others[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    area = (boxes[:, 2:] - boxes[:, :2]).clamp(min=0).prod(-1)
    other_area = (others[:, 2:] - others[:, :2]).clamp(min=0).prod(-1)
    return inter, area, other_area


@kernel("npu_iou", "npu_ptiou")
def iou(bboxes: Any, gtboxes: Any, mode: int = 0) -> Any:
    if bboxes.shape[-1] != 4 or gtboxes.shape[-1] != 4:
        raise RuntimeError("npu_iou: boxes must be [num, 4] (x1, y1, x2, y2)")
    wide = compute_dtype(bboxes)
    inter, gt_area, box_area = _pairwise(gtboxes.to(wide), bboxes.to(wide))
    if mode == 0:
        union = gt_area[:, None] + box_area[None, :] - inter
    elif mode == 1:
        union = gt_area[:, None].expand_as(inter)
    else:
        raise RuntimeError(f"npu_iou: mode must be 0 (IoU) or 1 (IoF), got {mode}")
    return (inter / union.clamp(min=torch.finfo(wide).tiny)).to(bboxes.dtype)


def _scalar(value: Any) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


@kernel("npu_nms_v4")
def nms_v4(
    self: Any,
    scores: Any,
    max_output_size: Any,
    iou_threshold: Any,
    scores_threshold: Any,
    pad_to_max_output_size: bool = False,
) -> tuple[Any, Any]:
    limit = int(_scalar(max_output_size))
    iou_limit, score_limit = _scalar(iou_threshold), _scalar(scores_threshold)
    if self.dim() != 2 or self.shape[-1] != 4 or scores.shape != self.shape[:1]:
        raise RuntimeError("npu_nms_v4: boxes must be [num, 4] and scores [num]")
    boxes = self.double()
    corners = torch.cat(
        [torch.minimum(boxes[:, :2], boxes[:, 2:]), torch.maximum(boxes[:, :2], boxes[:, 2:])], 1
    )
    inter, area, _ = _pairwise(corners, corners)
    union = area[:, None] + area[None, :] - inter
    overlap = torch.where(union > 0, inter / union.clamp(min=1e-300), torch.zeros_like(inter))
    candidates = (scores.double() > score_limit).nonzero().flatten()
    order = candidates[torch.argsort(scores.double()[candidates], descending=True, stable=True)]
    kept: list[int] = []
    for index in order.tolist():
        if len(kept) >= limit:
            break
        if all(float(overlap[index, other]) <= iou_limit for other in kept):
            kept.append(index)
    selected = torch.tensor(kept, dtype=torch.int32)
    if pad_to_max_output_size and len(kept) < limit:
        selected = torch.cat([selected, torch.zeros(limit - len(kept), dtype=torch.int32)])
    return selected, torch.tensor(len(kept), dtype=torch.int32)


def _corners(y: Any, x: Any, height: int, width: int) -> tuple[Any, Any, Any]:
    """torchvision's ROIAlign bilinear rule for points ``y, x [S]``: ``[S, 4]`` flat pixel
    indices into one ``H * W`` map and their weights, and ``inside [S]``.

    A point beyond one pixel outside the map (or not finite) weighs 0 (the caller points
    its corners at a zero row, so that no pixel is read for it); the others are clamped
    into the map before interpolation, the last row/column counting twice.
    """
    inside = (y >= -1.0) & (y <= height) & (x >= -1.0) & (x <= width)
    y = torch.where(inside, y, 0.0).clamp(min=0)
    x = torch.where(inside, x, 0.0).clamp(min=0)
    y_low = y.floor().long().clamp(max=height - 1)
    x_low = x.floor().long().clamp(max=width - 1)
    y = torch.where(y_low >= height - 1, y_low.to(y.dtype), y)
    x = torch.where(x_low >= width - 1, x_low.to(x.dtype), x)
    y_high = (y_low + 1).clamp(max=height - 1)
    x_high = (x_low + 1).clamp(max=width - 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    index = torch.stack(
        [
            y_low * width + x_low,
            y_low * width + x_high,
            y_high * width + x_low,
            y_high * width + x_high,
        ],
        -1,
    )
    weights = torch.stack([hy * hx, hy * lx, ly * hx, ly * lx], -1) * inside.unsqueeze(-1)
    return index, weights, inside


def _grid(size: Any, pooled: int, sample_num: int) -> Any:
    """Samples per bin side of each roi: ``sample_num``, or adaptive ``ceil(size / pooled)``
    (0 for an empty roi, and for a count that is not finite or does not fit the kernels'
    32-bit int, where they overflow: converted first, it would wrap)."""
    if sample_num > 0:
        return torch.full(size.shape, sample_num, dtype=torch.long)
    count = torch.ceil(size / pooled).clamp(min=0)
    return torch.where(torch.isfinite(count) & (count <= 2**31 - 1), count, 0.0).long()


@kernel("npu_roi_align")
def roi_align(
    self: Any,
    rois: Any,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sample_num: int,
    roi_end_mode: int,
) -> Any:
    if roi_end_mode not in (0, 3):
        raise RuntimeError(
            f"npu_roi_align: roi_end_mode {roi_end_mode} is not emulated (0 = aligned=False, "
            f"3 = aligned=True are)"
        )
    if self.dim() != 4 or rois.dim() != 2 or rois.shape[1] != 5:
        raise RuntimeError("npu_roi_align: features must be NCHW and rois [K, 5]")
    aligned = roi_end_mode == 3
    wide = compute_dtype(self)
    batch, channels, height, width = self.shape
    boxes = rois.to(wide)
    images = boxes[:, 0].trunc()  # as the kernels' int conversion
    stray = ~((images >= 0) & (images < batch))
    if bool(stray.any()):
        raise RuntimeError(
            f"npu_roi_align: a roi's batch index (column 0) must name one of the {batch} "
            f"images; got {boxes[stray, 0][:5].tolist()} (rois {stray.nonzero().flatten()[:5].tolist()})"
        )
    shift = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (boxes[:, i] * spatial_scale - shift for i in range(1, 5))
    roi_w, roi_h = x2 - x1, y2 - y1
    if not aligned:
        roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
    bin_h, bin_w = roi_h / pooled_height, roi_w / pooled_width
    grid_h = _grid(roi_h, pooled_height, sample_num)
    grid_w = _grid(roi_w, pooled_width, sample_num)
    # Bags are the bins (roi, i, j) in order; entries the samples of a bin, in order.
    bins = pooled_height * pooled_width
    per_bin = (grid_h * grid_w).repeat_interleave(bins)
    bag = torch.arange(per_bin.numel()).repeat_interleave(per_bin)
    first = torch.cumsum(per_bin, 0) - per_bin
    local = torch.arange(bag.numel()) - first[bag]
    roi, cell = bag // bins, bag % bins
    gh, gw = grid_h[roi], grid_w[roi]
    iy, ix = (local // gw).to(wide), (local % gw).to(wide)
    row, col = (cell // pooled_width).to(wide), (cell % pooled_width).to(wide)
    ys = y1[roi] + row * bin_h[roi] + (iy + 0.5) * bin_h[roi] / gh.to(wide)
    xs = x1[roi] + col * bin_w[roi] + (ix + 0.5) * bin_w[roi] / gw.to(wide)
    index, weights, inside = _corners(ys, xs, height, width)
    # The average over the bin's samples: each sample weighs 1 / count.
    weights = weights / per_bin[bag].clamp(min=1).unsqueeze(-1).to(wide)
    pixels = batch * height * width
    index = index + (images.long()[roi] * (height * width)).unsqueeze(-1)
    index = torch.where(inside.unsqueeze(-1), index, pixels)  # the zero row: nothing read
    table = self.to(wide).permute(0, 2, 3, 1).reshape(pixels, channels)
    table = torch.cat([table, table.new_zeros(1, channels)])
    pooled = torch.nn.functional.embedding_bag(
        index.flatten(),
        table,
        torch.cumsum(4 * per_bin, 0) - 4 * per_bin,
        mode="sum",
        per_sample_weights=weights.flatten(),
    )
    out = pooled.view(rois.shape[0], pooled_height, pooled_width, channels).permute(0, 3, 1, 2)
    return out.contiguous().to(self.dtype)
