"""What the ``mmcv._ext`` end-to-end programs share (plugins/mmcv_npu/tests/test_ext_end_to_end.py).

Each program runs one tiny model in one of two modes, on CPU tensors, with
``ascend_patch_core.apply()`` first (as a user's program would):

* ``reference``: mmcv 2.1.0 with its compiled ``mmcv._ext``. Where that build has no
  CPU kernel, the layer runs through a real reference instead: mmcv's and mmdet's own
  pure-PyTorch code (ms_deform_attn, sigmoid focal loss: they take those paths on CPU
  by themselves) and, for sparse convolution, the same layer computed densely by torch
  (:func:`use_dense_sparse_conv`).
* ``served``: the same mmcv package copied without its compiled ``_ext*.so``, so the
  plugin serves ``mmcv._ext``; the layers without a CPU kernel in mmcv are sent through
  the served functions (:func:`use_served_kernels`), which is what they call on a
  device.

``served_pinned`` is ``served`` with one module's output replaced by the reference
run's (straight through: its gradient still flows back), to compare the backward
passes on the same forward values (the programs say which module).

Usage: ``python <program> reference|served|served_pinned OUT_DIR``. The reference run writes the
initial weights and the inputs to ``OUT_DIR/init.pt``; the served run loads them, so
both sides start from the same numbers whatever their random streams. Results go to
``OUT_DIR/<mode>.pt``: the losses, captured module outputs, every gradient, and what
served ``mmcv._ext``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import ascend_patch_core


ascend_patch_core.apply()
torch.set_num_threads(1)
torch.manual_seed(0)

MODE, OUT = sys.argv[1], Path(sys.argv[2])
#: Calls of the layers routed to the served module (use_served_kernels).
ROUTED: dict[str, int] = {"ms_deform_attn": 0, "sigmoid_focal_loss": 0}
assert MODE in ("reference", "served", "served_pinned"), MODE
SERVED = MODE != "reference"


def ext_record() -> dict:
    """Which mmcv and which ``mmcv._ext`` this process uses."""
    import mmcv
    import mmcv._ext as ext

    provider = getattr(ext, "__ascend_patch_provider__", None)
    return {
        "mmcv": mmcv.__file__,
        "ext_file": getattr(ext, "__file__", None),
        "served": provider is not None,
        "implemented": len(provider["implemented"]) if provider else None,
    }


def use_served_kernels() -> None:
    """Send the CPU fallbacks of ms_deform_attn and sigmoid focal loss to ``mmcv._ext``.

    On CPU tensors mmcv's MultiScaleDeformableAttention and mmdet's FocalLoss compute
    in pure PyTorch (their device kernels need CUDA tensors); the served module's
    ms_deform_attn_* and sigmoid_focal_loss_* are what those layers call on a device,
    so the served run routes them there (through mmcv's own autograd Functions).
    """
    import mmcv.ops.multi_scale_deform_attn as msda
    import mmdet.models.losses.focal_loss as focal

    def deformable_attention(value, spatial_shapes, sampling_locations, attention_weights):
        ROUTED["ms_deform_attn"] += 1
        starts = torch.cat((spatial_shapes.new_zeros(1), spatial_shapes.prod(1).cumsum(0)[:-1]))
        return msda.MultiScaleDeformableAttnFunction.apply(
            value, spatial_shapes, starts, sampling_locations, attention_weights, 64
        )

    def sigmoid_focal(pred, target, weight=None, gamma=2.0, alpha=0.25, reduction="mean",
                      avg_factor=None):  # fmt: skip
        # mmdet made ``target`` one-hot from labels (background: an all-zero row).
        ROUTED["sigmoid_focal_loss"] += 1
        labels = torch.where(target.sum(1) > 0, target.argmax(1), pred.size(1))
        return focal.sigmoid_focal_loss(pred, labels, weight, gamma, alpha, reduction, avg_factor)

    msda.multi_scale_deformable_attn_pytorch = deformable_attention
    focal.py_sigmoid_focal_loss = sigmoid_focal


def use_dense_sparse_conv() -> None:
    """mmcv's sparse convolutions computed densely by torch (the compiled CPU build has none).

    A layer's output sites are mmcv's: the input sites for a submanifold convolution,
    every site whose window holds an input site otherwise; their features are
    ``F.conv3d`` of the densified input read at those sites. Sites may come in another
    row order than mmcv's indice pairs give; what follows (batch norm over rows,
    submanifold layers, ``dense()``) does not depend on it.
    """
    from mmcv.ops import sparse_conv
    from mmcv.ops.sparse_structure import SparseConvTensor

    def forward(self, input):
        assert not (self.transposed or self.inverse), "not used by the models here"
        dense = input.dense()
        weight = self.weight.permute(4, 3, 0, 1, 2)  # [k.., in, out] -> [out, in, k..]
        if self.subm:
            padding = [k // 2 * d for k, d in zip(self.kernel_size, self.dilation, strict=True)]
            out = F.conv3d(dense, weight, self.bias, 1, padding, self.dilation)
            sites = input.indices.long()
            shape = input.spatial_shape
        else:
            args = (self.stride, self.padding, self.dilation)
            out = F.conv3d(dense, weight, self.bias, *args)
            occupied = dense.new_zeros(dense.shape[0], 1, *dense.shape[2:])
            at = input.indices.long()
            occupied[at[:, 0], 0, at[:, 1], at[:, 2], at[:, 3]] = 1
            hit = F.conv3d(occupied, torch.ones(1, 1, *self.kernel_size), None, *args)
            sites = hit[:, 0].nonzero()
            shape = list(out.shape[2:])
        features = out[sites[:, 0], :, sites[:, 1], sites[:, 2], sites[:, 3]]
        return SparseConvTensor(features, sites.int(), shape, input.batch_size)

    sparse_conv.SparseConvolution.forward = forward


def capture(modules: dict[str, torch.nn.Module]) -> dict[str, list[torch.Tensor]]:
    """Forward hooks keeping each module's (first) output tensor, per call."""
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in modules}

    def hook(name):
        def keep(module, args, output):
            while isinstance(output, (tuple, list)):
                output = output[0]
            seen[name].append(output.detach().clone())

        return keep

    for name, module in modules.items():
        module.register_forward_hook(hook(name))
    return seen


def pin(module: torch.nn.Module, name: str) -> None:
    """In ``served_pinned`` mode: ``module`` outputs the reference run's values (straight through)."""
    if MODE != "served_pinned":
        return
    reference = iter(torch.load(OUT / "reference.pt", weights_only=False)["outputs"][name])

    def replace(module, args, output):
        return output + (next(reference) - output).detach()

    module.register_forward_hook(replace)


def init_state(model: torch.nn.Module, make_inputs) -> object:
    """Weights and inputs: made and saved by the reference run, loaded by the served run."""
    path = OUT / "init.pt"
    if MODE == "reference":
        inputs = make_inputs()
        torch.save({"state": model.state_dict(), "inputs": inputs}, path)
    else:
        saved = torch.load(path, weights_only=False)
        model.load_state_dict(saved["state"])
        inputs = saved["inputs"]
    torch.manual_seed(1)  # the same dropout masks on both sides
    return inputs


def _total(value) -> torch.Tensor:
    if isinstance(value, (list, tuple)):
        return sum(_total(v) for v in value)
    return torch.as_tensor(value).detach().double().sum()


def save(model: torch.nn.Module, losses: dict, outputs: dict, extra: dict | None = None) -> None:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    result = {
        "losses": {k: _total(v) for k, v in losses.items()},
        "outputs": outputs,
        "grads": grads,
        "ext": ext_record(),
        "routed": dict(ROUTED),
        **(extra or {}),
    }
    torch.save(result, OUT / f"{MODE}.pt")
