import torch_scatter
from apex import amp
from mmcv.ops import nms
from mmcv.ops import roi_align
from spconv.pytorch import SparseConvTensor


def postprocess(boxes, scores, index):
    keep = nms(boxes, scores, 0.5)
    feats = roi_align(boxes, boxes, (7, 7))
    pooled = torch_scatter.scatter_max(scores, index)
    return keep, feats, pooled, SparseConvTensor, amp
