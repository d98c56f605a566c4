"""``mmcv._ext`` deformable convolutions against mmcv 2.1.0's compiled CPU kernels.

Every function of the family is called as mmcv's ``deform_conv.py`` and
``modulated_deform_conv.py`` call it (keywords, preallocated outputs, the scratch
``columns``/``ones`` buffers), on the same inputs as the compiled ``mmcv._ext``:
plain, strided, dilated, padded, grouped, several deformable groups, non-square
kernels, offsets that move samples off the map, and non-contiguous inputs. The
gradient buffers start non-zero, which shows what each function adds to and what it
overwrites (mmcv: adds to the input, weight and bias gradients, overwrites the offset
and mask ones). On emulated NPU tensors each kernel source (portable, torch_npu,
mx_driving) gives the same numbers.

Tolerance: float32 1e-4 absolute and relative (the same products summed in another
order, gradients through different formulas); half 2e-2 against mmcv's float32 kernel.
"""

from __future__ import annotations

import importlib.util

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv import _kernel_source  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import deform  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext.registry import IMPLEMENTATIONS  # noqa: E402


TOL = {"atol": 1e-4, "rtol": 1e-4}
NAMES = (
    "deform_conv_forward",
    "deform_conv_backward_input",
    "deform_conv_backward_parameters",
    "modulated_deform_conv_forward",
    "modulated_deform_conv_backward",
)
CASES = {
    # name: (in, out, (kh, kw), stride, padding, dilation, groups, deform_groups, (h, w), batch)
    "3x3": (4, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, (7, 6), 2),
    "strided-dilated": (4, 4, (3, 3), (2, 2), (2, 2), (2, 2), 1, 2, (9, 8), 2),
    "grouped-nonsquare": (4, 6, (3, 2), (1, 2), (1, 0), (1, 1), 2, 2, (6, 7), 3),
    "1x1-one-image": (3, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, 1, (5, 4), 1),
}


class Case:
    def __init__(self, name, seed=0, offset_scale=1.5):
        cin, cout, (kh, kw), s, p, d, groups, dg, (h, w), n = CASES[name]
        g = torch.Generator().manual_seed(seed)
        self.kh, self.kw, self.s, self.p, self.d, self.groups, self.dg = kh, kw, s, p, d, groups, dg
        ho = (h + 2 * p[0] - (d[0] * (kh - 1) + 1)) // s[0] + 1
        wo = (w + 2 * p[1] - (d[1] * (kw - 1) + 1)) // s[1] + 1
        self.x = torch.randn(n, cin, h, w, generator=g)
        self.weight = torch.randn(cout, cin // groups, kh, kw, generator=g)
        self.bias = torch.randn(cout, generator=g)
        self.offset = torch.randn(n, dg * 2 * kh * kw, ho, wo, generator=g) * offset_scale
        self.mask = torch.rand(n, dg * kh * kw, ho, wo, generator=g)
        self.grad = torch.randn(n, cout, ho, wo, generator=g)
        self.out_shape = (n, cout, ho, wo)

    def dcn_geometry(self):
        return {
            "kW": self.kw, "kH": self.kh, "dW": self.s[1], "dH": self.s[0], "padW": self.p[1],
            "padH": self.p[0], "dilationW": self.d[1], "dilationH": self.d[0],
            "group": self.groups, "deformable_group": self.dg,
        }  # fmt: skip

    def mdcn_geometry(self, with_bias):
        return {
            "kernel_h": self.kh, "kernel_w": self.kw, "stride_h": self.s[0],
            "stride_w": self.s[1], "pad_h": self.p[0], "pad_w": self.p[1],
            "dilation_h": self.d[0], "dilation_w": self.d[1], "group": self.groups,
            "deformable_group": self.dg, "with_bias": with_bias,
        }  # fmt: skip


def _empty(like):
    return like.new_empty(0)


def _dcn(module, c, x=None, offset=None, grad=None, step=None):
    x = c.x if x is None else x
    offset = c.offset if offset is None else offset
    grad = c.grad if grad is None else grad
    step = x.shape[0] if step is None else step
    geometry = c.dcn_geometry()
    output = x.new_empty(c.out_shape)
    module.deform_conv_forward(
        x, c.weight, offset, output, _empty(x), _empty(x), **geometry, im2col_step=step
    )
    grad_input, grad_offset = torch.full_like(x, 0.5), torch.full_like(offset, 0.25)
    module.deform_conv_backward_input(
        x, offset, grad, grad_input, grad_offset, c.weight, _empty(x), **geometry,
        im2col_step=step,
    )  # fmt: skip
    grad_weight = torch.full_like(c.weight, 0.125)
    module.deform_conv_backward_parameters(
        x, offset, grad, grad_weight, _empty(x), _empty(x), **geometry, scale=0.5,
        im2col_step=step,
    )  # fmt: skip
    return output, grad_input, grad_offset, grad_weight


def _mdcn(module, c, with_bias, x=None, offset=None, mask=None):
    x = c.x if x is None else x
    offset = c.offset if offset is None else offset
    mask = c.mask if mask is None else mask
    bias = c.bias if with_bias else _empty(x)
    geometry = c.mdcn_geometry(with_bias)
    output = x.new_empty(c.out_shape)
    module.modulated_deform_conv_forward(
        x, c.weight, bias, _empty(x), offset, mask, output, _empty(x), **geometry
    )
    grads = [torch.full_like(t, 0.5) for t in (x, c.weight, bias, offset, mask)]
    module.modulated_deform_conv_backward(
        x, c.weight, bias, _empty(x), offset, mask, _empty(x), *grads, c.grad.contiguous(),
        **geometry,
    )  # fmt: skip
    return [output, *grads]


def _same(expected, actual):
    for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
        torch.testing.assert_close(a, e, **TOL, msg=lambda m, i=index: f"result {i}: {m}")


def test_registered_under_mmcvs_names():
    for name in NAMES:
        assert IMPLEMENTATIONS[name] is getattr(deform, name)


@pytest.mark.parametrize("case", list(CASES))
def test_deform_conv_matches_mmcvs_cpu_kernel(case):
    c = Case(case)
    _same(_dcn(compiled, c), _dcn(deform, c))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_modulated_deform_conv_matches_mmcvs_cpu_kernel(case, with_bias):
    c = Case(case)
    _same(_mdcn(compiled, c, with_bias), _mdcn(deform, c, with_bias))


def test_offsets_far_off_the_map_and_im2col_step():
    c = Case("3x3", seed=1, offset_scale=6.0)
    _same(_dcn(compiled, c, step=1), _dcn(deform, c, step=2))
    _same(_mdcn(compiled, c, True), _mdcn(deform, c, True))


def test_non_contiguous_inputs():
    c = Case("grouped-nonsquare", seed=3)
    x = c.x.transpose(2, 3).contiguous().transpose(2, 3)
    offset = c.offset.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    mask = c.mask.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    grad = c.grad.transpose(2, 3).contiguous().transpose(2, 3)
    assert not any(t.is_contiguous() for t in (x, offset, mask, grad))
    _same(_dcn(compiled, c), _dcn(deform, c, x, offset, grad))
    _same(_mdcn(compiled, c, True), _mdcn(deform, c, True, x, offset, mask))


def test_half_precision():
    """Half in, half out; compared with mmcv's float32 kernel on the same half values
    (mmcv's half kernel accumulates in half; the portable one in float32)."""
    c = Case("strided-dilated", seed=6)
    for name in ("x", "weight", "bias", "offset", "mask", "grad"):
        setattr(c, name, getattr(c, name).half().float())
    expected = _dcn(compiled, c), _mdcn(compiled, c, True)
    for name in ("x", "weight", "bias", "offset", "mask", "grad"):
        setattr(c, name, getattr(c, name).half())
    assert _dcn(compiled, c)[0].dtype == torch.half  # mmcv's CPU kernel runs half too
    actual = _dcn(deform, c), _mdcn(deform, c, True)
    tol = {"atol": 2e-2, "rtol": 2e-2}
    for e_list, a_list in zip(expected, actual, strict=True):
        for index, (e, a) in enumerate(zip(e_list, a_list, strict=True)):
            assert a.dtype == torch.half
            torch.testing.assert_close(a.float(), e, **tol, msg=lambda m, i=index: f"{i}: {m}")


def _has_mx_driving():
    return importlib.util.find_spec("mx_driving") is not None


@pytest.mark.parametrize("source", ["portable", "torch_npu", "mx_driving"])
def test_kernel_sources_on_npu_tensors(npu_emulator, monkeypatch, source):
    """Emulated NPU tensors: every kernel source computes what mmcv's CPU kernel does."""
    if source == "mx_driving" and not _has_mx_driving():
        pytest.skip("the emulator serves no mx_driving")
    monkeypatch.setenv(_kernel_source.VARIABLE, source)
    _kernel_source.forget_choices()
    try:
        # DrivingSDK's kernel takes 3x3 with 64-multiple channels; others fall back.
        for case in ("3x3", "grouped-nonsquare"):
            c = Case(case, seed=4)
            expected_dcn, expected_mdcn = _dcn(compiled, c), _mdcn(compiled, c, True)
            for name in ("x", "weight", "bias", "offset", "mask", "grad"):
                setattr(c, name, getattr(c, name).to("npu"))
            _same(expected_dcn, [t.cpu() for t in _dcn(deform, c)])
            _same(expected_mdcn, [t.cpu() for t in _mdcn(deform, c, True)])
    finally:
        _kernel_source.forget_choices()


def test_mx_driving_domain_on_npu_tensors(npu_emulator, monkeypatch):
    if not _has_mx_driving():
        pytest.skip("the emulator serves no mx_driving")
    import mx_driving

    calls = []
    kernel = mx_driving.modulated_deform_conv2d
    monkeypatch.setattr(
        mx_driving, "modulated_deform_conv2d", lambda *a, **k: calls.append(1) or kernel(*a, **k)
    )
    monkeypatch.setenv(_kernel_source.VARIABLE, "mx_driving")
    _kernel_source.forget_choices()
    try:
        g = torch.Generator().manual_seed(5)
        CASES["mx"] = (64, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, (5, 5), 1)
        c = Case("mx")
        del CASES["mx"]
        c.x = torch.randn(c.x.shape, generator=g)
        expected = _mdcn(compiled, c, True)
        for name in ("x", "weight", "bias", "offset", "mask", "grad"):
            setattr(c, name, getattr(c, name).to("npu"))
        _same(expected, [t.cpu() for t in _mdcn(deform, c, True)])
        assert calls  # DrivingSDK's kernel served the forward and the backward
    finally:
        _kernel_source.forget_choices()


def test_through_mmcvs_deform_conv_modules(monkeypatch):
    """mmcv's own DeformConv2d / ModulatedDeformConv2d (Functions, buffers, calls) on these."""
    import types

    from mmcv.ops import deform_conv
    from mmcv.ops import modulated_deform_conv

    ours = types.SimpleNamespace(**{name: getattr(deform, name) for name in NAMES})
    torch.manual_seed(0)
    dcn = deform_conv.DeformConv2d(4, 6, 3, padding=1, deform_groups=2)
    mdcn = modulated_deform_conv.ModulatedDeformConv2d(4, 6, 3, padding=1, groups=2)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 4, 7, 6, generator=g)
    offset = torch.randn(2, 36, 7, 6, generator=g)
    mask = torch.rand(2, 9, 7, 6, generator=g)
    results = []
    for ext_module in (compiled, ours):
        monkeypatch.setattr(deform_conv, "ext_module", ext_module)
        monkeypatch.setattr(modulated_deform_conv, "ext_module", ext_module)
        leaves = [t.clone().requires_grad_(True) for t in (x, offset, mask)]
        out = dcn(leaves[0], leaves[1]) + mdcn(leaves[0], leaves[1][:, :18], leaves[2])
        out.backward(torch.ones_like(out))
        grads = [dcn.weight.grad.clone(), mdcn.weight.grad.clone(), mdcn.bias.grad.clone()]
        dcn.zero_grad(), mdcn.zero_grad()
        results.append([out.detach()] + [leaf.grad for leaf in leaves] + grads)
    _same(*results)
