"""TensorIndex (opt-in): x[bool_mask] through masked_select equals x[bool_mask], 0-d masks included."""

from __future__ import annotations

import pytest
import torch
from ascend_patch_torch.groups import TensorIndex
from ascend_patch_torch.tensor_index import is_bool_mask
from ascend_patch_torch.tensor_index import masked_index
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


ORIGINAL_GETITEM = torch.Tensor.__getitem__


@st.composite
def tensor_and_mask(draw):
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    k = draw(st.integers(0, len(shape)))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = torch.rand(shape[:k], generator=generator) > 0.5
    return x, mask


@settings(max_examples=150, deadline=None)
@given(tensor_and_mask())
def test_masked_index_equals_indexing(case):
    x, mask = case
    assert is_bool_mask(x, mask)
    expected = ORIGINAL_GETITEM(x, mask)
    result = masked_index(x, mask)
    assert result.shape == expected.shape
    torch.testing.assert_close(result, expected)


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_zero_dim_masks(value, shape):
    # The DrivingSDK patcher broadcast a 0-d mask over the tensor and returned the wrong shape.
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    mask = torch.tensor(value)
    expected = ORIGINAL_GETITEM(x, mask)
    assert masked_index(x, mask).shape == expected.shape
    torch.testing.assert_close(masked_index(x, mask), expected)


def test_gradients_match(assert_parity):
    x = torch.randn(5, 3)
    mask = torch.tensor([True, False, True, True, False])
    assert_parity(ORIGINAL_GETITEM, masked_index, x, mask)


@pytest.mark.parametrize(
    "index",
    [
        0,
        slice(1, 2),
        (0, 1),
        torch.tensor([0, 2]),
        torch.tensor([1, 0, 1], dtype=torch.uint8),
        torch.tensor([[True, False]]),  # wrong shape: torch raises, so must the patch
        [True, False, True],
        None,
        Ellipsis,
    ],
)
def test_other_indexes_go_to_torch(index):
    x = torch.randn(3, 2)
    assert not is_bool_mask(x, index)


def test_patched_indexing_is_counted_and_exact(npu_emulator, isolated_patcher):
    isolated_patcher.add(TensorIndex).apply()
    x = torch.arange(12.0, device="npu").reshape(4, 3)
    mask = torch.tensor([True, False, False, True])
    assert x[mask].tolist() == [[0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]
    assert x[1].tolist() == [3.0, 4.0, 5.0]
    assert x[:, 0].tolist() == [0.0, 3.0, 6.0, 9.0]
    counters = isolated_patcher.report.get("torch.Tensor.__getitem__").counters
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 2)
    isolated_patcher.revert()
    assert torch.Tensor.__getitem__ is ORIGINAL_GETITEM
