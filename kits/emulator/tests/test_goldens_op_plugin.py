"""Emulator kernels against the facts in Ascend/op-plugin, for ops Ascend/pytorch has no golden for.

Each test names the op-plugin file its facts come from (repository ``Ascend/op-plugin``,
https://github.com/Ascend/op-plugin, path given in the test). The references below are
written here from those facts: the CPU formula op-plugin's test compares the NPU with, the
shapes its meta (fake) registration gives, and the defaults, dtypes and constraints its API
page states. Where op-plugin's test runs a large case on hardware, a smaller case with the same
structure is used here so the suite stays fast.
"""

# op-plugin names its beta API pages with fullwidth parentheses (U+FF08, U+FF09) round "beta".
# ruff: noqa: RUF002

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode


def _rng(seed):
    return np.random.default_rng(seed)


# --- npu_swiglu -------------------------------------------------------------------------


def _swiglu_reference(x, dim):
    a, b = np.split(x.astype(np.float64), 2, axis=dim)
    return a / (1 + np.exp(-a)) * b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_swiglu_formula_default_dim_and_dtype(emulated, dtype):
    """swish(A) * B with A, B the halves along ``dim`` (default -1); dtype of the input.

    Source: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_swiglu.md
    (formula, ``dim=-1`` default, same dtype as the input; its example shape [2, 32, 6, 6]).
    """
    import torch_npu

    x = torch.from_numpy(_rng(0).standard_normal((2, 32, 6, 6))).to(dtype)
    out = torch_npu.npu_swiglu(x)
    assert out.dtype == dtype and out.shape == (2, 32, 6, 3)
    assert torch.equal(out, torch_npu.npu_swiglu(x, dim=-1))
    expected = torch.from_numpy(_swiglu_reference(x.double().numpy(), -1))
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dim", [0, 1, -2, 3])
def test_swiglu_splits_the_given_dim(emulated, dim):
    """Any dim in [-input.dim(), input.dim() - 1]; the output halves that dim (floor(size / 2)).

    Sources: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_swiglu.md
    (``dim`` range) and op_plugin/python/meta/_meta_registrations.py (``npu_swiglu_meta``).
    """
    import torch_npu

    x = torch.from_numpy(_rng(1).standard_normal((4, 6, 8, 2)).astype(np.float32))
    out = torch_npu.npu_swiglu(x, dim)
    shape = list(x.shape)
    shape[dim] //= 2
    assert list(out.shape) == shape
    expected = torch.from_numpy(_swiglu_reference(x.numpy(), dim))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


# --- npu_gelu ---------------------------------------------------------------------------


def test_gelu_tanh_matches_torch_gelu_in_float16(emulated):
    """op-plugin's golden: ``torch.nn.functional.gelu(x, approximate=mode)`` on the CPU.

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_gelu.py (fp16 ``rand`` input
    [100, 400], ``approximate="tanh"``, output compared in float16).
    """
    torch.manual_seed(0)
    x = torch.rand(100, 400, dtype=torch.float16)
    out = torch.ops.npu.npu_gelu(x, approximate="tanh")
    golden = F.gelu(x.float(), approximate="tanh").half()
    assert out.dtype == torch.float16 and out.shape == x.shape
    torch.testing.assert_close(out, golden, rtol=1e-3, atol=1e-3)


def test_gelu_default_is_erf_and_accepts_non_contiguous(emulated):
    """``approximate='none'`` (erf) by default; same dtype and shape; non-contiguous input works.

    Source: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_gelu.md.
    """
    import torch_npu

    x = torch.from_numpy(_rng(2).standard_normal((100, 200)).astype(np.float32)).T
    assert not x.is_contiguous()
    out = torch_npu.npu_gelu(x)
    x64 = x.double()
    erf_golden = 0.5 * x64 * (1 + torch.erf(x64 / 2**0.5))
    assert out.dtype == torch.float32 and out.shape == (200, 100)
    torch.testing.assert_close(out.double(), erf_golden, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out, torch_npu.npu_gelu(x, approximate="tanh"), rtol=0, atol=1e-7)


# --- npu_rms_norm / npu_add_rms_norm ---------------------------------------------------


def _rms_golden(x, gamma, epsilon=1e-6):
    """op-plugin's numpy golden: float32 throughout, ``rstd`` kept with a trailing 1."""
    x32 = np.asarray(x, dtype=np.float32)
    variance = np.mean(np.power(x32, 2), axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(variance + epsilon)
    return (x32 * rstd * np.asarray(gamma, dtype=np.float32)).astype(x.dtype), rstd


@pytest.mark.parametrize(
    ("x_dtype", "gamma_dtype"), [(np.float32, np.float32), (np.float16, np.float32)]
)
def test_rms_norm_golden(emulated, x_dtype, gamma_dtype):
    """``(y, rstd)``: y in the input's dtype (also with float32 gamma), rstd float32 [rows, 1].

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_rms_norm.py (``test_rms_norm`` and
    ``test_rms_norm_mix_dtype``: uniform(0, 100) input, default epsilon 1e-6).
    """
    import torch_npu

    rng = _rng(3)
    x = rng.uniform(0, 100, [64, 512]).astype(x_dtype)
    gamma = rng.uniform(0, 100, [512]).astype(gamma_dtype)
    y, rstd = torch_npu.npu_rms_norm(torch.from_numpy(x), torch.from_numpy(gamma))
    golden_y, golden_rstd = _rms_golden(x, gamma)
    assert y.dtype == torch.from_numpy(x).dtype and rstd.dtype == torch.float32
    assert tuple(rstd.shape) == golden_rstd.shape == (64, 1)
    tol = 1e-4 if x_dtype == np.float32 else 1e-3
    np.testing.assert_allclose(y.float().numpy(), golden_y.astype(np.float32), rtol=tol)
    np.testing.assert_allclose(rstd.numpy(), golden_rstd, rtol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "gamma_shape", "rstd_shape"),
    [((24, 1, 128), (128,), (24, 1, 1)), ((3, 4, 8), (4, 8), (3, 1, 1)), ((5, 6), (6,), (5, 1))],
)
def test_rms_norm_and_add_rms_norm_rstd_shape(emulated, x_shape, gamma_shape, rstd_shape):
    """rstd keeps the leading ``x.dim() - gamma.dim()`` sizes and 1 elsewhere, for both ops.

    Sources: Ascend/op-plugin op_plugin/python/meta/_meta_registrations.py (``npu_rms_norm_meta``,
    ``npu_add_rms_norm_meta``) and docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_rms_norm.md
    (its example: x [24, 1, 128], w [128], ``epsilon=1e-5``).
    """
    import torch_npu

    rng = _rng(4)
    x = torch.from_numpy(rng.standard_normal(x_shape).astype(np.float32))
    gamma = torch.from_numpy(rng.standard_normal(gamma_shape).astype(np.float32))
    y, rstd = torch_npu.npu_rms_norm(x, gamma, epsilon=1e-5)
    assert y.shape == x.shape and tuple(rstd.shape) == rstd_shape
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    expected_rstd = 1 / torch.sqrt(x.double().pow(2).mean(dims, keepdim=True) + 1e-5)
    torch.testing.assert_close(rstd.double(), expected_rstd, rtol=1e-5, atol=1e-6)
    y2, rstd2, total = torch_npu.npu_add_rms_norm(x, x, gamma)
    assert y2.shape == total.shape == x.shape and tuple(rstd2.shape) == rstd_shape


def test_rms_norm_empty_and_non_contiguous(emulated):
    """Empty and non-contiguous inputs are accepted; y keeps the input's shape and dtype.

    Source: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_rms_norm.md
    (``self`` and ``gamma``: non-contiguous and empty tensors supported).
    """
    import torch_npu

    gamma = torch.ones(8)
    y, rstd = torch_npu.npu_rms_norm(torch.empty(0, 8), gamma)
    assert y.shape == (0, 8) and tuple(rstd.shape) == (0, 1)
    x = torch.from_numpy(_rng(9).standard_normal((8, 6)).astype(np.float32)).T
    assert not x.is_contiguous()
    y, rstd = torch_npu.npu_rms_norm(x, gamma)
    golden_y, golden_rstd = _rms_golden(x.contiguous().numpy(), gamma.numpy())
    np.testing.assert_allclose(y.numpy(), golden_y, rtol=1e-5)
    np.testing.assert_allclose(rstd.numpy(), golden_rstd, rtol=1e-5)


def _add_rms_golden(x1, x2, gamma, epsilon=1e-6):
    """op-plugin's numpy golden: the sum in the input dtype, normalised in float32."""
    x = x1 + x2
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    rstd = 1 / np.sqrt(np.mean(np.power(wide, 2), axis=-1, keepdims=True) + epsilon)
    return (wide * rstd * gamma).astype(x1.dtype), rstd, x


@pytest.mark.parametrize(("dtype", "tol"), [(np.float32, 1e-4), (np.float16, 1e-3)])
def test_add_rms_norm_golden(emulated, dtype, tol):
    """``(y, rstd, x1 + x2)``; the sum and y in the input dtype, rstd float32 [rows, 1].

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_add_rms_norm.py
    (``test_add_rms_norm_fp32``/``_fp16``: uniform(0, 100) inputs, epsilon 1e-6, rtol 1e-4/1e-3).
    """
    import torch_npu

    rng = _rng(5)
    x1 = rng.uniform(0, 100, [64, 512]).astype(dtype)
    x2 = rng.uniform(0, 100, [64, 512]).astype(dtype)
    gamma = rng.uniform(0, 100, [512]).astype(dtype)
    y, rstd, total = torch_npu.npu_add_rms_norm(
        torch.from_numpy(x1), torch.from_numpy(x2), torch.from_numpy(gamma), 1e-6
    )
    golden_y, golden_rstd, golden_x = _add_rms_golden(x1, x2, gamma)
    assert y.dtype == total.dtype == torch.from_numpy(x1).dtype and rstd.dtype == torch.float32
    assert tuple(rstd.shape) == (64, 1)
    np.testing.assert_array_equal(total.numpy(), golden_x)
    np.testing.assert_allclose(y.float().numpy(), golden_y.astype(np.float32), rtol=tol)
    np.testing.assert_allclose(rstd.numpy(), golden_rstd, rtol=tol)


# --- npu_moe_gating_top_k_softmax -------------------------------------------------------


def _moe_golden(x, finished, k):
    """op-plugin's numpy golden: float32 softmax (cast back for float16), stable descending
    argsort, finished rows routed to expert E, ``row_idx = arange(R*k).reshape(k, R).T``."""
    experts = x.shape[-1]
    wide = x.astype(np.float32)
    exp = np.exp(wide - wide.max(axis=-1, keepdims=True))
    softmax = (exp / exp.sum(axis=-1, keepdims=True)).astype(x.dtype)
    expert_idx = np.argsort(-softmax, axis=-1, kind="stable")[:, :k]
    y = np.take_along_axis(softmax, expert_idx, axis=-1)
    if finished is not None:
        expert_idx = np.where(finished[:, None], experts, expert_idx)
    rows = y.shape[0]
    row_idx = np.arange(rows * k).reshape(k, rows).T
    return y, expert_idx.astype(np.int32), row_idx.astype(np.int32)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(("rows", "k", "experts"), [(10, 2, 200), (43, 5, 64), (12, 9, 9)])
@pytest.mark.parametrize("finished_kind", ["random", "all", "none"])
def test_moe_gating_top_k_softmax_golden(emulated, dtype, rows, k, experts, finished_kind):
    """``(y, expert_idx, row_idx)``: top-k of the softmax, ties to the lower expert index,
    finished rows get expert index E, int32 indices, row_idx column-major.

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_moe_gating_top_k_softmax.py
    (uniform(-1, 1) gating logits, float16 and float32, k from 2 to 9; its ``finished`` is
    ``uniform(-1, 1).astype(bool)``, i.e. all True, the "all" case here).
    """
    import torch_npu

    rng = _rng(rows * 100 + k)
    x = rng.uniform(-1, 1, size=(rows, experts)).astype(dtype)
    finished = {
        "random": rng.integers(0, 2, size=(rows,)).astype(bool),
        "all": rng.uniform(-1, 1, size=(rows,)).astype(bool),
        "none": None,
    }[finished_kind]
    y, expert_idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(
        torch.from_numpy(x), None if finished is None else torch.from_numpy(finished), k
    )
    golden_y, golden_idx, golden_rows = _moe_golden(x, finished, k)
    assert y.dtype == torch.from_numpy(x).dtype
    assert expert_idx.dtype == row_idx.dtype == torch.int32
    assert y.shape == expert_idx.shape == row_idx.shape == (rows, k)
    np.testing.assert_allclose(y.float().numpy(), golden_y.astype(np.float32), rtol=1e-3)
    np.testing.assert_array_equal(expert_idx.numpy(), golden_idx)
    np.testing.assert_array_equal(row_idx.numpy(), golden_rows)


def test_moe_gating_top_k_softmax_ties_and_3d(emulated):
    """Equal probabilities go to the lower expert index (stable sort); 3-D gating keeps its
    leading dims and k is 1 by default.

    Sources: Ascend/op-plugin test/test_custom_ops/test_npu_moe_gating_top_k_softmax.py
    (``np.argsort(-softmax, kind='stable')``), op_plugin/python/meta/_meta_registrations.py
    (``npu_moe_gating_top_k_softmax_meta``: 2-D or 3-D ``x``, outputs ``[..., k]``) and
    docs/zh/custom_APIs/torch_npu/torch_npu-npu_moe_gating_top_k_softmax.md (``k=1`` default).
    """
    import torch_npu

    flat = torch.zeros(3, 6)
    _, expert_idx, _ = torch_npu.npu_moe_gating_top_k_softmax(flat, None, 4)
    assert expert_idx.tolist() == [[0, 1, 2, 3]] * 3
    x = torch.from_numpy(_rng(6).standard_normal((2, 4, 6)).astype(np.float16))
    y, expert_idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(x)
    assert y.shape == expert_idx.shape == row_idx.shape == (2, 4, 1)
    assert torch.equal(expert_idx.squeeze(-1), x.float().argmax(-1).to(torch.int32))
    y, expert_idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(x, None, 2)
    golden_y, golden_idx, golden_rows = _moe_golden(x.reshape(8, 6).numpy(), None, 2)
    np.testing.assert_array_equal(expert_idx.reshape(8, 2).numpy(), golden_idx)
    np.testing.assert_array_equal(row_idx.reshape(8, 2).numpy(), golden_rows)
    np.testing.assert_allclose(y.reshape(8, 2).float().numpy(), golden_y, rtol=1e-3)


# --- npu_scatter_nd_update (+ in place) --------------------------------------------------


def test_scatter_nd_update_golden_leaves_input(emulated):
    """Element updates at ``(row, col)`` pairs; the out-of-place op leaves ``input`` unchanged.

    Sources: Ascend/op-plugin test/test_custom_ops/test_npu_scatter_nd_update.py (float16
    zeros [3, 2], indices [[0, 0], [1, 1]], updates [10, 20]) and
    docs/zh/custom_APIs/torch_npu/torch_npu-npu_scatter_nd_update.md (``input`` unchanged;
    meta ``scatter_nd_update_meta``: a new tensor like ``input``).
    """
    import torch_npu

    var = torch.zeros(3, 2, dtype=torch.float16)
    indices = torch.tensor([[0, 0], [1, 1]])
    updates = torch.tensor([10, 20], dtype=torch.float16)
    golden = var.clone()
    for i, (row, col) in enumerate(indices.tolist()):
        golden[row][col] = updates[i]
    out = torch_npu.npu_scatter_nd_update(var, indices, updates)
    assert out.dtype == torch.float16 and out.shape == var.shape
    assert torch.equal(out, golden)
    assert torch.equal(var, torch.zeros(3, 2, dtype=torch.float16))
    assert out.data_ptr() != var.data_ptr()


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_scatter_nd_update_slices_and_in_place(emulated, index_dtype):
    """Indices ``[n, a]`` address the first ``a`` dims; updates are ``indices.shape[:-1] +
    input.shape[a:]``; int32 or int64 indices; the ``_`` op writes into ``input`` and returns it.

    Sources: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_scatter_nd_update.md
    and torch_npu-npu_scatter_nd_update_.md (their example: var [24, 128], indices [12, 1]
    int32, updates [12, 128]; shape rule (4, 5, 6) / (3, 2) -> updates (3, 6)), and
    op_plugin/python/meta/_meta_registrations.py (``scatter_nd_update__meta`` returns ``self``).
    """
    import torch_npu

    rng = _rng(7)
    var = torch.from_numpy(rng.uniform(0, 1, [24, 128]).astype(np.float16))
    rows = torch.from_numpy(rng.permutation(24)[:12]).to(index_dtype)
    updates = torch.from_numpy(rng.uniform(1, 2, [12, 128]).astype(np.float16))
    golden = var.clone()
    golden[rows.long()] = updates
    assert torch.equal(torch_npu.npu_scatter_nd_update(var, rows[:, None], updates), golden)

    cube = torch.from_numpy(rng.standard_normal((4, 5, 6)).astype(np.float32))
    pairs = torch.tensor([[0, 1], [3, 4], [2, 0]], dtype=index_dtype)
    rows_of_six = torch.from_numpy(rng.standard_normal((3, 6)).astype(np.float32))
    golden = cube.clone()
    for (i, j), update in zip(pairs.tolist(), rows_of_six, strict=True):
        golden[i, j] = update
    returned = torch_npu.npu_scatter_nd_update_(cube, pairs, rows_of_six)
    assert returned is cube or returned.data_ptr() == cube.data_ptr()
    assert torch.equal(cube, golden)


# --- npu_nms_v4 -------------------------------------------------------------------------


def test_nms_v4_upstream_call_outputs(emulated):
    """``(selected_indices int32 [M], valid_outputs int32 0-d)``, M <= max_output_size, valid
    entries first and in descending score order, scores above ``scores_threshold``.

    Sources: Ascend/op-plugin test/test_base_ops/test_nms_v4.py (its call: boxes uniform(0, 100)
    [100, 4], scores uniform(0, 1) [100], max_output_size 20, 0-d thresholds 0.5 and 0.3; it
    checks no values) and docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_nms_v4.md (return
    types and shapes; its example returns 20 int32 indices and ``tensor(20, dtype=int32)``).
    """
    import torch_npu

    rng = _rng(8)
    boxes = torch.from_numpy(rng.uniform(0, 100, (100, 4)).astype(np.float32))
    scores = torch.from_numpy(rng.uniform(0, 1, 100).astype(np.float32))
    iou_threshold, scores_threshold = torch.tensor(0.5), torch.tensor(0.3)
    selected, valid = torch_npu.npu_nms_v4(boxes, scores, 20, iou_threshold, scores_threshold)
    assert selected.dtype == valid.dtype == torch.int32
    assert selected.dim() == 1 and valid.dim() == 0
    count = int(valid)
    assert 0 < count <= selected.numel() <= 20
    kept = selected[:count].long()
    assert len(set(kept.tolist())) == count
    assert bool((scores[kept] > 0.3).all())
    assert torch.equal(scores[kept], scores[kept].sort(descending=True).values)
    assert int(kept[0]) == int(scores.argmax())


def test_nms_v4_pad_to_max_output_size(emulated):
    """``pad_to_max_output_size=True`` pads ``selected_indices`` to ``max_output_size``;
    ``valid_outputs`` still counts the valid entries, which come first.

    Source: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_nms_v4.md.
    """
    import torch_npu

    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 9.0], [20.0, 20.0, 30.0, 30.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    thresholds = torch.tensor(0.5), torch.tensor(0.0)
    selected, valid = torch_npu.npu_nms_v4(boxes, scores, 8, *thresholds)
    assert selected.tolist() == [0, 2] and int(valid) == 2
    padded, valid = torch_npu.npu_nms_v4(boxes, scores, 8, *thresholds, pad_to_max_output_size=True)
    assert padded.shape == (8,) and padded.dtype == torch.int32 and int(valid) == 2
    assert padded[:2].tolist() == [0, 2]


# --- npu_grouped_matmul -----------------------------------------------------------------


def _normal(*shape, dtype=torch.float16):
    return torch.normal(mean=0.0, std=0.1, size=shape).to(dtype)


def _matmul_golden(x, w, b=None):
    """op-plugin's ``single_matmul`` without quantisation: ``x @ w (+ b)``, in float64 here."""
    y = x.double() @ w.double()
    return y if b is None else y + b.double()


def _assert_gmm_close(actual, expected):
    assert actual.dtype == torch.float16 and actual.shape == expected.shape
    torch.testing.assert_close(actual.double(), expected, rtol=2e-3, atol=2e-3)


def test_grouped_matmul_lists_per_group(emulated):
    """Several x, weights and biases (split_item 0, group_type -1): one ``x[i] @ w[i] + b[i]``
    per group, x of any rank, inputs left unchanged.

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_grouped_matmul.py
    (``test_npu_grouped_matmul_0`` and ``_0_multi_dim``; shapes scaled down).
    """
    import torch_npu

    torch.manual_seed(0)
    x = [_normal(32, 32), _normal(64, 32), _normal(16, 64), _normal(3, 8, 24)]
    weight = [_normal(32, 32), _normal(32, 64), _normal(64, 16), _normal(24, 40)]
    bias = [_normal(32), _normal(64), _normal(16), _normal(40)]
    originals = [t.clone() for t in x]
    out = torch_npu.npu_grouped_matmul(x, weight, bias=bias, split_item=0, group_type=-1)
    assert len(out) == 4
    for i, result in enumerate(out):
        _assert_gmm_close(result, _matmul_golden(x[i], weight[i], bias[i]))
        assert torch.equal(x[i], originals[i])
    assert out[3].shape == (3, 8, 40)


def test_grouped_matmul_lists_concatenated(emulated):
    """Several x and weights with split_item 2: the per-group results concatenated on dim 0,
    also in fake mode.

    Sources: Ascend/op-plugin test/test_custom_ops/test_npu_grouped_matmul.py
    (``test_npu_grouped_matmul_2``, group_type 0 and no group_list; shapes scaled down) and
    op_plugin/python/meta/_meta_registrations.py (``npu_grouped_matmul_meta``: the rows of
    every x summed).
    """
    import torch_npu

    torch.manual_seed(1)
    x = [_normal(32, 32), _normal(64, 32), _normal(16, 64)]
    weight = [_normal(32, 24), _normal(32, 24), _normal(64, 24)]
    bias = [_normal(24), _normal(24), _normal(24)]
    out = torch_npu.npu_grouped_matmul(x, weight, bias=bias, split_item=2, group_type=0)
    assert len(out) == 1
    golden = torch.cat([_matmul_golden(x[i], weight[i], bias[i]) for i in range(3)])
    _assert_gmm_close(out[0], golden)
    with FakeTensorMode() as fake_mode:
        fakes = [fake_mode.from_tensor(t) for t in (*x, *weight)]
        traced = torch_npu.npu_grouped_matmul(fakes[:3], fakes[3:], split_item=2, group_type=0)
    assert [tuple(t.shape) for t in traced] == [(112, 24)]


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_grouped_matmul_split_m_by_cumulative_group_list(emulated, stacked, dtype):
    """One x split on M at the cumulative ends in ``group_list`` (split_item 3, group_type 0),
    weights as a list of [K, N] or one [E, K, N], bias as a list or one [E, N]; one result.

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_grouped_matmul.py
    (``test_npu_grouped_matmul_1``, ``_3``, ``_4``, ``_7``, ``_8``, ``_9``; shapes scaled down).
    """
    import torch_npu

    torch.manual_seed(2)
    ends = [16, 80, 112]
    x = _normal(112, 32, dtype=dtype)
    weights = _normal(3, 32, 24, dtype=dtype)
    biases = _normal(3, 24, dtype=dtype)
    weight = [weights] if stacked else list(weights.unbind())
    bias = [biases] if stacked else list(biases.unbind())
    out = torch_npu.npu_grouped_matmul(
        [x], weight, bias=bias, group_list=torch.tensor(ends), split_item=3, group_type=0
    )
    starts = [0, *ends[:-1]]
    golden = torch.cat(
        [
            _matmul_golden(x[s:e], weights[i], biases[i])
            for i, (s, e) in enumerate(zip(starts, ends, strict=True))
        ]
    )
    assert len(out) == 1 and out[0].dtype == dtype and out[0].shape == (112, 24)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out[0].double(), golden, rtol=tol, atol=tol)


def test_grouped_matmul_split_k(emulated):
    """group_type 2 (split K): ``x.T`` [K, M] and ``weight`` [M, N] split on M at the cumulative
    ends, one ``[E, K, N]`` result stacking ``x.T[:, group] @ weight[group]``.

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_grouped_matmul.py
    (``test_npu_grouped_matmul_6``: a non-contiguous ``x1.T``, group sizes [256, 256, 512, 768]
    passed as their cumsum; shapes scaled down).
    """
    import torch_npu

    torch.manual_seed(3)
    sizes = [8, 8, 16, 24]
    x1 = _normal(56, 32)
    weight = _normal(56, 16)
    group_list = torch.cumsum(torch.tensor(sizes), dim=0)
    out = torch_npu.npu_grouped_matmul(
        [x1.T], [weight], group_list=group_list, split_item=3, group_type=2
    )
    golden = torch.stack(
        [
            _matmul_golden(xs, ws)
            for xs, ws in zip(x1.T.split(sizes, dim=1), weight.split(sizes), strict=True)
        ]
    )
    assert len(out) == 1
    _assert_gmm_close(out[0], golden)
    assert out[0].shape == (4, 32, 16)


# --- npu_fusion_attention ---------------------------------------------------------------


def _attention_golden(q, k, v, scale):
    """op-plugin's golden on BNSD: float32 softmax of ``scale * q @ k^T``, times ``v``; also the
    row max and the row sum of ``exp(s - max)`` it records for the softmax outputs."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    row_max = scores.amax(-1, keepdim=True)
    row_sum = (scores - row_max).exp().sum(-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.matmul(probs, v.float()), row_max, row_sum


def test_fusion_attention_bsh_golden(emulated):
    """BSH: ``softmax(scale * q k^T) v`` in float32, returned in float16; seven returns with
    ``softmax_max``/``softmax_sum`` float32 ``[B, N, S1, 8]`` and an empty ``softmax_out``.

    Sources: Ascend/op-plugin test/test_custom_ops/test_npu_flash_attention.py
    (``test_npu_flash_attention``: float16 BNSD randn moved to BSH, ``scale=0.08838``; shapes
    scaled down) and op_plugin/python/meta/_meta_registrations.py
    (``npu_fusion_attention_forward``: output and softmax shapes).
    """
    import torch_npu

    torch.manual_seed(0)
    batch, heads, seq, dim = 1, 4, 64, 32
    q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float16) for _ in range(3))

    def to_bsh(t):
        return t.transpose(1, 2).reshape(batch, seq, heads * dim)

    result = torch_npu.npu_fusion_attention(
        to_bsh(q), to_bsh(k), to_bsh(v), heads, "BSH", scale=0.08838
    )
    assert len(result) == 7
    out, softmax_max, softmax_sum, softmax_out = result[:4]
    golden, row_max, row_sum = _attention_golden(q, k, v, 0.08838)
    assert out.dtype == torch.float16 and out.shape == (batch, seq, heads * dim)
    torch.testing.assert_close(out, to_bsh(golden.half()), rtol=2e-3, atol=2e-3)
    assert softmax_max.dtype == softmax_sum.dtype == torch.float32
    assert softmax_max.shape == softmax_sum.shape == (batch, heads, seq, 8)
    torch.testing.assert_close(softmax_max, row_max.expand(-1, -1, -1, 8), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(softmax_sum, row_sum.expand(-1, -1, -1, 8), rtol=1e-4, atol=1e-4)
    assert softmax_out.numel() == 0


def _tnd_golden(q, k, v, dy, q_lens, kv_lens, scale):
    """Per sequence, GQA heads repeated; returns out, max and sum ``[T, N1, 8]``, dq, dk, dv."""
    heads, kv_heads = q.shape[1], k.shape[1]
    pieces = {name: [] for name in ("out", "max", "sum", "dq", "dk", "dv")}
    q_start = kv_start = 0
    for q_len, kv_len in zip(q_lens, kv_lens, strict=True):
        qi = q[q_start : q_start + q_len].float().permute(1, 0, 2).requires_grad_()
        ki = k[kv_start : kv_start + kv_len].float().permute(1, 0, 2).requires_grad_()
        vi = v[kv_start : kv_start + kv_len].float().permute(1, 0, 2).requires_grad_()
        repeat = heads // kv_heads
        out, row_max, row_sum = _attention_golden(
            qi, ki.repeat_interleave(repeat, 0), vi.repeat_interleave(repeat, 0), scale
        )
        out.backward(dy[q_start : q_start + q_len].float().permute(1, 0, 2))
        pieces["out"].append(out.detach().permute(1, 0, 2))
        pieces["max"].append(row_max.detach().permute(1, 0, 2).expand(-1, -1, 8))
        pieces["sum"].append(row_sum.detach().permute(1, 0, 2).expand(-1, -1, 8))
        for name, leaf in (("dq", qi), ("dk", ki), ("dv", vi)):
            pieces[name].append(leaf.grad.permute(1, 0, 2))
        q_start, kv_start = q_start + q_len, kv_start + kv_len
    return {name: torch.cat(parts) for name, parts in pieces.items()}


def test_fusion_attention_tnd_gqa_golden_and_backward(emulated):
    """TND (varlen, cumulative ``actual_seq_qlen``/``actual_seq_kvlen``) with 8 query heads
    over 2 key/value heads: output, ``softmax_layout="TND"`` max and sum ``[T, N, 8]``, and
    the gradients of q, k, v (k, v summed over the heads sharing them).

    Source: Ascend/op-plugin test/test_custom_ops/test_npu_flash_attention.py
    (``test_npu_flash_attention_tnd``: q lengths [1, 2, 3], kv lengths [3, 4, 5], N1 8, N2 2,
    ``scale = 1 / sqrt(D)``, float16 inputs, float32 golden; D scaled down from 128).
    """
    import torch_npu

    torch.manual_seed(1)
    heads, kv_heads, dim = 8, 2, 16
    q_lens, kv_lens = [1, 2, 3], [3, 4, 5]
    scale = 1 / dim**0.5

    def sample(tokens, n):
        return (2 * (torch.rand(tokens, n, dim) - 0.5)).half()

    q, k, v = sample(6, heads), sample(12, kv_heads), sample(12, kv_heads)
    dy = sample(6, heads)
    golden = _tnd_golden(q, k, v, dy, q_lens, kv_lens, scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, softmax_max, softmax_sum = torch_npu.npu_fusion_attention(
        *leaves,
        heads,
        "TND",
        scale=scale,
        actual_seq_qlen=tuple(np.cumsum(q_lens).tolist()),
        actual_seq_kvlen=tuple(np.cumsum(kv_lens).tolist()),
        softmax_layout="TND",
    )[:3]
    assert out.shape == (6, heads, dim) and softmax_max.shape == softmax_sum.shape == (6, heads, 8)
    torch.testing.assert_close(out.float(), golden["out"], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(softmax_max, golden["max"], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(softmax_sum, golden["sum"], rtol=1e-3, atol=1e-3)
    out.backward(dy)
    for leaf, name in zip(leaves, ("dq", "dk", "dv"), strict=True):
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == torch.float16
        torch.testing.assert_close(leaf.grad.float(), golden[name], rtol=5e-3, atol=5e-3)

    default_layout = torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        heads,
        "TND",
        scale=scale,
        actual_seq_qlen=tuple(np.cumsum(q_lens).tolist()),
        actual_seq_kvlen=tuple(np.cumsum(kv_lens).tolist()),
    )
    # The API page: without softmax_layout the softmax outputs are laid out N, T, 8.
    torch.testing.assert_close(default_layout[1], softmax_max.detach().transpose(0, 1))


def test_fusion_attention_without_dropout_mask_shapes(emulated):
    """keep_prob 1 and no dropout mask: ``attention_score`` has the query's shape and the
    softmax outputs lead with ``[B, N]``; ``scale`` defaults to 1.

    Sources: Ascend/op-plugin test/test_custom_ops/test_npu_flash_attention.py
    (``test_npu_flash_attention_without_dropout_mask``) and
    docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md (``scale`` default 1).
    """
    import torch_npu

    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 16, 4 * 8) for _ in range(3))
    score, softmax_max, softmax_sum = torch_npu.npu_fusion_attention(q, k, v, 4, "BSH")[:3]
    assert score.shape == q.shape
    assert softmax_max.shape[:2] == softmax_sum.shape[:2] == (2, 4)
    bnsd = [t.view(2, 16, 4, 8).transpose(1, 2) for t in (q, k, v)]
    golden = _attention_golden(*bnsd, 1.0)[0].transpose(1, 2).reshape(2, 16, 32)
    torch.testing.assert_close(score, golden, rtol=1e-5, atol=1e-5)


def test_fusion_attention_tnd_trailing_zero_batches(emulated):
    """TND: trailing 0s in ``actual_seq_qlen``/``actual_seq_kvlen`` mark batches that take no
    part, so ``[2, 5, 9, 0, 0]`` computes what ``[2, 5, 9]`` does, gradients included.

    Source: Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md
    (its constraint on TND: real lengths [2, 3, 4, 5, 6] with the last two batches left out
    are passed as ``[2, 5, 9, 0, 0]``).
    """
    import torch_npu

    results = []
    for ends in ((2, 5, 9, 0, 0), (2, 5, 9)):
        leaves = [
            torch.randn(9, 2, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)
        ]
        for leaf in leaves:
            leaf.requires_grad_()
        out = torch_npu.npu_fusion_attention(
            *leaves, 2, "TND", actual_seq_qlen=ends, actual_seq_kvlen=ends, softmax_layout="TND"
        )
        out[0].sum().backward()
        results.append((out[0], out[1], *(leaf.grad for leaf in leaves)))
    for padded, plain in zip(*results, strict=True):
        torch.testing.assert_close(padded, plain)
