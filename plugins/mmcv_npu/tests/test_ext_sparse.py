"""mmcv's sparse convolutions on mmcv-lite: the provider's ``_ext`` sparse functions.

In a subprocess (the served ``mmcv.ops`` must not leak into other tests), after
``apply()``: mmcv's own ``SubMConv3d`` and ``SparseConv3d`` (stride 2, padding 1) run
forward and backward on CPU tensors through ``mmcv._ext``'s ``get_indice_pairs_3d_forward``,
``indice_conv_forward`` and ``indice_conv_backward`` as the provider serves them, and are
compared with the same layers computed densely by torch (``F.conv3d`` on the densified
grid, read at the output sites; the output sites of the strided conv are where the dense
conv of the occupancy is non-zero). mmcv's compiled CPU build has no sparse kernels at
all, so a dense torch computation is the reference. Runs in ``openmmlab_emulated``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from mmcv_stacks import require_stack


require_stack("mmcv-lite")

PROGRAM = textwrap.dedent(
    """
    import ascend_patch_core
    ascend_patch_core.apply()
    import torch
    import torch.nn.functional as F
    from mmcv.ops import SparseConv3d, SparseConvTensor, SubMConv3d

    torch.manual_seed(0)
    shape, batch = (6, 7, 5), 2
    flat = torch.randperm(batch * 6 * 7 * 5)[:40]
    b, rest = flat // (6 * 7 * 5), flat % (6 * 7 * 5)
    z, y, x = rest // 35, (rest // 5) % 7, rest % 5
    indices = torch.stack((b, z, y, x), 1).int()
    features = torch.randn(40, 3, requires_grad=True)

    def dense(feats, idx, shape):
        grid = torch.zeros(batch, feats.shape[1], *shape)
        grid[idx[:, 0].long(), :, idx[:, 1].long(), idx[:, 2].long(), idx[:, 3].long()] = feats
        return grid

    def read(grid, idx):
        return grid[idx[:, 0].long(), :, idx[:, 1].long(), idx[:, 2].long(), idx[:, 3].long()]

    worst = 0.0
    for layer in (SubMConv3d(3, 4, 3, indice_key="s"), SparseConv3d(3, 4, 3, 2, 1)):
        out = layer(SparseConvTensor(features, indices, list(shape), batch))
        weight = layer.weight.permute(4, 3, 0, 1, 2)  # [k, k, k, in, out] -> [out, in, k, k, k]
        stride, padding = (1, 1) if isinstance(layer, SubMConv3d) else (2, 1)
        grid = F.conv3d(dense(features, indices, shape), weight, layer.bias, stride, padding)
        if isinstance(layer, SparseConv3d):
            occupied = F.conv3d(dense(torch.ones(40, 1), indices, shape), torch.ones(1, 1, 3, 3, 3), None, 2, 1)
            sites = torch.nonzero(occupied[:, 0] > 0).int()
            got = sorted(map(tuple, out.indices.tolist()))
            assert got == sorted(map(tuple, sites.tolist())), "output sites"
        expected = read(grid, out.indices)
        worst = max(worst, float((out.features - expected).abs().max()))
        cotangent = torch.randn_like(expected)
        g1 = torch.autograd.grad(out.features, (features, layer.weight), cotangent)
        g2 = torch.autograd.grad(expected, (features, layer.weight), cotangent)
        worst = max(worst, *(float((a - e).abs().max()) for a, e in zip(g1, g2)))
    import mmcv._ext
    print("served", mmcv._ext.__name__, "worst", worst)
    """
)


def test_mmcvs_sparse_layers_run_on_the_served_ext():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.split()
    assert last[:2] == ["served", "mmcv._ext"]
    assert float(last[-1]) < 1e-4
