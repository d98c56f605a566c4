"""DeformConv and ModulatedDeformConv: mmcv's deformable convolutions on NPU kernels.

mmcv 1.7 and 2.x route every deformable convolution through one autograd function per
flavour, reached two ways: ``DeformConv2dFunction.apply`` /
``ModulatedDeformConv2dFunction.apply``, and the module-level ``deform_conv2d`` /
``modulated_deform_conv2d`` (bound to ``apply`` when mmcv was imported, re-exported by
``mmcv.ops``), which ``DeformConv2d``, ``ModulatedDeformConv2d`` and their ``Pack``
variants call. The group replaces both, for NPU tensors (``runtime_check``).

Kernel (:mod:`ascend_patch_mmcv._kernel_source`, ops ``deform_conv2d`` and
``modulated_deform_conv2d``): DrivingSDK's kernel, else
``torch_npu.npu_deformable_conv2d`` with its autograd backward, else the portable
PyTorch implementation (:mod:`ascend_patch_mmcv.deform_conv_kernels`).

DrivingSDK's kernel takes only 3x3 kernels with channels multiples of 64. Outside
that domain the mx_driving replacement runs the torch_npu kernel (the portable one if
torch_npu cannot be imported) rather than handing the call back to mmcv: mmcv's NPU
branch passes offsets larger than the output (mmdet's DyHead) to torch_npu as they
are, which torch_npu refuses, while ours passes the values mmcv's CUDA kernel reads.
The patch note says so (:data:`MX_DRIVING_NOTE`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch

from . import _kernel_source
from . import deform_conv_kernels


__all__ = ["MX_DRIVING_NOTE", "deform_conv_patches", "modulated_deform_conv_patches"]

_KERNELS: dict[str, Callable[..., Any]] = {
    _kernel_source.TORCH_NPU: deform_conv_kernels.torch_npu_kernel,
    _kernel_source.PORTABLE: deform_conv_kernels.portable,
}


def _on_npu(tensor: Any) -> bool:
    # ``Tensor.is_npu`` (torch_npu's, and the emulator's, whose NPU tensors live on the CPU).
    return getattr(tensor, "is_npu", False) is True


#: The note of the mx_driving replacement: the report must not claim DrivingSDK's
#: kernel for the calls outside its domain.
MX_DRIVING_NOTE = (
    f"{_kernel_source.note(_kernel_source.MX_DRIVING)} "
    "(torch_npu outside 3x3 kernels with channels multiples of 64)"
)


def _check(input: Any, offset: Any, *rest: Any, **kwargs: Any) -> bool:
    return _on_npu(input) and _on_npu(offset)


def _mx_driving_or_else(modulated: bool) -> Callable[..., Any]:
    """DrivingSDK's kernel where it takes the shapes, torch_npu's (else ours) elsewhere."""
    # mx_driving imports torch_npu, so the portable kernel is only for a torch_npu that
    # cannot be imported at all (decided once, as the source itself).
    elsewhere = (
        deform_conv_kernels.torch_npu_kernel
        if _kernel_source.importable(_kernel_source.TORCH_NPU)
        else deform_conv_kernels.portable
    )

    def kernel(input: Any, offset: Any, mask: Any, weight: Any, *rest: Any) -> Any:
        if deform_conv_kernels.mx_driving_supports(input, weight, modulated):
            return deform_conv_kernels.mx_driving_kernel(input, offset, mask, weight, *rest)
        return elsewhere(input, offset, mask, weight, *rest)

    return kernel


def _deform_conv2d(kernel: Callable[..., Any]) -> Callable[..., Any]:
    def deform_conv2d(
        input: Any,
        offset: Any,
        weight: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        deform_groups: int = 1,
        bias: bool = False,
        im2col_step: int = 32,
    ) -> Any:
        # As mmcv: no bias in DCNv1; im2col_step only tiles mmcv's kernel.
        if bias:
            raise AssertionError("Only support bias is False.")
        if input.dim() != 4:
            raise ValueError(f"Expected 4D tensor as input, got {input.dim()}D tensor instead.")
        # As mmcv: offset's dtype decides (under autocast the offset conv gives float16
        # while input and weight stay float32), so the output is in offset's dtype.
        input = input.type_as(offset)
        weight = weight.type_as(input)
        return kernel(
            input, offset, None, weight, None, stride, padding, dilation, groups, deform_groups
        )

    return deform_conv2d


def _modulated_deform_conv2d(kernel: Callable[..., Any]) -> Callable[..., Any]:
    def modulated_deform_conv2d(
        input: Any,
        offset: Any,
        mask: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        deform_groups: int = 1,
    ) -> Any:
        if input.dim() != 4:
            raise ValueError(f"Expected 4D tensor as input, got {input.dim()}D tensor instead.")
        # As mmcv: everything in offset's dtype (see deform_conv2d above).
        input = input.type_as(offset)
        weight = weight.type_as(input)
        mask = mask.type_as(input)
        if bias is not None:
            bias = bias.type_as(input)
        return kernel(
            input, offset, mask, weight, bias, stride, padding, dilation, groups, deform_groups
        )

    return modulated_deform_conv2d


def _as_classmethod(function: Callable[..., Any]) -> Callable[..., Any]:
    """``Function.apply`` is a classmethod: the installed replacement gets the class first."""

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return apply


def _patches(
    module: str, function_class: str, function: str, op: str, modulated: bool
) -> Iterator[AtomicPatch]:
    source = _kernel_source.choose(op)
    if source == _kernel_source.MX_DRIVING:
        kernel, note = _mx_driving_or_else(modulated), MX_DRIVING_NOTE
    else:
        kernel, note = _KERNELS[source], _kernel_source.note(source)
    make = _modulated_deform_conv2d if modulated else _deform_conv2d
    replacement = make(kernel)
    yield AtomicPatch(
        f"{module}:{function_class}.apply",
        _as_classmethod(replacement),
        runtime_check=lambda cls, *args, **kwargs: _check(*args, **kwargs),
        note=note,
    )
    yield AtomicPatch(
        f"{module}:{function}",
        replacement,
        aliases=f"mmcv.ops:{function}",
        runtime_check=_check,
        note=note,
    )


def deform_conv_patches(options: Any = None) -> Iterator[AtomicPatch]:
    return _patches(
        "mmcv.ops.deform_conv", "DeformConv2dFunction", "deform_conv2d", "deform_conv2d", False
    )


def modulated_deform_conv_patches(options: Any = None) -> Iterator[AtomicPatch]:
    return _patches(
        "mmcv.ops.modulated_deform_conv",
        "ModulatedDeformConv2dFunction",
        "modulated_deform_conv2d",
        "modulated_deform_conv2d",
        True,
    )
