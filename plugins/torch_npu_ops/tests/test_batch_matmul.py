"""BatchMatmul: batched matrix-vector products as mul + sum, equal to matmul in values and gradients."""

from __future__ import annotations

import pytest
import torch
from ascend_patch_torch.batch_matmul import batch_matvec
from ascend_patch_torch.batch_matmul import is_batched_matvec
from ascend_patch_torch.groups import BatchMatmul
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


ORIGINAL_MATMUL = torch.matmul


@st.composite
def operands(draw):
    rank = draw(st.integers(4, 7))
    k = draw(st.integers(1, 5))
    batch = draw(st.lists(st.integers(1, 3), min_size=rank - 2, max_size=rank - 2))
    # Broadcastable batch dims: each of b's is equal to a's or 1 (or a's is 1).
    b_batch = [d if draw(st.booleans()) else 1 for d in batch]
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn([*batch, k, k], generator=generator, dtype=torch.float64)
    b = torch.randn([*b_batch, k, 1], generator=generator, dtype=torch.float64)
    return a, b


@settings(max_examples=100, deadline=None)
@given(operands())
def test_batch_matvec_equals_matmul(pair):
    a, b = pair
    assert is_batched_matvec(a, b)
    torch.testing.assert_close(batch_matvec(a, b), ORIGINAL_MATMUL(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_values_and_gradients_match_per_dtype(assert_parity, dtype):
    a = torch.randn(2, 3, 4, 4).to(dtype)
    b = torch.randn(2, 1, 4, 1).to(dtype)
    assert_parity(ORIGINAL_MATMUL, batch_matvec, a, b)
    assert batch_matvec(a, b).dtype is dtype


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((2, 3, 4), (2, 4, 1)),  # rank 3
        ((1, 2, 3, 4, 4), (1, 2, 3, 4, 2)),  # not a column
        ((1, 2, 3, 5), (1, 2, 5, 1)),  # a not square
        ((2, 2, 4, 4), (3, 2, 4, 1)),  # batch dims do not broadcast
        ((2, 2, 4, 4), (2, 4, 1)),  # ranks differ
    ],
)
def test_outside_the_domain(a_shape, b_shape):
    assert not is_batched_matvec(torch.randn(a_shape), torch.randn(b_shape))


def test_out_and_integer_operands_go_to_torch():
    a, b = torch.randn(1, 1, 3, 3), torch.randn(1, 1, 3, 1)
    assert not is_batched_matvec(a, b, out=torch.empty(1, 1, 3, 1))
    assert not is_batched_matvec(a.long(), b.long())
    assert not is_batched_matvec(a, b.double())


def test_a_numpy_right_operand_behaves_as_without_the_patch(np, npu_emulator, isolated_patcher):
    """The DrivingSDK patcher's check called b.dim() on an ndarray and crashed."""
    a = torch.randn(1, 1, 3, 3)
    b = np.random.default_rng(0).standard_normal((1, 1, 3, 1)).astype(np.float32)
    expected = a @ b
    isolated_patcher.add(BatchMatmul).apply()
    assert not is_batched_matvec(a, b)
    result = a @ b
    assert type(result) is type(expected)
    np.testing.assert_allclose(np.asarray(result), np.asarray(expected), rtol=1e-6)
    with pytest.raises(TypeError):
        torch.matmul(a, b)


def test_patched_matmul_counts_and_matches(npu_emulator, isolated_patcher):
    a = torch.randn(2, 2, 3, 3, device="npu")
    b = torch.randn(2, 1, 3, 1, device="npu")
    expected = ORIGINAL_MATMUL(a, b)
    isolated_patcher.add(BatchMatmul).apply()
    for result in (torch.matmul(a, b), a.matmul(b), a @ b):
        torch.testing.assert_close(result, expected)
    torch.matmul(torch.randn(2, 3), torch.randn(3, 2))
    report = isolated_patcher.report
    assert report.get("torch.matmul").counters.replacement_calls == 1
    assert report.get("torch.matmul").counters.fallback_calls == 1
    assert report.get("torch.Tensor.__matmul__").counters.replacement_calls == 1
