"""A TridentNet-style model: one training forward and backward pass, CUDA-style (issue 22, item 13).

Run by plugins/mmcv_npu/tests/test_mmdet_models_emulated.py, as
``ascend-patch run [--emulate-npu] trident_roi_step.py DEVICE OUT`` (``cpu`` without the
emulator for the reference, ``cuda`` with it).

What TridentNet's training step does, at a small width: mmdet's ``TridentResNet``
(three branches sharing weights at dilations 1, 2, 3, concatenated along the batch),
then mmcv's ``RoIAlign`` (14x14, adaptive sampling: ``sampling_ratio=0``, as
TridentNet's C4 head) over 128 rois per branch, a small head and a loss. Under the
emulator TridentNet's backward ran > 300 s, this program's 58 s: the RoIAlign
backward (``npu_roi_alignbk``) copied the whole gradient once per roi. Prints the
seconds the backward took (``backward_s``) and saves the loss, the pooled features,
the gradient of the pooled feature map (what ``npu_roi_alignbk`` computes) and the
head's gradients to ``OUT``. Not the backbone's:
this tiny random network has channels that are exactly 0 going into a ReLU (batch
norms' zero betas over dead channels), where a 1e-42 rounding difference between two
runs of the same CPU convolutions decides whether a gradient flows; they differ by
13% of their norm between runs of the same code now and then.
"""

import sys
import time

import mmcv._ext as mmcv_ext
import torch
from mmcv.ops import RoIAlign
from mmdet.models.backbones import TridentResNet


device, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
backbone = TridentResNet(
    depth=50,
    num_branch=3,
    test_branch_idx=1,
    trident_dilations=(1, 2, 3),
    num_stages=3,
    strides=(1, 2, 2),
    dilations=(1, 1, 1),
    out_indices=(2,),
    base_channels=16,
    norm_cfg=dict(type="BN", requires_grad=True),
)
head = torch.nn.Linear(16 * 4 * 4, 5)  # the last stage: base width x expansion x 2**2
pool = RoIAlign(output_size=14, spatial_scale=1 / 16, sampling_ratio=0)
image = torch.randn(1, 3, 128, 128)
corners = torch.rand(128, 4) * 128
boxes = torch.cat(
    [corners[:, :2].minimum(corners[:, 2:]), corners[:, :2].maximum(corners[:, 2:])], 1
)
# One set of rois per branch (the branches are the batch of the concatenated output).
rois = torch.cat([torch.cat([torch.full((128, 1), float(b)), boxes], 1) for b in range(3)])
targets = torch.randint(0, 5, (rois.shape[0],))

backbone, head = backbone.to(device), head.to(device)
backbone.train()  # mmdet's ResNet.train returns None
(features,) = backbone(image.to(device))
features.retain_grad()
pooled = pool(features, rois.to(device))
logits = head(pooled.mean((2, 3)))
loss = torch.nn.functional.cross_entropy(logits, targets.to(device)) + pooled.square().mean()
start = time.perf_counter()
loss.backward()
print("backward_s", time.perf_counter() - start)
# What the test needs to know the run meant something: whether the plugin serves
# mmcv._ext (mmcv-lite: its roi_align calls torch_npu's npu_roi_align on NPU tensors)
# and whether the pooled features are NPU tensors.
print("served_ext", hasattr(mmcv_ext, "__ascend_patch_provider__"))
print("on_npu", getattr(pooled, "is_npu", False) is True)
torch.save(
    {
        "loss": loss.detach().cpu(),
        "pooled": pooled.detach().cpu(),
        "feature_grad": features.grad.cpu(),
        "param_grads": {name: p.grad.cpu() for name, p in head.named_parameters()},
    },
    out,
)
print("loss", float(loss))
