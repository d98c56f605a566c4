"""A tiny Deformable DETR (random weights): a training forward and backward, on CPU tensors.

Run by plugins/mmcv_npu/tests/test_ext_end_to_end.py twice: on mmcv with its compiled
ops (``reference``) and on the same mmcv without ``_ext*.so``, where the plugin serves
``mmcv._ext`` (``served``); see ext_common.py for what each mode computes.
"""

import ext_common
import torch
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.utils import register_all_modules
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData


register_all_modules()
if ext_common.SERVED:
    ext_common.use_served_kernels()
layer = dict(embed_dims=32, num_levels=2, num_heads=4, num_points=2, batch_first=True)
ffn = dict(embed_dims=32, feedforward_channels=64, ffn_drop=0.0)
cfg = dict(
    type="DeformableDETR",
    num_queries=10,
    num_feature_levels=2,
    with_box_refine=False,
    as_two_stage=False,
    data_preprocessor=dict(
        type="DetDataPreprocessor",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=1,
    ),
    backbone=dict(
        type="ResNet",
        depth=18,
        num_stages=4,
        out_indices=(2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type="BN", requires_grad=True),
        norm_eval=False,
        style="pytorch",
    ),
    neck=dict(
        type="ChannelMapper",
        in_channels=[256, 512],
        kernel_size=1,
        out_channels=32,
        act_cfg=None,
        norm_cfg=dict(type="GN", num_groups=8),
        num_outs=2,
    ),
    encoder=dict(num_layers=1, layer_cfg=dict(self_attn_cfg=layer, ffn_cfg=ffn)),
    decoder=dict(
        num_layers=1,
        return_intermediate=True,
        post_norm_cfg=None,
        layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=32, num_heads=4, dropout=0.0, batch_first=True),
            cross_attn_cfg=layer,
            ffn_cfg=ffn,
        ),
    ),
    positional_encoding=dict(num_feats=16, normalize=True, offset=-0.5),
    bbox_head=dict(
        type="DeformableDETRHead",
        num_classes=3,
        embed_dims=32,
        sync_cls_avg_factor=True,
        loss_cls=dict(type="FocalLoss", use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=2.0),
        loss_bbox=dict(type="L1Loss", loss_weight=5.0),
        loss_iou=dict(type="GIoULoss", loss_weight=2.0),
    ),
    train_cfg=dict(
        assigner=dict(
            type="HungarianAssigner",
            match_costs=[
                dict(type="FocalLossCost", weight=2.0),
                dict(type="BBoxL1Cost", weight=5.0, box_format="xywh"),
                dict(type="IoUCost", iou_mode="giou", weight=2.0),
            ],
        )
    ),
    test_cfg=dict(max_per_img=10),
)
model = MODELS.build(ConfigDict(cfg))
model.init_weights()


def sample(boxes, labels):
    meta = dict(
        img_shape=(64, 64),
        ori_shape=(64, 64),
        pad_shape=(64, 64),
        batch_input_shape=(64, 64),
        scale_factor=(1.0, 1.0),
    )
    s = DetDataSample(metainfo=meta)
    s.gt_instances = InstanceData(bboxes=boxes, labels=labels)
    return s


def make_inputs():
    return {
        "images": torch.rand(2, 3, 64, 64) * 255,
        "boxes": [
            torch.tensor([[4.0, 6.0, 30.0, 40.0]]),
            torch.tensor([[10.0, 8, 60, 50], [1, 1, 20, 12]]),
        ],
        "labels": [torch.tensor([1]), torch.tensor([0, 2])],
    }


inputs = ext_common.init_state(model, make_inputs)
attention = [m for m in model.modules() if isinstance(m, MultiScaleDeformableAttention)]
outputs = ext_common.capture({f"msda{i}": m for i, m in enumerate(attention)})
outputs.update(ext_common.capture({"encoder": model.encoder, "decoder": model.decoder}))
samples = [sample(b, lab) for b, lab in zip(inputs["boxes"], inputs["labels"], strict=True)]
model.train()
losses = model.loss(inputs["images"], samples)
loss = sum(v for k, v in losses.items() if "loss" in k)
loss.backward()
ext_common.save(model, losses, outputs)
print("loss", float(loss.detach()), "served", ext_common.ext_record()["served"])
