"""The portable sparse-convolution kernels produce mmcv's index formats exactly.

mmcv's ``get_indice_pairs`` has no CPU kernel, so the oracle here is a line-by-line
Python transcription of its C++ (``getValidOutPos``, ``getValidOutPosTranspose``,
``getIndicePairsConv`` / ``DeConv`` / ``SubM`` in mmcv 1.7.2 and 2.1.0's
``spconv/geometry.h``, C integer division included): the output sites in mmcv's
order, the pair table ``[K, 2, N]`` (unused slots -1) and the counts must be equal
element by element. Only torch is needed; the numbers of whole modules against a
dense convolution are in ``test_sparse_conv_parity.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from ascend_patch_mmcv import sparse_conv_kernels as kernels


def _cdiv(a: int, b: int) -> int:
    """C's integer division (towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _valid_out(pos, ks, stride, pad, dil, out_shape, transpose):
    """mmcv's getValidOutPos / getValidOutPosTranspose: [(out_site, offset)] in its order."""
    ndim = len(pos)
    if transpose:
        lowers = [pos[i] * stride[i] - pad[i] for i in range(ndim)]
        uppers = [lowers[i] + (ks[i] - 1) * dil[i] for i in range(ndim)]
    else:
        lowers = [
            _cdiv(pos[i] - (ks[i] - 1) * dil[i] - 1 + stride[i] + pad[i], stride[i])
            for i in range(ndim)
        ]
        uppers = [_cdiv(pos[i] + pad[i], stride[i]) for i in range(ndim)]
    sizes = [_cdiv(uppers[i] - lowers[i], dil[i]) + 1 for i in range(ndim)]
    found = []
    counter = [0] * ndim
    for _ in range(math.prod(sizes) if all(s > 0 for s in sizes) else 0):
        valid, m, offset, out = True, 1, 0, [0] * ndim
        for j in reversed(range(ndim)):
            val = uppers[j] - counter[j] * dil[j]
            out[j] = val
            if val < 0 or val > out_shape[j] - 1:
                valid = False
            if transpose:
                offset += _cdiv(m * (val - lowers[j]), dil[j])
            else:
                offset += _cdiv(m * (pos[j] - val * stride[j] + pad[j]), dil[j])
            m *= ks[j]
        if valid:
            found.append((tuple(out), offset))
        counter[ndim - 1] += 1
        for c in reversed(range(1, ndim)):
            if counter[c] == sizes[c]:
                counter[c - 1] += 1
                counter[c] = 0
    return found


def _mmcv_pairs(indices, out_shape, ks, stride, pad, dil, subm, transpose):
    """mmcv's getIndicePairsConv / DeConv / SubM, as its C++ loops do it."""
    rows = [list(r) for r in indices.tolist()]
    volume = math.prod(ks)
    if subm:
        stride, pad = [1] * len(ks), [k // 2 for k in ks]
        transpose = False
    pairs = [[[-1] * len(rows) for _ in range(2)] for _ in range(volume)]
    num = [0] * volume
    grid: dict[tuple, int] = {}
    out_rows: list[list[int]] = []
    if subm:
        for j, row in enumerate(rows):
            grid[(row[0], *row[1:])] = j
    for j, row in enumerate(rows):
        for site, offset in _valid_out(row[1:], ks, stride, pad, dil, out_shape, transpose):
            key = (row[0], *site)
            if subm:
                if key not in grid:
                    continue
            elif key not in grid:
                grid[key] = len(out_rows)
                out_rows.append([row[0], *site])
            pairs[offset][0][num[offset]] = j
            pairs[offset][1][num[offset]] = grid[key]
            num[offset] += 1
    outids = indices.tolist() if subm else out_rows
    return outids, pairs, num


def _sites(batch, shape, count, seed, duplicates=0):
    generator = torch.Generator().manual_seed(seed)
    volume = batch * math.prod(shape)
    keys = torch.randperm(volume, generator=generator)[:count]
    keys = torch.cat((keys, keys[:duplicates]))
    columns = []
    for size in reversed(shape):
        columns.append(keys % size)
        keys = keys // size
    columns.append(keys)
    return torch.stack(columns[::-1], dim=1).to(torch.int32)


def _out_shape(shape, ks, stride, pad, dil, out_pad, subm, transpose):
    if subm:
        return list(shape)
    if transpose:
        return [
            (n - 1) * s - 2 * p + k + o
            for n, k, s, p, o in zip(shape, ks, stride, pad, out_pad, strict=True)
        ]
    return [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(shape, ks, stride, pad, dil, strict=True)
    ]


CASES = {
    # name: (shape, kernel, stride, padding, dilation, subm, transpose)
    "subm3": ([6, 5, 7], [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], True, False),
    "subm_dilated": ([6, 5, 7], [3, 3, 3], [1, 1, 1], [0, 0, 0], [2, 1, 2], True, False),
    "subm_even": ([6, 5, 7], [2, 3, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1], True, False),
    "stride2_pad1": ([7, 6, 5], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False, False),
    "stride_mixed": ([9, 6, 5], [3, 1, 2], [2, 1, 3], [1, 0, 1], [1, 1, 1], False, False),
    "dilated": ([8, 7, 6], [3, 2, 3], [1, 1, 1], [2, 0, 1], [2, 1, 3], False, False),
    "kernel1_stride2": ([6, 6, 6], [1, 1, 1], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, False),
    "transposed": ([4, 3, 5], [3, 2, 3], [2, 1, 2], [1, 0, 0], [1, 1, 1], False, True),
    "transposed_dilated": ([4, 3, 5], [3, 3, 2], [1, 1, 1], [1, 0, 2], [2, 1, 1], False, True),
    "two_d": ([9, 8], [3, 3], [2, 2], [1, 1], [1, 1], False, False),
    "two_d_subm": ([9, 8], [5, 3], [1, 1], [0, 0], [1, 1], True, False),
}


@pytest.mark.parametrize("duplicates", [0, 3], ids=["unique", "duplicated_sites"])
@pytest.mark.parametrize("count", [1, 30])
@pytest.mark.parametrize("case", list(CASES))
def test_indice_pairs_equal_mmcvs_algorithm(case, count, duplicates):
    shape, ks, stride, pad, dil, subm, transpose = CASES[case]
    indices = _sites(2, shape, count, seed=len(case) + count, duplicates=duplicates)
    out_shape = _out_shape(shape, ks, stride, pad, dil, [0] * len(ks), subm, transpose)
    outids, pairs, num = kernels.indice_pairs(
        indices, 2, out_shape, shape, ks, stride, pad, dil, [0] * len(ks), subm, transpose
    )
    expected_ids, expected_pairs, expected_num = _mmcv_pairs(
        indices, out_shape, ks, stride, pad, dil, subm, transpose
    )
    assert outids.dtype == pairs.dtype == num.dtype == torch.int32
    if subm:
        assert outids is indices
    assert outids.tolist() == expected_ids
    assert num.tolist() == expected_num
    assert pairs.tolist() == expected_pairs


def test_no_active_site():
    indices = torch.zeros((0, 4), dtype=torch.int32)
    outids, pairs, num = kernels.indice_pairs(
        indices, 1, [3, 3, 3], [6, 6, 6], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], [0] * 3, 0, 0
    )
    assert outids.shape == (0, 4) and pairs.shape == (27, 2, 0) and num.sum() == 0
    features = torch.zeros((0, 2))
    out = kernels.indice_conv(features, torch.randn(3, 3, 3, 2, 5), pairs, num, 0)
    assert out.shape == (0, 5)
    assert kernels.indice_maxpool(features, pairs, num, 0).shape == (0, 2)


def test_kernel_volume_over_mmcvs_limit_is_refused():
    indices = torch.zeros((1, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match="kernel volume"):
        kernels.indice_pairs(
            indices, 1, [1] * 3, [1] * 3, [17, 16, 16], [1] * 3, [0] * 3, [1] * 3, [0] * 3, 1, 0
        )


def test_maxpool_clamps_at_zero_and_routes_gradients_to_every_maximum():
    # mmcv's output starts at 0: a site whose inputs are all negative pools to 0 and
    # passes no gradient; ties (the equal inputs 2.0) all get the output's gradient.
    features = torch.tensor([[-1.0, 2.0], [-3.0, 2.0], [-0.5, 1.0]])
    pairs = torch.tensor([[[0, 1, 2], [0, 0, 0]]], dtype=torch.int32)
    num = torch.tensor([3], dtype=torch.int32)
    out = kernels.indice_maxpool(features, pairs, num, 1)
    assert out.tolist() == [[0.0, 2.0]]
    grad = kernels.indice_maxpool_backward(features, out, torch.tensor([[5.0, 7.0]]), pairs, num)
    assert grad.tolist() == [[0.0, 7.0], [0.0, 7.0], [0.0, 0.0]]
