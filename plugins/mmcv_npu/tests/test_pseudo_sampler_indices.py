"""PseudoSampler's indices: ``nonzero`` without ``unique()`` is mmdet's ``nonzero().unique()``.

Torch only (no mmdet): the claim the replacement rests on, for any 1-D ``gt_inds``
(ignored -1, negatives 0, assigned gt numbers), and the runtime check that keeps the
replacement off inputs where it would not hold (2-D, where ``unique()`` flattens).
"""

from __future__ import annotations

import types

from hypothesis import given
from hypothesis import strategies as st
from mmcv_stacks import require_module


torch = require_module("torch")

from ascend_patch_mmcv.pseudo_sampler import gt_inds_on_npu  # noqa: E402
from ascend_patch_mmcv.pseudo_sampler import sampled_indices  # noqa: E402


@given(st.lists(st.integers(min_value=-1, max_value=6), max_size=300))
def test_nonzero_indices_are_mmdets_unique_ones(values):
    gt_inds = torch.tensor(values, dtype=torch.long)
    positive, negative = sampled_indices(gt_inds)
    for got, mask in ((positive, gt_inds > 0), (negative, gt_inds == 0)):
        expected = torch.nonzero(mask, as_tuple=False).squeeze(-1).unique()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)


class NpuLike:
    """A tensor stand-in that says it is on the NPU."""

    is_npu = True

    def __init__(self, dims):
        self._dims = dims

    def dim(self):
        return self._dims


def test_the_replacement_runs_for_1d_npu_gt_inds_only():
    assert gt_inds_on_npu(None, types.SimpleNamespace(gt_inds=NpuLike(1)))
    assert not gt_inds_on_npu(None, types.SimpleNamespace(gt_inds=NpuLike(2)))
    assert not gt_inds_on_npu(None, types.SimpleNamespace(gt_inds=torch.zeros(3)))
    assert not gt_inds_on_npu(None, object())
