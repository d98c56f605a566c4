"""A tiny RetinaNet (ResNet-18, random weights): one training step and inference, CUDA-style.

Run by plugins/mmcv_npu/tests/test_end_to_end.py under ``ascend-patch run --emulate-npu``.
Written as CUDA code is (``.cuda()``), unmodified for the NPU.
"""

import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.utils import register_all_modules
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData


register_all_modules()
torch.manual_seed(0)
cfg = dict(
    type="RetinaNet",
    data_preprocessor=dict(
        type="DetDataPreprocessor",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32,
    ),
    backbone=dict(
        type="ResNet",
        depth=18,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type="BN", requires_grad=True),
        norm_eval=False,
        style="pytorch",
    ),
    neck=dict(
        type="FPN",
        in_channels=[128, 256, 512],
        out_channels=32,
        start_level=0,
        add_extra_convs="on_input",
        num_outs=3,
    ),
    bbox_head=dict(
        type="RetinaHead",
        num_classes=3,
        in_channels=32,
        stacked_convs=1,
        feat_channels=32,
        anchor_generator=dict(
            type="AnchorGenerator",
            octave_base_scale=4,
            scales_per_octave=1,
            ratios=[1.0],
            strides=[8, 16, 32],
        ),
        bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4, target_stds=[1.0] * 4),
        loss_cls=dict(type="FocalLoss", use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0),
        loss_bbox=dict(type="L1Loss", loss_weight=1.0),
    ),
    train_cfg=dict(
        assigner=dict(type="MaxIoUAssigner", pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0),
        sampler=dict(type="PseudoSampler"),
        allowed_border=-1,
        pos_weight=-1,
        debug=False,
    ),
    test_cfg=dict(
        nms_pre=100,
        min_bbox_size=0,
        score_thr=0.0,
        nms=dict(type="nms", iou_threshold=0.5),
        max_per_img=20,
    ),
)
model = MODELS.build(ConfigDict(cfg)).cuda()
model.init_weights()


def sample():
    s = DetDataSample(
        metainfo=dict(
            img_shape=(64, 64),
            ori_shape=(64, 64),
            pad_shape=(64, 64),
            batch_input_shape=(64, 64),
            scale_factor=(1.0, 1.0),
        )
    )
    s.gt_instances = InstanceData(
        bboxes=torch.tensor([[4.0, 6.0, 30.0, 40.0]]).cuda(), labels=torch.tensor([1]).cuda()
    )
    return s


inputs = torch.rand(2, 3, 64, 64).cuda() * 255
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model.train()
losses = model.loss(inputs, [sample(), sample()])
loss = sum(v if torch.is_tensor(v) else sum(v) for k, v in losses.items() if "loss" in k)
loss.backward()
optimizer.step()
model.eval()
with torch.no_grad():
    results = model.predict(inputs, [sample(), sample()])
print("loss", float(loss.detach()), "boxes", tuple(results[0].pred_instances.bboxes.shape))
