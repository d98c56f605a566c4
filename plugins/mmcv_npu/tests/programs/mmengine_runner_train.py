"""An mmengine Runner trains a small model built on mmcv's ops (deformable attention and
a modulated deformable convolution): iteration-based, 20 iterations asked for.

Run by plugins/mmcv_npu/tests/test_end_to_end.py under ``ascend-patch run --emulate-npu
--brake-at 3``: the brake stops training after 3 steps. Unmodified: mmengine picks the
device itself.
"""

import tempfile

import torch
from mmcv.ops import ModulatedDeformConv2dPack
from mmcv.ops import MultiScaleDeformableAttention
from mmengine.model import BaseModel
from mmengine.runner import Runner


class TinyDeformable(BaseModel):
    def __init__(self):
        super().__init__()
        self.conv = ModulatedDeformConv2dPack(64, 64, 3, padding=1)  # in mx_driving's domain
        self.attn = MultiScaleDeformableAttention(
            embed_dims=64, num_heads=2, num_levels=1, num_points=2, batch_first=True
        )
        self.head = torch.nn.Linear(64, 1)

    def forward(self, inputs, targets, mode="loss"):
        # mmengine's default collate hands over lists of samples.
        inputs, targets = torch.stack(inputs), torch.stack(targets)
        features = self.conv(inputs)  # [B, 64, 6, 6]
        value = features.flatten(2).transpose(1, 2)  # [B, 36, 64]
        shapes = torch.tensor([[6, 6]], device=inputs.device)
        start = torch.zeros(1, dtype=torch.long, device=inputs.device)
        reference = torch.rand(inputs.shape[0], 4, 1, 2, device=inputs.device)
        query = value[:, :4]
        out = self.attn(
            query,
            value=value,
            reference_points=reference,
            spatial_shapes=shapes,
            level_start_index=start,
        )
        prediction = self.head(out).mean(dim=(1, 2))
        loss = torch.nn.functional.mse_loss(prediction, targets)
        return {"loss": loss} if mode == "loss" else prediction


class RandomData(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return {
            "inputs": torch.rand(64, 6, 6, generator=generator),
            "targets": torch.rand((), generator=generator),
        }


work_dir = tempfile.mkdtemp(prefix="ap-runner-")
runner = Runner(
    model=TinyDeformable(),
    work_dir=work_dir,
    train_dataloader=dict(
        dataset=RandomData(),
        sampler=dict(type="DefaultSampler", shuffle=False),
        batch_size=4,
        num_workers=0,
    ),
    train_cfg=dict(by_epoch=False, max_iters=20),
    optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01), clip_grad=dict(max_norm=1.0)),
    default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1000)),
)
runner.train()
parameter = next(runner.model.parameters())
print("on_npu", getattr(parameter, "is_npu", False), "iterations", runner.iter)
