"""Matmuls, layout ops, scatter and MoE gating against explicit loops and formulas."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


SETTINGS = settings(max_examples=30, deadline=None)
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])


def _randn(shape, seed, dtype=torch.float32):
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    ).to(dtype)


@SETTINGS
@given(
    b=st.integers(1, 3),
    m=st.integers(1, 5),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_bmm_v2(emulated, assert_close, b, m, k, n, dtype, seed):
    import torch_npu

    a, c = _randn((b, m, k), seed, dtype), _randn((b, k, n), seed + 1, dtype)
    expected = torch.stack([a[i].double() @ c[i].double() for i in range(b)])
    out = torch_npu.npu_bmmV2(a, c, [])
    assert out.shape == (b, m, n) and out.dtype == dtype
    assert_close(out, expected)


def test_bmm_v2_needs_output_sizes_and_has_gradients(emulated):
    import torch_npu

    a = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="missing value for argument 'output_sizes'"):
        torch_npu.npu_bmmV2(a, c)
    assert torch.autograd.gradcheck(lambda x, y: torch_npu.npu_bmmV2(x, y, []), (a, c))


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    transpose_first=st.booleans(),
    data=st.data(),
)
def test_confusion_transpose(emulated, shape, transpose_first, data):
    import torch_npu

    x = torch.arange(int(torch.tensor(shape).prod())).view(shape)
    perm = data.draw(st.permutations(range(len(shape))), label="perm")
    if transpose_first:
        permuted = [shape[p] for p in perm]
        target = [int(torch.tensor(permuted).prod())]
        expected = x.permute(*perm).reshape(target)
        out = torch_npu.npu_confusion_transpose(x, list(perm), target, True)
    else:
        target = list(shape)
        expected = x.view(target).permute(*perm)
        out = torch_npu.npu_confusion_transpose(x, list(perm), target, False)
    assert torch.equal(out, expected) and out.is_contiguous()
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_confusion_transpose_gradient(emulated):
    import torch_npu

    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: torch_npu.npu_confusion_transpose(t, [0, 2, 1], [2, 12], True), (x,)
    )


def test_format_cast_is_an_identity_that_remembers_the_format(emulated):
    import torch_npu

    x = torch.randn(2, 3, requires_grad=True)
    nz = torch_npu.npu_format_cast(x, torch_npu.Format.FRACTAL_NZ)
    assert torch.equal(nz, x) and nz is not x
    assert torch_npu.get_npu_format(nz) == 29
    assert torch_npu.get_npu_format(torch.ones(2, 3)) == 2
    assert torch_npu.get_npu_format(torch.ones(1, 2, 3, 4)) == 0
    like = torch_npu.npu_format_cast(torch.ones(2, 3), nz)
    assert torch_npu.get_npu_format(like) == 29
    nz.sum().backward()
    assert torch.equal(x.grad, torch.ones(2, 3))
    y = torch.ones(2)
    assert torch_npu.npu_format_cast_(y, 2) is y


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    data=st.data(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.int64, torch.bool]),
)
def test_scatter_nd_update(emulated, shape, data, dtype):
    import torch_npu

    depth = data.draw(st.integers(1, len(shape)), label="index depth")
    rows = data.draw(st.integers(1, 4), label="updates")
    index_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="index dtype")
    # Distinct indices: with duplicates the winning update is unspecified.
    cells = list(torch.cartesian_prod(*[torch.arange(s) for s in shape[:depth]]).view(-1, depth))
    picked = data.draw(
        st.lists(st.sampled_from(range(len(cells))), min_size=1, max_size=rows, unique=True)
    )
    indices = torch.stack([cells[i] for i in picked]).to(index_dtype)
    base = torch.arange(int(torch.tensor(shape).prod())).view(shape).to(dtype)
    updates = (
        (torch.arange(len(picked) * int(torch.tensor(shape[depth:]).prod())) + 100)
        .view(len(picked), *shape[depth:])
        .to(dtype)
    )
    expected = base.clone()
    for row, index in enumerate(indices.tolist()):
        expected[tuple(index)] = updates[row]
    out = torch_npu.npu_scatter_nd_update(base, indices, updates)
    assert torch.equal(out, expected)
    assert torch.equal(base, torch.arange(int(torch.tensor(shape).prod())).view(shape).to(dtype))
    in_place = base.clone()
    assert torch_npu.npu_scatter_nd_update_(in_place, indices, updates) is in_place
    assert torch.equal(in_place, expected)


def test_scatter_nd_update_checks_shapes(emulated):
    import torch_npu

    with pytest.raises(RuntimeError, match=r"updates shape \(3,\)"):
        torch_npu.npu_scatter_nd_update(torch.zeros(4, 2), torch.tensor([[0], [1]]), torch.zeros(3))


def _act(y, act_type):
    if act_type == 1:
        return y.clamp(min=0)
    if act_type == 5:
        return y / (1 + torch.exp(-y))
    return y


@SETTINGS
@given(
    counts=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    k=st.integers(1, 4),
    n=st.integers(1, 4),
    cumulative=st.booleans(),
    stacked=st.booleans(),
    with_bias=st.booleans(),
    single_output=st.booleans(),
    act_type=st.sampled_from([0, 1, 5]),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_grouped_matmul_split_m(
    emulated,
    assert_close,
    counts,
    k,
    n,
    cumulative,
    stacked,
    with_bias,
    single_output,
    act_type,
    dtype,
    seed,
):
    import torch_npu

    experts = len(counts)
    x = _randn((sum(counts), k), seed, dtype)
    w = _randn((experts, k, n), seed + 1, dtype)
    bias = _randn((experts, n), seed + 2, dtype) if with_bias else None
    group_list = torch.tensor(counts).cumsum(0) if cumulative else torch.tensor(counts)
    outputs = torch_npu.npu_grouped_matmul(
        [x],
        [w] if stacked else list(w),
        bias=None if bias is None else ([bias] if stacked else list(bias)),
        group_list=group_list,
        split_item=3 if single_output else 0,
        group_type=0,
        group_list_type=0 if cumulative else 1,
        act_type=act_type,
    )
    pieces, start = [], 0
    for e, count in enumerate(counts):
        y = x[start : start + count].double() @ w[e].double()
        if bias is not None:
            y = y + bias[e].double()
        pieces.append(_act(y, act_type))
        start += count
    if single_output:
        assert len(outputs) == 1
        assert_close(outputs[0], torch.cat(pieces))
    else:
        assert len(outputs) == experts
        for got, expected in zip(outputs, pieces, strict=True):
            assert_close(got, expected)


def test_grouped_matmul_lists_and_unemulated_quantization(emulated, assert_close):
    import torch_npu

    xs = [torch.randn(2, 3), torch.randn(4, 5)]
    ws = [torch.randn(3, 6), torch.randn(5, 1)]
    outputs = torch_npu.npu_grouped_matmul(xs, ws, group_type=-1)
    for x, w, y in zip(xs, ws, outputs, strict=True):
        assert_close(y, x.double() @ w.double())
    with pytest.raises(RuntimeError, match="quantized grouped matmul is not emulated"):
        torch_npu.npu_grouped_matmul(xs, ws, scale=[torch.ones(6), torch.ones(1)], group_type=-1)


@SETTINGS
@given(
    rows=st.integers(1, 5),
    experts=st.integers(1, 8),
    leading=st.booleans(),
    dtype=DTYPES,
    data=st.data(),
)
def test_moe_gating_top_k_softmax(emulated, assert_close, rows, experts, leading, dtype, data):
    import torch_npu

    k = data.draw(st.integers(1, experts), label="k")
    # Distinct logits, so the top-k order is unambiguous in every dtype.
    perm = torch.randperm(
        rows * experts, generator=torch.Generator().manual_seed(rows * 31 + experts)
    )
    x = (perm.view(rows, experts).double() / 4).to(dtype)
    finished = torch.tensor(data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows)))
    shape = (1, rows, experts) if leading else (rows, experts)
    y, expert_idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(
        x.view(shape), finished.view(shape[:-1]), k
    )
    assert expert_idx.dtype == row_idx.dtype == torch.int32
    assert y.shape == expert_idx.shape == row_idx.shape == (*shape[:-1], k)
    y, expert_idx, row_idx = y.view(rows, k), expert_idx.view(rows, k), row_idx.view(rows, k)
    probs = x.double().softmax(-1)
    for r in range(rows):
        order = sorted(range(experts), key=lambda e: -probs[r, e].item())[:k]
        assert_close(y[r], probs[r, order])
        expected_idx = [experts] * k if finished[r] else order
        assert expert_idx[r].tolist() == expected_idx
        assert row_idx[r].tolist() == [j * rows + r for j in range(k)]
