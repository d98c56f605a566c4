"""The emulated ops under tracing: every op has a fake (shape-only) kernel with torch_npu's
shape rules, and the in-place ops functionalize (make_fx, torch.func.functionalize,
torch.compile) instead of failing on their aliased outputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree


def _samples():
    path = Path(__file__).with_name("test_kernel_contracts.py")
    spec = importlib.util.spec_from_file_location("_emulator_contract_samples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SAMPLES


SAMPLES = _samples()


def _op(qualified):
    name, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.npu, name), overload or "default")


def _t(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _fake_call(op, args, kwargs):
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        fake_args, fake_kwargs = pytree.tree_map_only(
            torch.Tensor, mode.from_tensor, (args, kwargs)
        )
        return op(*fake_args, **fake_kwargs)


def test_traced_npu_tensors_are_where_emulated_ones_are(emulated):
    """A factory naming ``npu`` inside a compiled function met CPU inputs: "Tensor device
    mismatch" under the emulator only (emulated NPU tensors are CPU tensors)."""
    x = torch.randn(3, 4, device="npu")
    with FakeTensorMode() as mode:
        fake_x = mode.from_tensor(x)
        made = torch.ones(4, device="npu") + fake_x
        moved = torch.zeros(2).to("npu:0")
    assert made.device == x.device == moved.device == torch.device("cpu")

    def compute(x):
        return x * torch.arange(x.shape[-1], device="npu") + torch.ones(1, device="npu")

    traced = make_fx(compute, tracing_mode="fake")(x)
    torch.testing.assert_close(traced(x), compute(x))


def test_every_emulated_op_has_a_fake_kernel(emulated):
    from ascend_patch_emulator._tracing import installed_fakes

    assert sorted(installed_fakes()) == sorted(emulated.implemented)


@pytest.mark.parametrize("qualified", sorted(SAMPLES))
def test_fake_kernel_matches_the_reference_kernel(emulated, qualified):
    """Same output structure, shapes and dtypes as the real call, and no real tensor."""
    args, kwargs = SAMPLES[qualified]()
    real = _op(qualified)(
        *(a.clone() if isinstance(a, torch.Tensor) else a for a in args), **kwargs
    )
    fake = _fake_call(_op(qualified), args, kwargs)
    real_leaves, real_spec = pytree.tree_flatten(real)
    fake_leaves, fake_spec = pytree.tree_flatten(fake)
    assert real_spec == fake_spec
    for r, f in zip(real_leaves, fake_leaves, strict=True):
        if isinstance(r, torch.Tensor):
            assert isinstance(f, FakeTensor), f"{qualified} returned a real tensor in fake mode"
            assert f.dtype == r.dtype
            assert len(f.shape) == len(r.shape)
            for fs, rs in zip(f.shape, r.shape, strict=True):
                if isinstance(fs, int):
                    assert fs == rs, (qualified, tuple(f.shape), tuple(r.shape))
        elif qualified == "get_npu_format":
            assert int(f) == int(r)


def test_rotary_mul_fake_accepts_an_odd_last_dim(emulated):
    """torch_npu's meta kernel is empty_like(self); its fake tests use a last dim of 125."""
    x, r = _t(2, 8, 4, 125), _t(1, 8, 1, 125, seed=1)
    out = _fake_call(torch.ops.npu.npu_rotary_mul, (x, r, r), {})
    assert isinstance(out, FakeTensor) and out.shape == x.shape and out.dtype == x.dtype


@pytest.mark.parametrize(
    ("layout", "shape", "stats"),
    [
        ("BNSD", (2, 4, 16, 8), (2, 4, 16, 8)),
        ("BSND", (2, 16, 4, 8), (2, 4, 16, 8)),
        ("BSH", (2, 16, 32), (2, 4, 16, 8)),
        ("SBH", (16, 2, 32), (2, 4, 16, 8)),
    ],
)
def test_fusion_attention_fake_returns_fake_tensors(emulated, layout, shape, stats):
    q = _t(*shape, dtype=torch.float16)
    out = _fake_call(torch.ops.npu.npu_fusion_attention, (q, q, q, 4, layout), {})
    assert all(isinstance(t, FakeTensor) for t in out[:4])
    assert out[0].shape == q.shape and out[0].dtype == torch.float16
    assert out[1].shape == stats and out[1].dtype == torch.float32
    assert out[2].shape == stats and out[3].shape == (0,)
    assert out[4:] == (0, 0, 0)


def test_fusion_attention_fake_tnd(emulated):
    q = _t(10, 4, 8)
    kwargs = {"actual_seq_qlen": [4, 10], "actual_seq_kvlen": [4, 10]}
    out = _fake_call(torch.ops.npu.npu_fusion_attention, (q, q, q, 4, "TND"), kwargs)
    assert out[0].shape == (10, 4, 8) and out[1].shape == (4, 10, 8)
    real = torch.ops.npu.npu_fusion_attention(q, q, q, 4, "TND", **kwargs)
    assert real[1].shape == out[1].shape


def test_grouped_matmul_fake_several_weights_group_type_minus_one(emulated):
    x = [_t(3, 4), _t(5, 4, seed=1), _t(2, 4, seed=2)]
    w = [_t(4, 6, seed=3), _t(4, 7, seed=4), _t(4, 8, seed=5)]
    out = _fake_call(torch.ops.npu.npu_grouped_matmul, (x, w), {"group_type": -1})
    assert [tuple(t.shape) for t in out] == [(3, 6), (5, 7), (2, 8)]
    real = torch.ops.npu.npu_grouped_matmul(x, w, group_type=-1)
    assert [t.shape for t in real] == [t.shape for t in out]


@pytest.mark.parametrize("split_item", [0, 1])
def test_grouped_matmul_one_x_split_by_group_list_under_group_type_minus_one(emulated, split_item):
    """One x, several weights and a cumulative group_list under group_type -1: op-plugin sizes
    one output per group from group_list (its eager op and meta kernel), so x's rows are split."""
    x = _t(9, 4, dtype=torch.float64)
    w = [_t(4, n, seed=s, dtype=torch.float64) for s, n in ((1, 3), (2, 5), (3, 2))]
    b = [_t(n, seed=s, dtype=torch.float64) for s, n in ((4, 3), (5, 5), (6, 2))]
    kwargs = {"bias": b, "group_list": [2, 6, 9], "split_item": split_item, "group_type": -1}
    real = torch.ops.npu.npu_grouped_matmul([x], w, **kwargs)
    for out, (start, end), wi, bi in zip(real, [(0, 2), (2, 6), (6, 9)], w, b, strict=True):
        torch.testing.assert_close(out, x[start:end] @ wi + bi)
    fake = _fake_call(torch.ops.npu.npu_grouped_matmul, ([x], w), kwargs)
    assert [tuple(t.shape) for t in fake] == [(2, 3), (4, 5), (3, 2)]


def test_grouped_matmul_fake_list_of_x_split_item_2(emulated):
    x = [_t(3, 4), _t(5, 4, seed=1)]
    w = [_t(4, 6, seed=3), _t(4, 6, seed=4)]
    kwargs = {"split_item": 2, "group_type": -1}
    out = _fake_call(torch.ops.npu.npu_grouped_matmul, (x, w), kwargs)
    assert len(out) == 1 and out[0].shape == (8, 6)
    assert torch.ops.npu.npu_grouped_matmul(x, w, **kwargs)[0].shape == (8, 6)


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_group_type_2_splits_k(emulated, group_list_type):
    """The weight-gradient form: x = inp.T [K_in, M], weight = grad [M, N], M split by group_list."""
    inp, grad = _t(9, 4, dtype=torch.float64), _t(9, 5, seed=1, dtype=torch.float64)
    counts = [2, 0, 4, 3]
    group_list = torch.tensor(counts if group_list_type else [2, 2, 6, 9])
    kwargs = {"group_list": group_list, "split_item": 3, "group_type": 2}
    kwargs["group_list_type"] = group_list_type
    (out,) = torch.ops.npu.npu_grouped_matmul([inp.T], [grad], **kwargs)
    assert out.shape == (4, 4, 5)
    start = 0
    for e, count in enumerate(counts):
        torch.testing.assert_close(
            out[e], inp[start : start + count].T @ grad[start : start + count]
        )
        start += count
    (fake,) = _fake_call(torch.ops.npu.npu_grouped_matmul, ([inp.T], [grad]), kwargs)
    assert isinstance(fake, FakeTensor) and fake.shape == out.shape


def test_grouped_matmul_invalid_group_type_says_what_upstream_says(emulated):
    x, w = [_t(3, 4)], [_t(4, 6, seed=1)]
    with pytest.raises(RuntimeError, match="group_type only supports"):
        torch.ops.npu.npu_grouped_matmul(x, w, group_type=1)
    with pytest.raises(RuntimeError, match="group_type only supports"):
        _fake_call(torch.ops.npu.npu_grouped_matmul, (x, w), {"group_type": 1})


def test_nms_v4_fake_size_is_data_dependent_unless_padded(emulated):
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]])
    scores = torch.tensor([0.9, 0.8])
    args = (boxes, scores, 5, torch.tensor(0.5), torch.tensor(0.1))
    padded = _fake_call(torch.ops.npu.npu_nms_v4, (*args, True), {})
    assert padded[0].shape == (5,) and padded[1].shape == ()
    unpadded = _fake_call(torch.ops.npu.npu_nms_v4, args, {})
    assert not isinstance(unpadded[0].shape[0], int)


# --- functionalization of the in-place ops ---------------------------------------------


def _inplace_program(x, indices, updates):
    y = x * 2
    torch.ops.npu.npu_scatter_nd_update_(y, indices, updates)
    torch.ops.npu.npu_silu_(y)
    return y + 1


def _mutates_input(x, indices, updates):
    torch.ops.npu.npu_scatter_nd_update_(x, indices, updates)
    return torch.ops.npu.npu_silu_(x)


def _inputs():
    return _t(4, 2), torch.tensor([[1], [3]]), _t(2, 2, seed=1)


def test_inplace_ops_have_functional_twins(emulated):
    from ascend_patch_emulator._tracing import installed_functionalizations

    found = installed_functionalizations()
    assert found["npu_silu_"] == "npu_silu"
    assert found["npu_scatter_nd_update_"] == "npu_scatter_nd_update"


@pytest.mark.parametrize("tracing_mode", ["real", "fake"])
def test_make_fx_functionalizes_the_inplace_ops(emulated, tracing_mode):
    x, indices, updates = _inputs()
    graph = make_fx(torch.func.functionalize(_inplace_program), tracing_mode=tracing_mode)(
        x, indices, updates
    )
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert "npu.npu_scatter_nd_update.default" in targets
    assert "npu.npu_silu.default" in targets
    assert not any(t.startswith(("npu.npu_silu_", "npu.npu_scatter_nd_update_")) for t in targets)
    torch.testing.assert_close(graph(x, indices, updates), _inplace_program(x, indices, updates))


def test_functionalized_graph_writes_the_mutated_input_back(emulated):
    x, indices, updates = _inputs()
    expected = x.clone()
    returned = _mutates_input(expected, indices, updates)
    assert returned is expected
    graph = make_fx(torch.func.functionalize(_mutates_input), tracing_mode="fake")(
        x, indices, updates
    )
    assert any(node.target is torch.ops.aten.copy_.default for node in graph.graph.nodes)
    target = x.clone()
    out = graph(target, indices, updates)
    torch.testing.assert_close(target, expected)
    torch.testing.assert_close(out, expected)
    eager = x.clone()
    torch.testing.assert_close(
        torch.func.functionalize(_mutates_input)(eager, indices, updates), expected
    )
    torch.testing.assert_close(eager, expected)


def test_torch_compile_runs_the_inplace_ops(emulated):
    x, indices, updates = _inputs()
    expected = x.clone()
    _mutates_input(expected, indices, updates)
    compiled = torch.compile(_mutates_input, backend="aot_eager", fullgraph=True)
    target = x.clone()
    out = compiled(target, indices, updates)
    torch.testing.assert_close(target, expected)
    assert out is target


def test_format_cast_from_a_source_tensor_has_no_false_twin(emulated):
    """npu_format_cast_(self, src) writes src's values; npu_format_cast.Tensor casts self."""
    from ascend_patch_emulator._tracing import installed_functionalizations

    found = installed_functionalizations()
    assert "npu_format_cast_" not in found
    if "npu_format_cast_.acl_format" in found:
        assert found["npu_format_cast_.acl_format"] == "npu_format_cast"


def test_meta_tensors_take_the_fake_kernels(emulated):
    x = torch.empty(2, 8, 4, 125, device="meta")
    assert torch.ops.npu.npu_rotary_mul(x, x, x).device.type == "meta"
    q = torch.empty(2, 4, 16, 8, device="meta")
    out = torch.ops.npu.npu_fusion_attention(q, q, q, 4, "BNSD")
    assert out[0].device.type == "meta" and out[1].shape == (2, 4, 16, 8)
