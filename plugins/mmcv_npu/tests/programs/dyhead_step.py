"""mmdet's DyHead neck: one forward and backward pass, CUDA-style (issue 22, item 13).

Run by plugins/mmcv_npu/tests/test_mmdet_models_emulated.py, as
``ascend-patch run [--emulate-npu] dyhead_step.py DEVICE CHANNELS OUT`` (``cpu`` without
the emulator for the reference, ``cuda`` with it). DyHead runs its modulated
deformable convolutions on neighbouring levels with the offsets of the current one
(``spatial_conv_high`` on the next, smaller level; ``spatial_conv_low`` with stride 2
on the previous one); under the emulator that used to fail with
``npu_deformable_conv2d: offset shape (2, 27, 16, 16) must be (2, 27, 8, 8)``.

DyHead initialises its offset convolution to zeros, where every offset is 0 and the
question of how an offset of another size is read never comes up; the program draws
those weights at random so that it does. It draws every bias too: DyHead's zero biases
put the ReLUs of its attention branches exactly at their kink (a global average of a
group-normalised map is the norm's bias, 0, plus rounding), where the sign of a 1e-9
rounding difference decides the gradient and no two kernels could be compared. Saves
the outputs and the gradients of the inputs and of every parameter to ``OUT``.
"""

import sys

import torch
from mmdet.models.necks import DyHead


device, channels, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
neck = DyHead(in_channels=channels, out_channels=channels, num_blocks=2)
for module in neck.modules():
    if hasattr(module, "spatial_conv_offset"):
        torch.nn.init.normal_(module.spatial_conv_offset.weight, std=0.1)
for name, parameter in neck.named_parameters():
    if name.endswith("bias"):
        torch.nn.init.normal_(parameter, std=0.5)
features = [torch.randn(2, channels, size, size) for size in (16, 8, 4)]
cotangents = [torch.randn(2, channels, size, size) for size in (16, 8, 4)]

neck = neck.to(device)
inputs = [f.to(device).requires_grad_() for f in features]
outputs = neck(inputs)
loss = sum((o * c.to(device)).sum() for o, c in zip(outputs, cotangents, strict=True))
loss.backward()
torch.save(
    {
        "outputs": [o.detach().cpu() for o in outputs],
        "input_grads": [i.grad.cpu() for i in inputs],
        "param_grads": {n: p.grad.cpu() for n, p in neck.named_parameters() if p.grad is not None},
    },
    out,
)
print("loss", float(loss))
