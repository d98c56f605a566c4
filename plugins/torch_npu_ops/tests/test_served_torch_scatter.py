"""The torch_scatter-compatible module: known answers, the served module, and real torch_scatter parity."""

from __future__ import annotations

import sys
import types

import ascend_patch_torch.served.torch_scatter as compat
import pytest
import torch
from ascend_patch_torch import groups
from ascend_patch_torch import runtime
from ascend_patch_torch.groups import TorchScatter
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st


# --------------------------------------------------------------------------- known answers


def test_scatter_max_min_known_answers():
    src = torch.tensor([1.0, 3.0, 3.0, 2.0, -5.0])
    index = torch.tensor([0, 0, 0, 1, 3])
    values, arg = compat.scatter_max(src, index)
    assert values.tolist() == [3.0, 2.0, 0.0, -5.0]  # slot 2 is empty: value 0 ...
    assert arg.tolist() == [1, 3, 5, 4]  # ... argmax src.size(0); ties: the first
    assert arg.dtype is torch.long
    values, arg = compat.scatter_min(src, index, dim_size=5)
    assert values.tolist() == [1.0, 2.0, 0.0, -5.0, 0.0]
    assert arg.tolist() == [0, 3, 5, 4, 5]


def test_scatter_reductions_known_answers():
    src = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    index = torch.tensor([0, 1, 0, 1])
    assert compat.scatter(src, index, reduce="sum").tolist() == [[4.0, 6.0]]
    assert compat.scatter(src, index, reduce="mean").tolist() == [[2.0, 3.0]]
    assert compat.scatter(src, index, reduce="mul").tolist() == [[3.0, 8.0]]
    assert compat.scatter(src, index, reduce="max").tolist() == [[3.0, 4.0]]
    assert compat.scatter_mean(torch.tensor([1, 2, 4]), torch.tensor([0, 0, 0])).tolist() == [2]
    with pytest.raises(ValueError, match="reduce"):
        compat.scatter(src, index, reduce="median")


def test_segment_known_answers():
    src = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    indptr = torch.tensor([0, 2, 2, 5, 6])
    assert compat.segment_csr(src, indptr).tolist() == [3.0, 0.0, 12.0, 6.0]
    assert compat.segment_csr(src, indptr, reduce="mean").tolist() == [1.5, 0.0, 4.0, 6.0]
    values, arg = compat.segment_max_csr(src, indptr)
    assert values.tolist() == [2.0, 0.0, 5.0, 6.0]
    assert arg.tolist() == [1, 6, 4, 5]
    index = torch.tensor([0, 0, 2, 2, 2, 3])
    assert compat.segment_coo(src, index).tolist() == [3.0, 0.0, 12.0, 6.0]
    assert compat.gather_csr(torch.tensor([10.0, 20.0, 30.0, 40.0]), indptr).tolist() == [
        10.0,
        10.0,
        30.0,
        30.0,
        30.0,
        40.0,
    ]
    assert compat.gather_coo(torch.tensor([10.0, 20.0]), torch.tensor([1, 0, 1])).tolist() == [
        20.0,
        10.0,
        20.0,
    ]


def test_softmax_sums_to_one_per_group():
    src = torch.randn(7, dtype=torch.float64)
    index = torch.tensor([0, 1, 0, 2, 1, 1, 0])
    soft = compat.scatter_softmax(src, index)
    torch.testing.assert_close(compat.scatter_sum(soft, index), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(compat.scatter_log_softmax(src, index).exp(), soft)


def test_max_gradient_goes_to_the_arg_element_only():
    src = torch.tensor([2.0, 2.0, 1.0], requires_grad=True)
    compat.scatter_max(src, torch.tensor([0, 0, 0]))[0].sum().backward()
    assert src.grad.tolist() == [1.0, 0.0, 0.0]


# --------------------------------------------------------------------------- served module


def test_import_rules_only_where_torch_scatter_is_missing_and_an_npu_is_there(monkeypatch):
    monkeypatch.setattr(groups, "torch_scatter_installed", lambda: False)
    monkeypatch.setattr(runtime, "npu_runtime_importable", lambda: True)
    assert [r.module for r in groups.import_rules()] == [
        "torch_scatter",
        "torch_scatter.composite",
        "torch_scatter.utils",
    ]
    monkeypatch.setattr(runtime, "npu_runtime_importable", lambda: False)
    assert groups.import_rules() == []
    monkeypatch.setattr(runtime, "npu_runtime_importable", lambda: True)
    monkeypatch.setattr(groups, "torch_scatter_installed", lambda: True)
    assert groups.import_rules() == []


def test_the_served_module_is_a_drop_in(isolated_patcher, monkeypatch):
    if any(name == "torch_scatter" or name.startswith("torch_scatter.") for name in sys.modules):
        pytest.skip("the real torch_scatter is already imported in this process")
    monkeypatch.setattr(groups, "torch_scatter_installed", lambda: False)
    monkeypatch.setattr(runtime, "npu_runtime_importable", lambda: True)
    isolated_patcher.add(*groups.import_rules()).apply()

    import torch_scatter
    from torch_scatter import scatter_max
    from torch_scatter.composite import scatter_softmax
    from torch_scatter.utils import broadcast

    assert torch_scatter.__version__ == compat.VERSION
    assert scatter_max is compat.scatter_max
    assert scatter_softmax is compat.scatter_softmax
    assert broadcast is compat.broadcast
    assert set(torch_scatter.__all__) >= {"scatter", "segment_csr", "gather_coo", "scatter_std"}
    isolated_patcher.revert()
    assert "torch_scatter" not in sys.modules


# --------------------------------------------------------------------------- mx_driving kernels


@pytest.fixture
def fake_mx_driving(npu_emulator):
    """An mx_driving with its real signatures, computing with the torch path; records calls.

    It stands in for the emulated mx_driving, which the emulator imports when it is
    activated, and gives that module back before the emulator is deactivated (it takes
    it out of sys.modules). Not with ``monkeypatch``: the suite's autouse fixtures set
    that up before the emulator, so it would put the emulated module back after the
    emulator has gone, for every later test to find.
    """
    seen = []
    module = types.ModuleType("mx_driving")

    def scatter_max(
        updates, indices, out=None
    ):  # ScatterMaxFunction.forward(ctx, updates, indices, out)
        assert indices.dtype is torch.int32 and updates.dtype is torch.float32
        seen.append("scatter_max")
        values, arg = compat._scatter_arg(updates, indices.long(), 0, out, None, "amax")
        return values, arg.int()

    def _sum(src, index, dim, dim_size):
        index = compat.broadcast(index.long(), src, dim)
        return src.new_zeros(compat._out_size(src, index, dim, dim_size)).scatter_add_(
            dim, index, src
        )

    def scatter_mean(src, index, out=None, dim=0, dim_size=None):
        assert index.dtype is torch.int32
        seen.append("scatter_mean")
        return _sum(src, index, dim, dim_size) / _sum(
            torch.ones_like(src), index, dim, dim_size
        ).clamp(min=1)

    def scatter_add(src, index, out=None, dim=0, dim_size=None):
        assert index.dtype is torch.int32
        seen.append("scatter_add")
        return _sum(src, index, dim, dim_size)

    module.scatter_max = scatter_max
    module.scatter_mean = scatter_mean
    module.scatter_add = scatter_add
    emulated = sys.modules.get("mx_driving")
    sys.modules["mx_driving"] = module
    try:
        yield seen
    finally:
        if emulated is None:
            sys.modules.pop("mx_driving", None)
        else:
            sys.modules["mx_driving"] = emulated


def test_mx_driving_kernels_are_called_with_their_own_signatures(npu_emulator, fake_mx_driving):
    src = torch.randn(6, 3, device="npu")
    index = torch.tensor([0, 1, 0, 2, 1, 0], device="npu")
    expected_max = compat._scatter_arg(src, index, 0, None, None, "amax")
    values, arg = compat.scatter_max(src, index, 0)
    torch.testing.assert_close(values, expected_max[0])
    assert arg.dtype is torch.long and arg.tolist() == expected_max[1].tolist()
    torch.testing.assert_close(
        compat.scatter_sum(src, index, 0), src.new_zeros(3, 3).index_add_(0, index, src)
    )
    compat.scatter_mean(src, index, 0)
    assert fake_mx_driving == ["scatter_max", "scatter_add", "scatter_mean"]


def test_mx_driving_is_not_used_off_its_domain(npu_emulator, fake_mx_driving):
    half = torch.randn(
        4, 2, device="npu"
    ).half()  # the DrivingSDK patcher cast this to float32: a silent dtype change
    index = torch.tensor([0, 1, 1, 0])
    assert compat.scatter_max(half, index, 0)[0].dtype is torch.float16
    compat.scatter_max(torch.randn(4, 2), index, 0, dim_size=3)  # dim_size: not in mx's signature
    compat.scatter_max(torch.randn(2, 4), index, 1)  # dim 1
    assert fake_mx_driving == []


# --------------------------------------------------------------------------- parity with torch_scatter


@st.composite
def scatter_case(draw):
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    dim = draw(st.integers(-rank, rank - 1))
    size = shape[dim]
    broadcast_index = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    # Rounded values make ties (the argmax rule) likely.
    src = (torch.randn(shape, generator=generator, dtype=torch.float64) * 2).round()
    groups = draw(st.integers(1, 4))
    if broadcast_index:
        index = torch.randint(0, groups, (size,), generator=generator)
    else:
        index = torch.randint(0, groups, shape, generator=generator)
    dim_size = draw(st.one_of(st.none(), st.just(groups + 1)))
    return src, index, dim, dim_size


def _assert_same(actual, expected):
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _assert_same(a, e)
        return
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(
    scatter_case(),
    st.sampled_from(["scatter_sum", "scatter_mean", "scatter_max", "scatter_min", "scatter_mul"]),
)
def test_scatter_matches_torch_scatter(torch_scatter, case, name):
    src, index, dim, dim_size = case
    expected = getattr(torch_scatter, name)(src, index, dim, dim_size=dim_size)
    _assert_same(getattr(compat, name)(src, index, dim, dim_size=dim_size), expected)


@settings(max_examples=60, deadline=None)
@given(
    scatter_case(), st.sampled_from(["scatter_sum", "scatter_mean", "scatter_max", "scatter_min"])
)
def test_scatter_gradients_match_torch_scatter(torch_scatter, case, name):
    src, index, dim, dim_size = case
    ours, theirs = src.clone().requires_grad_(), src.clone().requires_grad_()
    out_ours = getattr(compat, name)(ours, index, dim, dim_size=dim_size)
    out_theirs = getattr(torch_scatter, name)(theirs, index, dim, dim_size=dim_size)
    if isinstance(out_ours, tuple):
        out_ours, out_theirs = out_ours[0], out_theirs[0]
    weight = torch.arange(out_theirs.numel(), dtype=src.dtype).reshape(out_theirs.shape)
    (out_ours * weight).sum().backward()
    (out_theirs * weight).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


@settings(max_examples=60, deadline=None)
@given(
    scatter_case(),
    st.sampled_from(["scatter_softmax", "scatter_log_softmax", "scatter_std", "scatter_logsumexp"]),
)
def test_composites_match_torch_scatter(torch_scatter, case, name):
    src, index, dim, _ = case
    _assert_same(
        getattr(compat, name)(src, index, dim), getattr(torch_scatter, name)(src, index, dim)
    )


@st.composite
def segment_case(draw):
    batch = draw(st.integers(1, 3))
    segments = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 3), min_size=segments, max_size=segments))
    extent = sum(lengths)
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    src = (torch.randn(batch, extent, 2, generator=generator, dtype=torch.float64) * 2).round()
    indptr = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    index = torch.repeat_interleave(torch.arange(segments), torch.tensor(lengths))
    return src, indptr, index, segments


@settings(max_examples=100, deadline=None)
@given(segment_case(), st.sampled_from(["sum", "mean", "min", "max"]))
def test_segments_match_torch_scatter(torch_scatter, case, reduce):
    src, indptr, index, segments = case
    if src.size(1) == 0:
        return  # torch_scatter rejects some empty inputs its own way
    _assert_same(
        compat.segment_csr(src, indptr.expand(src.size(0), -1), reduce=reduce),
        torch_scatter.segment_csr(src, indptr.expand(src.size(0), -1), reduce=reduce),
    )
    coo_index = index.expand(src.size(0), -1)
    _assert_same(
        compat.segment_coo(src, coo_index, dim_size=segments, reduce=reduce),
        torch_scatter.segment_coo(src, coo_index, dim_size=segments, reduce=reduce),
    )
    if reduce in ("min", "max"):
        name = f"segment_{reduce}_csr"
        _assert_same(
            getattr(compat, name)(src, indptr.expand(src.size(0), -1)),
            getattr(torch_scatter, name)(src, indptr.expand(src.size(0), -1)),
        )


@settings(max_examples=60, deadline=None)
@given(segment_case())
def test_gathers_match_torch_scatter(torch_scatter, case):
    src, indptr, index, segments = case
    values = torch.randn(src.size(0), segments, 2, dtype=torch.float64)
    if src.size(1) == 0:
        return
    _assert_same(
        compat.gather_csr(values, indptr.expand(src.size(0), -1)),
        torch_scatter.gather_csr(values, indptr.expand(src.size(0), -1)),
    )
    _assert_same(
        compat.gather_coo(values, index.expand(src.size(0), -1)),
        torch_scatter.gather_coo(values, index.expand(src.size(0), -1)),
    )


def test_out_arguments_match_torch_scatter(torch_scatter):
    src = torch.tensor([1.0, 3.0, 3.0, 2.0, 5.0])
    index = torch.tensor([0, 0, 0, 1, 3])
    for name in ("scatter_max", "scatter_min", "scatter_sum", "scatter_mean"):
        ours, theirs = torch.full((4,), 2.5), torch.full((4,), 2.5)
        _assert_same(
            getattr(compat, name)(src, index, out=ours),
            getattr(torch_scatter, name)(src, index, out=theirs),
        )
        _assert_same(ours, theirs)


# --------------------------------------------------------------------------- installed torch_scatter


def test_installed_torch_scatter_is_routed_for_npu_tensors(
    torch_scatter, npu_emulator, isolated_patcher
):
    isolated_patcher.add(TorchScatter).apply()
    src = torch.randn(5, 2, device="npu")
    index = torch.tensor([0, 1, 0, 1, 1])
    values, _ = torch_scatter.scatter_max(src, index, 0)
    torch.testing.assert_close(values, compat.scatter_max(src, index, 0)[0])
    from torch_scatter.composite import scatter_softmax

    scatter_softmax(src, index, 0)
    counters = isolated_patcher.report.get("torch_scatter.scatter:scatter_max").counters
    assert counters.replacement_calls == 1
