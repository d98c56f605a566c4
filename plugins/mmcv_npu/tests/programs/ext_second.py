"""A tiny SECOND (mmdet3d 1.4.0 VoxelNet, sparse-conv middle encoder; random weights).

A training forward and backward on CPU tensors, run by
plugins/mmcv_npu/tests/test_ext_end_to_end.py twice: on mmcv with its compiled ops
(``reference``: hard voxelization by mmcv's CPU kernel, sparse convolution computed
densely by torch as that build has none) and on the same mmcv without ``_ext*.so``
(``served``: everything through the plugin's ``mmcv._ext``); ``served_pinned`` feeds
the middle encoder's reference output forward, to compare the backward passes alone. The served run then also
predicts (eval, no grad; axis-aligned BEV NMS: the provider has no nms_rotated).
See ext_common.py.
"""

import ext_common
import torch
from ext_common import MODE
from mmdet3d.registry import MODELS
from mmdet3d.structures import Det3DDataSample
from mmdet3d.structures import LiDARInstance3DBoxes
from mmdet3d.utils import register_all_modules
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData


register_all_modules()
if ext_common.SERVED:
    ext_common.use_served_kernels()
else:
    ext_common.use_dense_sparse_conv()

RANGE = [0.0, -8.0, -3.0, 12.8, 8.0, 1.0]
VOXEL = [0.2, 0.2, 0.1]  # grid 64 x 80 x 40 (x, y, z)
focal = dict(type="mmdet.FocalLoss", use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0)
assigner = dict(
    type="Max3DIoUAssigner",
    iou_calculator=dict(type="BboxOverlapsNearest3D"),
    pos_iou_thr=0.6,
    neg_iou_thr=0.45,
    min_pos_iou=0.45,
    ignore_iof_thr=-1,
)
cfg = dict(
    type="VoxelNet",
    data_preprocessor=dict(
        type="Det3DDataPreprocessor",
        voxel=True,
        voxel_layer=dict(
            max_num_points=5, point_cloud_range=RANGE, voxel_size=VOXEL, max_voxels=(4000, 4000)
        ),
    ),
    voxel_encoder=dict(type="HardSimpleVFE"),
    middle_encoder=dict(
        type="SparseEncoder",
        in_channels=4,
        sparse_shape=[41, 80, 64],
        order=("conv", "norm", "act"),
        base_channels=8,
        output_channels=16,
        encoder_channels=((8,), (16, 16, 16), (16, 16, 16), (16, 16, 16)),
    ),
    backbone=dict(
        type="SECOND",
        in_channels=32,
        layer_nums=[1, 1],
        layer_strides=[1, 2],
        out_channels=[16, 32],
    ),
    neck=dict(
        type="SECONDFPN", in_channels=[16, 32], upsample_strides=[1, 2], out_channels=[16, 16]
    ),
    bbox_head=dict(
        type="Anchor3DHead",
        num_classes=1,
        in_channels=32,
        feat_channels=32,
        use_direction_classifier=True,
        anchor_generator=dict(
            type="Anchor3DRangeGenerator",
            ranges=[[0, -8.0, -1.78, 12.8, 8.0, -1.78]],
            sizes=[[3.9, 1.6, 1.56]],
            rotations=[0, 1.57],
            reshape_out=False,
        ),
        diff_rad_by_sin=True,
        bbox_coder=dict(type="DeltaXYZWLHRBBoxCoder"),
        loss_cls=focal,
        loss_bbox=dict(type="mmdet.SmoothL1Loss", beta=1.0 / 9.0, loss_weight=2.0),
        loss_dir=dict(type="mmdet.CrossEntropyLoss", use_sigmoid=False, loss_weight=0.2),
    ),
    train_cfg=dict(assigner=[assigner], allowed_border=0, pos_weight=-1, debug=False),
    # mmcv's rotated BEV NMS (nms_bev) calls _ext.nms_rotated, which the provider
    # does not implement; the axis-aligned one (nms_normal_bev) calls _ext.nms.
    test_cfg=dict(
        use_rotate_nms=False,
        nms_across_levels=False,
        nms_thr=0.01,
        score_thr=0.0,
        min_bbox_size=0,
        nms_pre=100,
        max_num=50,
    ),
)
model = MODELS.build(ConfigDict(cfg))
model.init_weights()


def make_inputs():
    low, high = torch.tensor(RANGE[:3]), torch.tensor(RANGE[3:])
    clouds = []
    for count in (3000, 2500):
        xyz = low + torch.rand(count, 3) * (high - low)
        # A few points exactly on voxel boundaries and some outside the range.
        xyz[:50] = torch.round(xyz[:50] / 0.2) * 0.2
        xyz[50:80, 0] += 20.0
        clouds.append(torch.cat([xyz, torch.rand(count, 1)], 1))
    boxes = [
        torch.tensor([[5.0, 0.0, -1.0, 3.9, 1.6, 1.56, 0.3], [9.0, 4.0, -1.0, 4.2, 1.7, 1.5, 1.7]]),
        torch.tensor([[3.0, -4.0, -1.2, 3.8, 1.6, 1.5, -0.4]]),
    ]
    return {"points": clouds, "boxes": boxes}


def samples(inputs):
    out = []
    for boxes in inputs["boxes"]:
        s = Det3DDataSample(metainfo=dict(box_type_3d=LiDARInstance3DBoxes))
        s.gt_instances_3d = InstanceData(
            bboxes_3d=LiDARInstance3DBoxes(boxes),
            labels_3d=torch.zeros(len(boxes), dtype=torch.long),
        )
        out.append(s)
    return out


inputs = ext_common.init_state(model, make_inputs)
outputs = ext_common.capture(
    {"middle_encoder": model.middle_encoder, "neck": model.neck, "bbox_head": model.bbox_head}
)
# Registered after capture(): the captured output is the module's own.
ext_common.pin(model.middle_encoder, "middle_encoder")
model.train()
data = model.data_preprocessor(
    dict(inputs=dict(points=inputs["points"]), data_samples=samples(inputs)), True
)
voxels = data["inputs"]["voxels"]
outputs["voxels"] = [voxels["voxels"], voxels["num_points"], voxels["coors"]]
losses = model.loss(data["inputs"], data["data_samples"])
loss = sum(sum(v) if isinstance(v, list) else v for k, v in losses.items() if "loss" in k)
loss.backward()
outputs = {name: list(seen) for name, seen in outputs.items()}  # the training pass's
extra = {}
if MODE == "served":  # not pinned: the pin holds one forward's values
    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(
            dict(inputs=dict(points=inputs["points"]), data_samples=samples(inputs)), False
        )
        results = model.predict(batch["inputs"], batch["data_samples"])
    extra["predicted"] = [len(r.pred_instances_3d.bboxes_3d) for r in results]
ext_common.save(model, losses, outputs, extra)
print("loss", float(loss.detach()), "served", ext_common.ext_record()["served"], extra)
