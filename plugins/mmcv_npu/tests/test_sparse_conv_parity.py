"""SparseConv3D: mmcv's sparse modules on emulated NPU tensors against a dense convolution.

Runs in the nox session ``openmmlab_cpu_ops`` (mmcv 2.1.0 with its compiled ops).
mmcv has no CPU kernel for its sparse convolutions, so the oracle is torch itself:
the features are put on the dense grid and ``F.conv3d`` / ``F.conv_transpose3d`` /
``F.max_pool3d`` (-inf on empty sites, then mmcv's floor at 0) compute every site;
the values are read at the output sites of the patched module. The active output set
of a regular (or transposed) convolution must be where the dense convolution of the
occupancy is non-zero; a submanifold one keeps the input sites; an inverse one
returns to the sites of the convolution that shares its ``indice_key``. Forward values
and gradients (features and weights) are compared in float32 with 1e-4 absolute and
relative tolerance. The numbers show that the replacement computes what mmcv's
layers define; nothing about NPU speed (emulated).
"""

from __future__ import annotations

import math

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.groups import SparseConv3D  # noqa: E402


TOL = {"atol": 1e-4, "rtol": 1e-4}
SHAPE = [9, 8, 7]
CONV_OPS = "mmcv.ops.sparse_ops:indice_conv"


@pytest.fixture
def patched(npu_emulator, isolated_patcher):
    _kernel_source.forget_choices()
    isolated_patcher.add(SparseConv3D).apply()
    yield isolated_patcher
    _kernel_source.forget_choices()


# ------------------------------------------------------------------------ dense reference


def _sites(batch, count, seed, shape=SHAPE):
    """``count`` distinct active sites over ``batch`` samples; 2 means two far-apart ones."""
    if count == 2:
        return torch.tensor([[0, 0, 0, 0], [batch - 1, *(s - 1 for s in shape)]], dtype=torch.int32)
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randperm(batch * math.prod(shape), generator=generator)[:count]
    columns = []
    for size in reversed(shape):
        columns.append(keys % size)
        keys = keys // size
    columns.append(keys)
    return torch.stack(columns[::-1], dim=1).to(torch.int32)


def _dense(features, indices, batch, shape, fill=0.0):
    grid = features.new_full((batch, *shape, features.shape[1]), fill)
    grid = grid.index_put(tuple(indices.long().t()), features)
    return grid.permute(0, 4, 1, 2, 3)


def _read(grid, indices):
    rows = indices.long()
    return grid[rows[:, 0], :, rows[:, 1], rows[:, 2], rows[:, 3]]


def _pad_to(grid, low, needed, value=0.0):
    """Pad each spatial dim ``low`` before and so that ``needed`` sites exist after."""
    pads = []
    for lo, need, have in zip(low, needed, grid.shape[2:], strict=True):
        pads = [lo, max(0, need - have - lo), *pads]
    return F.pad(grid, pads, value=value)


def _conv(grid, weight, ks, stride, pad, dil, out_shape):
    """out[o] = sum_k weight[k] in[o * stride - pad + k * dil] (mmcv's regular and subm)."""
    needed = [
        (o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out_shape, stride, ks, dil, strict=True)
    ]
    result = F.conv3d(
        _pad_to(grid, pad, needed), weight.permute(4, 3, 0, 1, 2), stride=stride, dilation=dil
    )
    return result[:, :, : out_shape[0], : out_shape[1], : out_shape[2]]


def _conv_transposed(grid, weight, stride, pad, dil, out_shape):
    """out[x * stride - pad + k * dil] += weight[k] in[x] (transposed and inverse convs)."""
    full = F.conv_transpose3d(grid, weight.permute(3, 4, 0, 1, 2), stride=stride, dilation=dil)
    full = _pad_to(full, [0, 0, 0], [p + o for p, o in zip(pad, out_shape, strict=True)])
    return full[:, :, pad[0] : pad[0] + out_shape[0], pad[1] : pad[1] + out_shape[1]][
        ..., pad[2] : pad[2] + out_shape[2]
    ]


def _max_pool(grid, ks, stride, pad, dil, out_shape):
    needed = [
        (o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out_shape, stride, ks, dil, strict=True)
    ]
    padded = _pad_to(grid, pad, needed, value=-math.inf)
    pooled = F.max_pool3d(padded, ks, stride=stride, dilation=dil)
    # mmcv's sparse max-pool starts from 0.
    return pooled[:, :, : out_shape[0], : out_shape[1], : out_shape[2]].clamp_min(0)


def _active(mask_grid):
    return {tuple(r) for r in (mask_grid[:, 0] > 0).nonzero().tolist()}


def _out_size(shape, ks, stride, pad, dil):
    return [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(shape, ks, stride, pad, dil, strict=True)
    ]


def _triple(value):
    return list(value) if isinstance(value, (list, tuple)) else [value] * 3


class Dense:
    """Runs mmcv sparse modules' definitions densely, tracking the active sites."""

    def __init__(self, features, indices, batch, shape=SHAPE):
        self.grid = _dense(features, indices, batch, shape)
        self.mask = _dense(torch.ones(len(indices), 1), indices, batch, shape)
        self.indices, self.shape, self.batch = indices, list(shape), batch
        self.saved: dict = {}

    def apply(self, module):
        from mmcv.ops import SparseInverseConv3d
        from mmcv.ops import SparseMaxPool3d
        from mmcv.ops import SubMConv3d

        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            # Evaluation mode: a per-channel affine map, the same on any layout.
            assert not module.training
            self.grid = F.batch_norm(
                self.grid,
                module.running_mean,
                module.running_var,
                module.weight,
                module.bias,
                False,
                0.0,
                module.eps,
            )
            self.grid = self.grid * (self.mask > 0)
            return
        if isinstance(module, torch.nn.Module) and not hasattr(module, "kernel_size"):
            self.grid = module(self.grid)
            self.grid = self.grid * (self.mask > 0)
            return
        ks, dil = _triple(module.kernel_size), _triple(module.dilation)
        if isinstance(module, SparseMaxPool3d):
            stride, pad = _triple(module.stride), _triple(module.padding)
            out = _out_size(self.shape, ks, stride, pad, dil)
            self.grid = _max_pool(self._masked(-math.inf), ks, stride, pad, dil, out)
            self.mask = _conv(self.mask, torch.ones(*ks, 1, 1), ks, stride, pad, dil, out)
            self.shape = out
        elif isinstance(module, SubMConv3d):
            pad = [k // 2 for k in ks]
            self.grid = _conv(self.grid, module.weight, ks, [1] * 3, pad, dil, self.shape)
        elif isinstance(module, SparseInverseConv3d):
            mask, shape, stride, pad, dil = self.saved[module.indice_key]
            self.grid = _conv_transposed(self.grid, module.weight, stride, pad, dil, shape)
            self.mask, self.shape = mask, shape
        elif module.transposed:
            stride, pad = _triple(module.stride), _triple(module.padding)
            out = [
                (n - 1) * s - 2 * p + k
                for n, k, s, p in zip(self.shape, ks, stride, pad, strict=True)
            ]
            self.grid = _conv_transposed(self.grid, module.weight, stride, pad, dil, out)
            self.mask = _conv_transposed(self.mask, torch.ones(*ks, 1, 1), stride, pad, dil, out)
            self.shape = out
        else:
            stride, pad = _triple(module.stride), _triple(module.padding)
            out = _out_size(self.shape, ks, stride, pad, dil)
            if module.indice_key is not None:
                self.saved[module.indice_key] = (self.mask, self.shape, stride, pad, dil)
            self.grid = _conv(self.grid, module.weight, ks, stride, pad, dil, out)
            self.mask = _conv(self.mask, torch.ones(*ks, 1, 1), ks, stride, pad, dil, out)
            self.shape = out
        if getattr(module, "bias", None) is not None:
            self.grid = self.grid + module.bias.view(1, -1, 1, 1, 1)
        self.grid = self.grid * (self.mask > 0)

    def _masked(self, fill):
        return torch.where(self.mask > 0, self.grid, torch.full_like(self.grid, fill))


# ------------------------------------------------------------------------------- scenarios


def _scenario(name, cin=3):
    """The modules of one scenario (built on the CPU with the random seed the caller set)."""
    from mmcv.ops import SparseConv3d
    from mmcv.ops import SparseConvTranspose3d
    from mmcv.ops import SparseInverseConv3d
    from mmcv.ops import SparseMaxPool3d
    from mmcv.ops import SubMConv3d

    return {
        "subm": [SubMConv3d(cin, 4, 3, indice_key="subm1")],
        "subm_5x3x1_no_bias": [SubMConv3d(cin, 4, (5, 3, 1), bias=False)],
        "stride2_pad1": [SparseConv3d(cin, 4, 3, stride=2, padding=1)],
        "stride_mixed": [SparseConv3d(cin, 4, (3, 2, 3), stride=(2, 1, 3), padding=(1, 0, 1))],
        "dilation2": [SparseConv3d(cin, 4, 3, padding=1, dilation=2)],
        "transposed": [SparseConvTranspose3d(cin, 4, 3, stride=2, padding=1)],
        "inverse": [
            SparseConv3d(cin, 5, 3, stride=2, padding=1, indice_key="down1"),
            SparseInverseConv3d(5, 4, 3, indice_key="down1"),
        ],
        "maxpool": [SparseMaxPool3d(3, stride=2, padding=1)],
        "maxpool_subm_after": [
            SparseMaxPool3d(2, stride=2),
            SubMConv3d(cin, 4, 3, indice_key="after"),
        ],
        "unet": [
            SubMConv3d(cin, 6, 3, indice_key="subm1"),
            torch.nn.ReLU(),
            SubMConv3d(6, 6, 3, indice_key="subm1"),
            SparseConv3d(6, 8, 3, stride=2, padding=1, indice_key="down1"),
            torch.nn.ReLU(),
            SubMConv3d(8, 8, 3, indice_key="subm2"),
            SparseInverseConv3d(8, 4, 3, indice_key="down1"),
        ],
    }[name]


SCENARIOS = [
    "subm",
    "subm_5x3x1_no_bias",
    "stride2_pad1",
    "stride_mixed",
    "dilation2",
    "transposed",
    "inverse",
    "maxpool",
    "maxpool_subm_after",
    "unet",
]


@pytest.mark.parametrize("count", [1, 2, 60], ids=["one_site", "two_far_sites", "sites60"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sparse_modules_match_the_dense_definition(patched, scenario, batch, count):
    from mmcv.ops import SparseConvTensor
    from mmcv.ops import SparseSequential

    torch.manual_seed(len(scenario) + count)
    modules = _scenario(scenario)
    indices = _sites(batch, count, seed=count + batch)
    features = torch.randn(len(indices), 3)

    # The dense reference first, on leaves of its own; its cotangent lives on the grid.
    ref_features = features.clone().requires_grad_(True)
    dense = Dense(ref_features, indices, batch)
    for module in modules:
        dense.apply(module)
    cotangent = torch.randn(dense.grid.shape)
    (dense.grid * cotangent).sum().backward()
    weights = [p for m in modules for p in m.parameters()]
    ref_grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in weights]
    for p in weights:
        p.grad = None

    net = SparseSequential(*modules).to("npu")
    npu_features = features.clone().to("npu").requires_grad_(True)
    out = net(SparseConvTensor(npu_features, indices.to("npu"), SHAPE, batch))

    assert {tuple(r) for r in out.indices.tolist()} == _active(dense.mask)
    assert len(out.indices) == len(_active(dense.mask))
    out_sites = out.indices.cpu()
    torch.testing.assert_close(out.features.cpu(), _read(dense.grid.detach(), out_sites), **TOL)
    out.features.backward(_read(cotangent, out_sites).to("npu"))
    torch.testing.assert_close(npu_features.grad.cpu(), ref_features.grad, **TOL)
    for index, (p, ref) in enumerate(zip(weights, ref_grads, strict=True)):
        got = torch.zeros_like(p) if p.grad is None else p.grad
        torch.testing.assert_close(got.cpu(), ref, **TOL, msg=lambda m, i=index: f"param {i}: {m}")

    report = patched.report
    pairs = report.get("mmcv.ops.sparse_ops:get_indice_pairs").counters.replacement_calls
    pairs += report.get("mmcv.ops.sparse_pool:get_indice_pairs").counters.replacement_calls
    assert pairs > 0
    assert report.get(CONV_OPS).note == "kernel: portable"


def test_cpu_tensors_go_to_mmcv_without_an_npu(isolated_patcher):
    # No emulator: no tensor is an NPU tensor, so mmcv's own code runs (and, having no
    # CPU kernel, says so).
    from mmcv.ops import SparseConvTensor
    from mmcv.ops import SubMConv3d

    _kernel_source.forget_choices()
    isolated_patcher.add(SparseConv3D).apply()
    indices = _sites(1, 5, seed=0)
    with pytest.raises(RuntimeError, match="not implemented on CPU"):
        SubMConv3d(3, 4, 3)(SparseConvTensor(torch.randn(5, 3), indices, SHAPE, 1))
    counters = isolated_patcher.report.get("mmcv.ops.sparse_ops:get_indice_pairs").counters
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 1)
    _kernel_source.forget_choices()


def test_fused_indice_conv_adds_the_bias(patched):
    # mmcv's Python wrapper of this op breaks on float32 (``filters.dtypes``); the
    # replacement computes the fused convolution: the convolution plus its bias.
    from mmcv.ops import sparse_ops

    indices = _sites(2, 40, seed=3)
    features, weight, bias = torch.randn(40, 3), torch.randn(3, 3, 3, 3, 4), torch.randn(4)
    for subm in (False, True):
        outids, pairs, num = sparse_ops.get_indice_pairs(indices, 2, SHAPE, 3, 2, 1, subm=subm)
        plain = sparse_ops.indice_conv(features, weight, pairs, num, len(outids), False, subm)
        fused = sparse_ops.fused_indice_conv(
            features, weight, bias, pairs, num, len(outids), False, subm
        )
        torch.testing.assert_close(fused, plain + bias)


# ------------------------------------------------------------------------------ mmdet3d


# z, y, x: SECOND's last convolution halves z once more with a (3, 1, 1) kernel.
ENCODER_SHAPE = [21, 8, 8]


def _sparse_encoder():
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules

    register_all_modules(init_default_scope=False)
    # A small SECOND middle encoder: the mmdet3d 1.4.0 layout with fewer channels.
    return MODELS.build(
        {
            "type": "SparseEncoder",
            "in_channels": 3,
            "sparse_shape": ENCODER_SHAPE,
            "order": ("conv", "norm", "act"),
            "base_channels": 4,
            "output_channels": 8,
            "encoder_channels": ((4,), (6, 6), (8, 8)),
            "encoder_paddings": ((1,), (1, 1), ((0, 1, 1), 1)),
            "block_type": "conv_module",
        }
    )


def _leaf_modules(module):
    from mmcv.ops import SparseModule

    for child in module.children():
        if isinstance(child, SparseModule) and not list(child.children()):
            yield child
        elif list(child.children()):
            yield from _leaf_modules(child)
        else:
            yield child


@pytest.mark.parametrize("batch", [1, 2])
def test_mmdet3d_sparse_encoder_matches_the_dense_definition(patched, batch):
    from mmcv_stacks import require_module

    require_module("mmdet3d")
    torch.manual_seed(batch)
    encoder = _sparse_encoder()
    for module in encoder.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.5, 0.5)
    encoder.eval()
    indices = _sites(batch, 150, seed=batch, shape=ENCODER_SHAPE)
    features = torch.randn(len(indices), 3)

    ref_features = features.clone().requires_grad_(True)
    dense = Dense(ref_features, indices, batch, ENCODER_SHAPE)
    for module in _leaf_modules(encoder):
        dense.apply(module)
    n, c, d, h, w = dense.grid.shape
    expected = dense.grid.reshape(n, c * d, h, w)
    cotangent = torch.randn(expected.shape)
    (expected * cotangent).sum().backward()
    weights = list(encoder.parameters())
    ref_grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in weights]
    encoder.zero_grad(set_to_none=True)

    encoder.to("npu")
    npu_features = features.clone().to("npu").requires_grad_(True)
    spatial = encoder(npu_features, indices.to("npu"), batch)
    torch.testing.assert_close(spatial.cpu(), expected.detach(), **TOL)
    (spatial * cotangent.to("npu")).sum().backward()
    torch.testing.assert_close(npu_features.grad.cpu(), ref_features.grad, **TOL)
    for index, (p, ref) in enumerate(zip(weights, ref_grads, strict=True)):
        got = torch.zeros_like(p) if p.grad is None else p.grad
        torch.testing.assert_close(got.cpu(), ref, **TOL, msg=lambda m, i=index: f"param {i}: {m}")

    # Training mode too (batch statistics): it runs, and the replacements served it.
    encoder.train()
    encoder(npu_features, indices.to("npu"), batch).sum().backward()
    report = patched.report
    for op in ("get_indice_pairs", "indice_conv", "indice_conv_backward"):
        assert report.get(f"mmcv.ops.sparse_ops:{op}").counters.replacement_calls > 0, op
