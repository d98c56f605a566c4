"""``mmcv._ext`` multi-scale deformable attention against mmcv's definition.

mmcv 2.1.0 has NO CPU kernel for ``ms_deform_attn_forward/backward`` (CUDA and MLU
only; on the CPU mmcv itself runs the pure-PyTorch
``multi_scale_deformable_attn_pytorch``). So the reference is that function, from the
compiled mmcv 2.1.0 of the ``openmmlab_cpu_ops`` session, and autograd of it for the
backward. The functions are called as ``MultiScaleDeformableAttnFunction`` calls them
(keywords, zeroed gradient buffers that they add into), with sampling locations
outside ``[0, 1]``, one query, no query, one level, half precision and
non-contiguous inputs; on emulated NPU tensors with the portable and the mx_driving
kernel.

Tolerances: float32 1e-5 (values), 1e-4 (gradients: the same sums in another order);
half 1e-2 against the float32 reference.
"""

from __future__ import annotations

import importlib.util

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import msda  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext.registry import IMPLEMENTATIONS  # noqa: E402
from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch  # noqa: E402


VALUES = {"atol": 1e-5, "rtol": 1e-5}
GRADS = {"atol": 1e-4, "rtol": 1e-4}


def _inputs(bs=2, heads=2, dims=8, queries=5, points=3, shapes=((6, 4), (3, 2)), seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(shapes, dtype=torch.long)
    levels, keys = shapes.shape[0], int(shapes.prod(1).sum())
    value = torch.randn(bs, keys, heads, dims, generator=g)
    locations = torch.rand(bs, queries, heads, levels, points, 2, generator=g) * 1.4 - 0.2
    weights = torch.rand(bs, queries, heads, levels, points, generator=g)
    grad = torch.randn(bs, queries, heads * dims, generator=g)
    return value, shapes, locations, weights, grad


def _start(shapes):
    return torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))


def _ext(value, shapes, locations, weights, grad):
    start = _start(shapes).to(shapes.device)
    output = msda.ms_deform_attn_forward(value, shapes, start, locations, weights, im2col_step=64)
    grads = [torch.zeros_like(t) for t in (value, locations, weights)]
    msda.ms_deform_attn_backward(
        value, shapes, start, locations, weights, grad.contiguous(), *grads, im2col_step=64
    )
    return [output, *grads]


def _reference(value, shapes, locations, weights, grad):
    leaves = [t.detach().clone().requires_grad_(True) for t in (value, locations, weights)]
    output = multi_scale_deformable_attn_pytorch(leaves[0], shapes, leaves[1], leaves[2])
    found = torch.autograd.grad(output, leaves, grad)
    return [output.detach(), *found]


def _same(expected, actual, values=VALUES, grads=GRADS):
    for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
        torch.testing.assert_close(
            a, e, **(values if index == 0 else grads), msg=lambda m, i=index: f"result {i}: {m}"
        )


def test_registered_under_mmcvs_names():
    for name in ("ms_deform_attn_forward", "ms_deform_attn_backward"):
        assert IMPLEMENTATIONS[name] is getattr(msda, name)


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"queries": 1},
        {"shapes": ((5, 7),)},
        {"bs": 1, "heads": 4, "dims": 4, "points": 4, "shapes": ((8, 8), (4, 4), (2, 2), (1, 1))},
    ],
    ids=["two-levels", "one-query", "one-level", "four-levels"],
)
def test_matches_mmcvs_pytorch_definition(case):
    inputs = _inputs(**case)
    _same(_reference(*inputs), _ext(*inputs))


def test_no_query():
    value, shapes, locations, weights, grad = _inputs(queries=0)
    output, grad_value, grad_locations, grad_weights = _ext(value, shapes, locations, weights, grad)
    assert output.shape == (2, 0, 16)
    assert grad_value.abs().sum() == 0 and grad_locations.numel() == grad_weights.numel() == 0


def test_gradients_add_into_the_buffers():
    value, shapes, locations, weights, grad = _inputs(seed=1)
    start = _start(shapes)
    buffers = [torch.ones_like(t) for t in (value, locations, weights)]
    msda.ms_deform_attn_backward(value, shapes, start, locations, weights, grad, *buffers, 64)
    expected = _reference(value, shapes, locations, weights, grad)[1:]
    for buffer, e in zip(buffers, expected, strict=True):
        torch.testing.assert_close(buffer - 1, e, **GRADS)


def test_half_precision():
    value, shapes, locations, weights, grad = _inputs(seed=2)
    half = [t.half() for t in (value, locations, weights, grad)]
    actual = _ext(half[0], shapes, half[1], half[2], half[3])
    assert all(t.dtype == torch.half for t in actual)
    expected = _reference(
        half[0].float(), shapes, half[1].float(), half[2].float(), half[3].float()
    )
    tol = {"atol": 1e-2, "rtol": 1e-2}
    _same(expected, [t.float() for t in actual], tol, tol)


def test_non_contiguous_inputs():
    value, shapes, locations, weights, grad = _inputs(seed=3)
    strided = [
        value.transpose(2, 3).contiguous().transpose(2, 3),
        locations.transpose(1, 2).contiguous().transpose(1, 2),
        weights.transpose(1, 2).contiguous().transpose(1, 2),
        grad.transpose(0, 1).contiguous().transpose(0, 1),
    ]
    assert not any(t.is_contiguous() for t in strided)
    expected = _reference(value, shapes, locations, weights, grad)
    _same(expected, _ext(strided[0], shapes, strided[1], strided[2], strided[3]))


@pytest.mark.parametrize("source", ["portable", "mx_driving"])
def test_on_npu_tensors(npu_emulator, monkeypatch, source):
    if source == "mx_driving" and importlib.util.find_spec("mx_driving") is None:
        pytest.skip("the emulator serves no mx_driving")
    monkeypatch.setenv(_kernel_source.VARIABLE, f"multi_scale_deformable_attn={source}")
    _kernel_source.forget_choices()
    calls = []
    if source == "mx_driving":
        import mx_driving

        kernel = mx_driving.multi_scale_deformable_attn
        monkeypatch.setattr(
            mx_driving,
            "multi_scale_deformable_attn",
            lambda *a, **k: calls.append(1) or kernel(*a, **k),
        )
    try:
        inputs = _inputs(seed=4)
        expected = _reference(*inputs)
        actual = _ext(*(t.to("npu") for t in inputs))
        _same(expected, [t.cpu() for t in actual])
        assert len(calls) == (2 if source == "mx_driving" else 0)
    finally:
        _kernel_source.forget_choices()


def test_through_mmcvs_function(monkeypatch):
    """mmcv's own MultiScaleDeformableAttnFunction (its calls, its buffers) on these."""
    import types

    from mmcv.ops import multi_scale_deform_attn

    ours = types.SimpleNamespace(
        ms_deform_attn_forward=msda.ms_deform_attn_forward,
        ms_deform_attn_backward=msda.ms_deform_attn_backward,
    )
    monkeypatch.setattr(multi_scale_deform_attn, "ext_module", ours)
    value, shapes, locations, weights, grad = _inputs(seed=5)
    leaves = [t.clone().requires_grad_(True) for t in (value, locations, weights)]
    out = multi_scale_deform_attn.MultiScaleDeformableAttnFunction.apply(
        leaves[0], shapes, _start(shapes), leaves[1], leaves[2], 64
    )
    out.backward(grad)
    expected = _reference(value, shapes, locations, weights, grad)
    _same(expected, [out.detach()] + [leaf.grad for leaf in leaves])
