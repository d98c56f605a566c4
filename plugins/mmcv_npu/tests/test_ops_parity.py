"""The op groups against mmcv's own implementation: values and gradients.

Runs in the nox session ``openmmlab_cpu_ops``: mmcv 2.1.0 built with its compiled
CPU kernels, which are the reference for the deformable convolutions; for
multi-scale deformable attention mmcv has no CPU kernel, and the reference is its
pure-PyTorch ``multi_scale_deformable_attn_pytorch``. The patched calls run on
emulated NPU tensors, once per kernel source (``ASCEND_PATCH_MMCV_KERNELS``): the
numbers show the replacement computes what mmcv computes; they say nothing of NPU
speed (emulated).

Tolerances: float32 throughout; 1e-4 absolute and relative on values and gradients
(the kernels sum the same products in another order).
"""

from __future__ import annotations

import importlib.util

import pytest
from mmcv_stacks import require_stack
from mmcv_stacks import required


require_stack("mmcv-ops")

import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.groups import DeformConv  # noqa: E402
from ascend_patch_mmcv.groups import ModulatedDeformConv  # noqa: E402
from ascend_patch_mmcv.groups import MultiScaleDeformableAttention  # noqa: E402


TOL = {"atol": 1e-4, "rtol": 1e-4}


def _sources(*available: str) -> list[object]:
    params: list[object] = []
    for source in available:
        marks = []
        if source == _kernel_source.MX_DRIVING:
            marks.append(
                pytest.mark.skipif(
                    importlib.util.find_spec("ascend_patch_emulator") is None,
                    reason="needs the emulator's mx_driving",
                )
            )
        params.append(pytest.param(source, marks=marks, id=source))
    return params


@pytest.fixture
def use_source(monkeypatch, npu_emulator, request):
    """Force one kernel source, choose again; the emulator must serve mx_driving."""
    source = request.param
    if source == _kernel_source.MX_DRIVING and importlib.util.find_spec("mx_driving") is None:
        # The session with mmcv's ops promises the emulator's mx_driving: missing, a failure.
        (pytest.fail if required("mmcv-ops") else pytest.skip)("the emulator serves no mx_driving")
    monkeypatch.setenv(_kernel_source.VARIABLE, source)
    _kernel_source.forget_choices()
    yield source
    _kernel_source.forget_choices()


def _leaves(*tensors):
    cpu = [t.detach().clone().requires_grad_(True) for t in tensors]
    npu = [t.detach().clone().to("npu").requires_grad_(True) for t in tensors]
    return cpu, npu


def _assert_same(expected, actual, cpu_inputs, npu_inputs):
    torch.testing.assert_close(actual.cpu(), expected, **TOL)
    cotangent = torch.randn_like(expected)
    expected.backward(cotangent)
    actual.backward(cotangent.to(actual.device))
    for index, (a, b) in enumerate(zip(cpu_inputs, npu_inputs, strict=True)):
        torch.testing.assert_close(
            b.grad.cpu(), a.grad, **TOL, msg=lambda m, i=index: f"input {i}: {m}"
        )


def _counters(patcher, target):
    return patcher.report.get(target).counters


# ----------------------------------------------------------------------- deformable attention


def _msda_inputs(bs=2, heads=2, dims=8, levels=2, points=3, queries=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = torch.tensor([[6, 4], [3, 2]][:levels], dtype=torch.long)
    keys = int(shapes.prod(1).sum())
    value = torch.randn(bs, keys, heads, dims, generator=generator)
    locations = torch.rand(bs, queries, heads, levels, points, 2, generator=generator) * 1.2 - 0.1
    weights = torch.rand(bs, queries, heads, levels, points, generator=generator)
    weights = weights / weights.sum((-1, -2), keepdim=True)
    return value, shapes, locations, weights


@pytest.mark.parametrize("use_source", _sources("mx_driving", "portable"), indirect=True)
def test_msda_function_matches_mmcvs_definition(use_source, isolated_patcher):
    from ascend_patch_mmcv.msda import level_start_index
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch

    value, shapes, locations, weights = _msda_inputs()
    (cv, cl, cw), (nv, nl, nw) = _leaves(value, locations, weights)
    expected = multi_scale_deformable_attn_pytorch(cv, shapes, cl, cw)
    isolated_patcher.add(MultiScaleDeformableAttention).apply()
    npu_shapes = shapes.to("npu")
    actual = MultiScaleDeformableAttnFunction.apply(
        nv, npu_shapes, level_start_index(npu_shapes), nl, nw, 64
    )
    _assert_same(expected, actual, [cv, cl, cw], [nv, nl, nw])
    target = "mmcv.ops.multi_scale_deform_attn:MultiScaleDeformableAttnFunction.apply"
    assert _counters(isolated_patcher, target).replacement_calls == 1
    assert isolated_patcher.report.get(target).note == f"kernel: {use_source}"


@pytest.mark.parametrize("use_source", _sources("mx_driving", "portable"), indirect=True)
def test_msda_module_matches_on_npu(use_source, isolated_patcher):
    from mmcv.ops import MultiScaleDeformableAttention as Attention

    torch.manual_seed(0)
    module = Attention(
        embed_dims=16, num_heads=2, num_levels=2, num_points=2, dropout=0.0, batch_first=True
    )
    module.init_weights()
    shapes = torch.tensor([[6, 4], [3, 2]])
    keys = int(shapes.prod(1).sum())
    query, value = torch.randn(2, 5, 16), torch.randn(2, keys, 16)
    reference = torch.rand(2, 5, 2, 2)
    start = torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))
    (cq, cv), (nq, nv) = _leaves(query, value)
    expected = module(
        cq, value=cv, reference_points=reference, spatial_shapes=shapes, level_start_index=start
    )
    isolated_patcher.add(MultiScaleDeformableAttention).apply()
    npu_module = Attention(
        embed_dims=16, num_heads=2, num_levels=2, num_points=2, dropout=0.0, batch_first=True
    )
    npu_module.load_state_dict(module.state_dict())
    npu_module.to("npu")
    actual = npu_module(
        nq,
        value=nv,
        reference_points=reference.to("npu"),
        spatial_shapes=shapes.to("npu"),
        level_start_index=start.to("npu"),
    )
    _assert_same(expected, actual, [cq, cv], [nq, nv])
    if use_source == _kernel_source.MX_DRIVING:
        target = "mmcv.ops.multi_scale_deform_attn:multi_scale_deformable_attn_pytorch"
        assert _counters(isolated_patcher, target).replacement_calls == 1


def test_msda_leaves_cpu_tensors_to_mmcv(isolated_patcher, monkeypatch):
    # Without the emulator (no NPU tensor anywhere) every call goes to mmcv's code.
    from mmcv.ops import multi_scale_deform_attn

    original = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch
    monkeypatch.setenv(_kernel_source.VARIABLE, "portable")
    _kernel_source.forget_choices()
    isolated_patcher.add(MultiScaleDeformableAttention).apply()
    value, shapes, locations, weights = _msda_inputs()
    torch.testing.assert_close(
        multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
            value, shapes, locations, weights
        ),
        original(value, shapes, locations, weights),
    )
    start = torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))
    with pytest.raises(RuntimeError, match="device cpu not found"):
        multi_scale_deform_attn.MultiScaleDeformableAttnFunction.apply(
            value, shapes, start, locations, weights, 64
        )
    target = "mmcv.ops.multi_scale_deform_attn:MultiScaleDeformableAttnFunction.apply"
    counters = isolated_patcher.report.get(target).counters
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 1)
    _kernel_source.forget_choices()


# ----------------------------------------------------------------------- deformable convolution

CONV_CASES = {
    # name: (in, out, kernel, stride, padding, dilation, groups, deform_groups, size)
    "3x3": (4, 6, (3, 3), 1, 1, 1, 1, 1, (7, 6)),
    "strided-dilated": (4, 4, (3, 3), 2, 2, 2, 1, 2, (9, 8)),
    "grouped-nonsquare": (4, 6, (3, 2), (1, 2), (1, 0), 1, 2, 2, (6, 7)),
    "mx-domain": (64, 64, (3, 3), 1, 1, 1, 1, 1, (5, 5)),
}


def _conv_inputs(case, modulated, seed=0):
    cin, cout, (kh, kw), stride, padding, dilation, groups, dg, (h, w) = CONV_CASES[case]
    generator = torch.Generator().manual_seed(seed)
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    x = torch.randn(2, cin, h, w, generator=generator)
    offset = torch.randn(2, dg * 2 * kh * kw, ho, wo, generator=generator) * 1.5
    mask = torch.rand(2, dg * kh * kw, ho, wo, generator=generator) if modulated else None
    weight = torch.randn(cout, cin // groups, kh, kw, generator=generator) * 0.2
    bias = torch.randn(cout, generator=generator) if modulated else None
    return x, offset, mask, weight, bias, (stride, padding, dilation, groups, dg)


@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize(
    "use_source", _sources("mx_driving", "torch_npu", "portable"), indirect=True
)
def test_deform_conv_matches_mmcvs_cpu_kernel(use_source, case, isolated_patcher):
    from mmcv.ops.deform_conv import deform_conv2d

    x, offset, _, weight, _, (stride, padding, dilation, groups, dg) = _conv_inputs(case, False)
    (cx, co, cw), (nx, no, nw) = _leaves(x, offset, weight)
    expected = deform_conv2d(cx, co, cw, stride, padding, dilation, groups, dg, False, 1)
    isolated_patcher.add(DeformConv).apply()
    from mmcv.ops import deform_conv

    actual = deform_conv.deform_conv2d(nx, no, nw, stride, padding, dilation, groups, dg, False, 1)
    _assert_same(expected, actual, [cx, co, cw], [nx, no, nw])
    # Every case, mx_driving's domain or not: outside it the mx_driving replacement runs
    # torch_npu's kernel rather than mmcv's NPU branch (which fails on DyHead's offsets).
    counters = _counters(isolated_patcher, "mmcv.ops.deform_conv:deform_conv2d")
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize(
    "use_source", _sources("mx_driving", "torch_npu", "portable"), indirect=True
)
def test_modulated_deform_conv_matches_mmcvs_cpu_kernel(use_source, case, isolated_patcher):
    from mmcv.ops.modulated_deform_conv import modulated_deform_conv2d

    x, offset, mask, weight, bias, (stride, padding, dilation, groups, dg) = _conv_inputs(
        case, True
    )
    cpu, npu = _leaves(x, offset, mask, weight, bias)
    expected = modulated_deform_conv2d(*cpu, stride, padding, dilation, groups, dg)
    isolated_patcher.add(ModulatedDeformConv).apply()
    from mmcv.ops import modulated_deform_conv

    actual = modulated_deform_conv.modulated_deform_conv2d(
        *npu, stride, padding, dilation, groups, dg
    )
    _assert_same(expected, actual, cpu, npu)
    counters = _counters(isolated_patcher, "mmcv.ops.modulated_deform_conv:modulated_deform_conv2d")
    assert (counters.replacement_calls, counters.fallback_calls) == (1, 0)


@pytest.mark.parametrize("use_source", _sources("portable"), indirect=True)
def test_dcn_modules_and_function_apply_are_served(use_source, isolated_patcher):
    # Under the emulator every CPU tensor counts as an NPU tensor: the references are
    # computed before the group is applied.
    from mmcv.ops import DeformConv2dPack
    from mmcv.ops import ModulatedDeformConv2dPack
    from mmcv.ops.modulated_deform_conv import ModulatedDeformConv2dFunction

    torch.manual_seed(0)
    modules, expected = [], []
    for cls in (DeformConv2dPack, ModulatedDeformConv2dPack):
        module = cls(4, 4, 3, padding=1)
        torch.nn.init.normal_(module.conv_offset.weight, std=0.3)
        x = torch.randn(1, 4, 6, 6)
        modules.append((module, x))
        expected.append(module(x))
    x, offset, mask, weight, bias, _ = _conv_inputs("3x3", True)
    expected.append(ModulatedDeformConv2dFunction.apply(x, offset, mask, weight, bias, 1, 1))
    isolated_patcher.add(DeformConv).add(ModulatedDeformConv).apply()
    actual = [module.to("npu")(x.to("npu")) for module, x in modules]
    actual.append(
        ModulatedDeformConv2dFunction.apply(
            *(t.to("npu") for t in (x, offset, mask, weight, bias)), 1, 1
        )
    )
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got.cpu(), want, **TOL)
    report = isolated_patcher.report
    assert report.get("mmcv.ops.deform_conv:deform_conv2d").counters.replacement_calls == 1
    apply = "mmcv.ops.modulated_deform_conv:ModulatedDeformConv2dFunction.apply"
    function = "mmcv.ops.modulated_deform_conv:modulated_deform_conv2d"
    calls = report.get(apply).counters.replacement_calls
    calls += report.get(function).counters.replacement_calls
    assert calls == 2  # the Pack module and the direct Function.apply


# ------------------------------------------------------------------- mixed dtypes (autocast)
# Under autocast the offset (or value) comes out of a Linear/Conv in float16 while the
# rest stays float32; mmcv casts to that tensor's dtype, so the output is float16.
HALF_TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("use_source", _sources("torch_npu", "portable"), indirect=True)
def test_deform_convs_follow_the_offsets_dtype_as_mmcv(use_source, isolated_patcher):
    from mmcv.ops import deform_conv
    from mmcv.ops import modulated_deform_conv

    x, offset, mask, weight, bias, (stride, padding, dilation, groups, dg) = _conv_inputs(
        "3x3", True
    )
    offset, mask = offset.half(), mask.half()
    args = (stride, padding, dilation, groups, dg)
    expected = deform_conv.deform_conv2d(x, offset, weight, *args, False, 1)
    expected_mod = modulated_deform_conv.modulated_deform_conv2d(
        x, offset, mask, weight, bias, *args
    )
    assert expected.dtype == expected_mod.dtype == torch.float16
    isolated_patcher.add(DeformConv).add(ModulatedDeformConv).apply()
    npu = [t.to("npu") for t in (x, offset, mask, weight, bias)]
    actual = deform_conv.deform_conv2d(npu[0], npu[1], npu[3], *args, False, 1)
    actual_mod = modulated_deform_conv.modulated_deform_conv2d(*npu, *args)
    assert actual.dtype == actual_mod.dtype == torch.float16
    torch.testing.assert_close(actual.cpu(), expected, **HALF_TOL)
    torch.testing.assert_close(actual_mod.cpu(), expected_mod, **HALF_TOL)
    report = isolated_patcher.report
    assert report.get("mmcv.ops.deform_conv:deform_conv2d").counters.replacement_calls == 1
    target = "mmcv.ops.modulated_deform_conv:modulated_deform_conv2d"
    assert report.get(target).counters.replacement_calls == 1


@pytest.mark.parametrize("use_source", _sources("mx_driving", "portable"), indirect=True)
def test_msda_function_casts_locations_and_weights_to_values_dtype(use_source, isolated_patcher):
    from ascend_patch_mmcv.msda import level_start_index
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch

    value, shapes, locations, weights = _msda_inputs()
    value = value.half()
    expected = multi_scale_deformable_attn_pytorch(
        value.float(), shapes, locations.half().float(), weights.half().float()
    )
    isolated_patcher.add(MultiScaleDeformableAttention).apply()
    npu_shapes = shapes.to("npu")
    actual = MultiScaleDeformableAttnFunction.apply(
        value.to("npu"),
        npu_shapes,
        level_start_index(npu_shapes),
        locations.to("npu"),
        weights.to("npu"),
        64,
    )
    assert actual.dtype == torch.float16
    torch.testing.assert_close(actual.cpu().float(), expected, **HALF_TOL)
    target = "mmcv.ops.multi_scale_deform_attn:MultiScaleDeformableAttnFunction.apply"
    assert _counters(isolated_patcher, target).replacement_calls == 1


@pytest.mark.parametrize("use_source", _sources("mx_driving", "portable"), indirect=True)
def test_msda_function_without_queries_gives_mmcvs_empty_result(use_source, isolated_patcher):
    # mx_driving's kernel refuses empty inputs; mmcv's definition returns [bs, 0, embed].
    from ascend_patch_mmcv.msda import level_start_index
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch

    value, shapes, locations, weights = _msda_inputs(queries=0)
    (cv, cl, cw), (nv, nl, nw) = _leaves(value, locations, weights)
    expected = multi_scale_deformable_attn_pytorch(cv, shapes, cl, cw)
    isolated_patcher.add(MultiScaleDeformableAttention).apply()
    npu_shapes = shapes.to("npu")
    actual = MultiScaleDeformableAttnFunction.apply(
        nv, npu_shapes, level_start_index(npu_shapes), nl, nw, 64
    )
    assert actual.shape == expected.shape == (2, 0, 16)
    _assert_same(expected, actual, [cv, cl, cw], [nv, nl, nw])
    target = "mmcv.ops.multi_scale_deform_attn:MultiScaleDeformableAttnFunction.apply"
    assert _counters(isolated_patcher, target).replacement_calls == 1


@pytest.mark.parametrize("use_source", _sources("mx_driving"), indirect=True)
def test_msda_pytorch_path_with_shapes_as_a_list_stays_with_mmcv(use_source, isolated_patcher):
    # mmcv's function also takes [(h, w), ...]; the kernel needs the tensor: mmcv's code runs.
    from mmcv.ops import multi_scale_deform_attn

    value, shapes, locations, weights = _msda_inputs()
    pairs = [tuple(pair) for pair in shapes.tolist()]
    original = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch
    expected = original(value, pairs, locations, weights)
    isolated_patcher.add(MultiScaleDeformableAttention).apply()
    actual = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch(
        value.to("npu"), pairs, locations.to("npu"), weights.to("npu")
    )
    torch.testing.assert_close(actual.cpu(), expected, **TOL)
    target = "mmcv.ops.multi_scale_deform_attn:multi_scale_deformable_attn_pytorch"
    counters = _counters(isolated_patcher, target)
    assert (counters.replacement_calls, counters.fallback_calls) == (0, 1)
