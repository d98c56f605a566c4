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
  ``roi_end_mode`` values are not emulated.

None of them has a derivative in torch_npu (``npu_roi_alignbk`` is called by the
contrib module's own autograd.Function), so none has one here.
"""

from __future__ import annotations

import math
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


def _bilinear(feature: Any, y: Any, x: Any) -> Any:
    """Sample ``feature [C, H, W]`` at points ``y, x`` (any equal shapes) -> ``[C, *shape]``.

    torchvision's ROIAlign rule: points beyond one pixel outside the map give 0;
    coordinates are clamped into the map before interpolation.
    """
    height, width = feature.shape[-2:]
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y = y.clamp(min=0)
    x = x.clamp(min=0)
    y_low = y.floor().long().clamp(max=height - 1)
    x_low = x.floor().long().clamp(max=width - 1)
    y = torch.where(y_low >= height - 1, y_low.to(y.dtype), y)
    x = torch.where(x_low >= width - 1, x_low.to(x.dtype), x)
    y_high = (y_low + 1).clamp(max=height - 1)
    x_high = (x_low + 1).clamp(max=width - 1)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    flat = feature.reshape(feature.shape[0], -1)

    def at(yy: Any, xx: Any) -> Any:
        return flat[:, (yy * width + xx).flatten()].view(feature.shape[0], *yy.shape)

    value = (
        hy * hx * at(y_low, x_low)
        + hy * lx * at(y_low, x_high)
        + ly * hx * at(y_high, x_low)
        + ly * lx * at(y_high, x_high)
    )
    return torch.where(outside, torch.zeros_like(value), value)


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
    features = self.to(wide)
    out = features.new_zeros(rois.shape[0], self.shape[1], pooled_height, pooled_width)
    shift = 0.5 if aligned else 0.0
    for r, roi in enumerate(rois.to(wide)):
        batch = int(roi[0])
        x1, y1, x2, y2 = (float(v) * spatial_scale - shift for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled_height, roi_w / pooled_width
        # Adaptive sampling can give 0 samples for an empty roi: its bins are 0, as in torchvision.
        grid_h = sample_num if sample_num > 0 else max(math.ceil(roi_h / pooled_height), 0)
        grid_w = sample_num if sample_num > 0 else max(math.ceil(roi_w / pooled_width), 0)
        iy = torch.arange(pooled_height, dtype=wide)[:, None] * bin_h + (
            torch.arange(grid_h, dtype=wide)[None, :] + 0.5
        ) * (bin_h / max(grid_h, 1))
        ix = torch.arange(pooled_width, dtype=wide)[:, None] * bin_w + (
            torch.arange(grid_w, dtype=wide)[None, :] + 0.5
        ) * (bin_w / max(grid_w, 1))
        ys = (y1 + iy).view(pooled_height, grid_h, 1, 1).expand(-1, -1, pooled_width, grid_w)
        xs = (x1 + ix).view(1, 1, pooled_width, grid_w).expand(pooled_height, grid_h, -1, -1)
        samples = _bilinear(features[batch], ys, xs)
        out[r] = samples.sum((2, 4)) / max(grid_h * grid_w, 1)
    return out.to(self.dtype)
