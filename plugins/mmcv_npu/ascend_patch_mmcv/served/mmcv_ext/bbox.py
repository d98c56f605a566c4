"""``mmcv._ext.bbox_overlaps``: IoU / IoF of axis-aligned boxes, into a preallocated tensor.

mmcv 2.1.0's ``mmcv/ops/bbox.py`` allocates ``ious`` (``[rows, cols]``, or ``[rows]``
when ``aligned``) and calls ``bbox_overlaps(bboxes1, bboxes2, ious, mode, aligned,
offset)`` with ``mode`` 0 for IoU, 1 for IoF (intersection over the first box's
area) and ``offset`` 0 or 1 (added to every width and height, the legacy
pixel-inclusive convention). The formula is mmcv's CPU kernel's, which is already
broadcast PyTorch: intersections clamped at 0, no epsilon (a pair of empty boxes
gives 0/0 = NaN there, and here); half precision works here, where mmcv's CPU
kernel raises (its clamp bound, ``INT_MAX``, overflows half). It runs as it is on NPU tensors: torch_npu's
``npu_iou`` has no ``offset`` and no IoF of mmcv's form, and the broadcast is the
whole work.
"""

from __future__ import annotations

from typing import Any

from .registry import implements


__all__ = ["bbox_overlaps"]


def _area(boxes: Any, offset: int) -> Any:
    return (boxes[..., 2] - boxes[..., 0] + offset) * (boxes[..., 3] - boxes[..., 1] + offset)


@implements("bbox_overlaps")
def bbox_overlaps(
    bboxes1: Any, bboxes2: Any, ious: Any, mode: int, aligned: bool, offset: int
) -> None:
    """Writes the overlaps of ``bboxes1 [rows, 4]`` and ``bboxes2 [cols, 4]`` into ``ious``."""
    import torch

    if bboxes1.shape[0] == 0 or bboxes2.shape[0] == 0:
        return
    first = bboxes1 if aligned else bboxes1[:, None, :]
    top_left = torch.max(first[..., :2], bboxes2[..., :2])
    bottom_right = torch.min(first[..., 2:], bboxes2[..., 2:])
    size = (bottom_right - top_left + offset).clamp(min=0)
    overlap = size[..., 0] * size[..., 1]
    area1 = _area(first, offset)
    union = area1 + _area(bboxes2, offset) - overlap if int(mode) == 0 else area1
    ious.copy_(overlap / union)
