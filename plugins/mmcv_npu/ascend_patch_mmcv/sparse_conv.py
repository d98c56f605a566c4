"""SparseConv3D: mmcv's sparse convolutions (``mmcv.ops.SubMConv3d`` and kin) on NPU tensors.

mmcv has no NPU kernels for its sparse convolutions (and its CPU build none at all):
every sparse module reaches them through ``mmcv.ops.sparse_ops`` -- the modules and
``sparse_functional``'s autograd functions call ``ops.get_indice_pairs``,
``ops.indice_conv``, ``ops.indice_conv_backward``, ``ops.fused_indice_conv``,
``ops.indice_maxpool`` and ``ops.indice_maxpool_backward`` as attributes of that
module, and ``sparse_pool`` holds its own ``get_indice_pairs`` (imported by name).
The group replaces those six functions, for NPU tensors (``runtime_check``), with the
portable kernels of :mod:`ascend_patch_mmcv.sparse_conv_kernels`, which compute what
mmcv's compiled kernels compute, in mmcv's formats: mmcv's classes stay, so weights,
checkpoints and ``indice_key`` sharing are untouched. This is done whatever the kernel
source, so that every mmcv sparse module (2-D, 4-D, transposed, max-pool) runs on NPU.

Kernel (:mod:`ascend_patch_mmcv._kernel_source`, op ``sparse_conv3d``): with DrivingSDK
installed, its 3-D sparse classes replace mmcv's at their class paths (defining module
and ``mmcv.ops``) and in the layer registry (mmcv 1.x ``CONV_LAYERS``, 2.x mmengine's
``MODELS``), as DrivingSDK's own patcher does: ``SparseConvTensor``,
``SparseSequential``, ``SparseModule``, ``SparseConvolution``, ``SubMConv3d``,
``SparseConv3d``, ``SparseInverseConv3d``. They are swapped as one family because
they only work with each other (each checks its input against its own
``SparseConvTensor``, and ``indice_dict`` holds another format). What differs from mmcv
is documented in docs/mmcv-plugin.md; no kernel of that path runs off an Ascend device.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from ascend_patch_core import AtomicPatch

from . import _kernel_source


def _kernels() -> Any:
    # Imported at the first call: the kernels import torch, which apply() and doctor
    # (they build this group's patches) must not.
    from . import sparse_conv_kernels

    return sparse_conv_kernels


__all__ = ["MX_CLASSES", "OP", "REGISTERED", "mx_driving_patches", "sparse_conv_patches"]

#: The op's name for :func:`ascend_patch_mmcv._kernel_source.choose` and its variable.
OP = "sparse_conv3d"

#: DrivingSDK's class for each mmcv class path, module by module.
MX_CLASSES: dict[str, tuple[str, ...]] = {
    "mmcv.ops.sparse_structure": ("SparseConvTensor",),
    "mmcv.ops.sparse_modules": ("SparseSequential", "SparseModule"),
    "mmcv.ops.sparse_conv": (
        "SparseConvolution",
        "SubMConv3d",
        "SparseConv3d",
        "SparseInverseConv3d",
    ),
}
#: The layer-registry entries of those classes (mmcv registers them when
#: ``mmcv.ops.sparse_conv`` is imported), by mmcv major version.
REGISTERED = ("SubMConv3d", "SparseConv3d", "SparseInverseConv3d")
#: Not re-exported by ``mmcv.ops`` (1.7 nor 2.x): only its defining module has it.
_NOT_IN_OPS = frozenset({"SparseConvolution"})
_REGISTRY = {1: "mmcv.cnn.bricks.registry:CONV_LAYERS", 2: "mmengine.registry:MODELS"}

_SPARSE_OPS = "mmcv.ops.sparse_ops"


def _on_npu(*tensors: Any) -> bool:
    # ``Tensor.is_npu`` (torch_npu's, and the emulator's, whose NPU tensors live on the CPU).
    return all(getattr(t, "is_npu", False) is True for t in tensors)


def _per_dim(value: Any, ndim: int) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * ndim


def _output_shape(
    spatial_shape: Sequence[int],
    ksize: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    out_padding: Sequence[int],
    subm: bool,
    transpose: bool,
) -> list[int]:
    """The output grid, as mmcv's ``get_conv_output_size`` / ``get_deconv_output_size``."""
    if subm:
        return [int(s) for s in spatial_shape]
    if transpose:
        if any(k == -1 for k in ksize):
            raise ValueError("deconv don't support kernel_size < 0")
        return [
            (n - 1) * s - 2 * p + k + o
            for n, k, s, p, o in zip(
                spatial_shape, ksize, stride, padding, out_padding, strict=True
            )
        ]
    return [
        1 if k == -1 else (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(spatial_shape, ksize, stride, padding, dilation, strict=True)
    ]


def get_indice_pairs(
    indices: Any,
    batch_size: int,
    spatial_shape: Sequence[int],
    ksize: Any = 3,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    out_padding: Any = 0,
    subm: bool = False,
    transpose: bool = False,
    grid: Any = None,
) -> tuple[Any, Any, Any]:
    """``mmcv.ops.sparse_ops.get_indice_pairs`` (``grid``, mmcv's scratch buffer, is not needed)."""
    ndim = indices.shape[1] - 1
    ksize, stride, padding, dilation, out_padding = (
        _per_dim(v, ndim) for v in (ksize, stride, padding, dilation, out_padding)
    )
    # As mmcv: dilated strided convolutions are refused.
    for d, s in zip(dilation, stride, strict=True):
        assert s == 1 or d == 1, "don't support this."
    out_shape = _output_shape(
        spatial_shape, ksize, stride, padding, dilation, out_padding, subm, transpose
    )
    return _kernels().indice_pairs(
        indices,
        batch_size,
        out_shape,
        spatial_shape,
        ksize,
        stride,
        padding,
        dilation,
        out_padding,
        subm,
        transpose,
    )


def _floating(tensor: Any) -> None:
    # mmcv's kernels take float32 and float16 (and refuse the rest); these take any float.
    if not tensor.dtype.is_floating_point:
        raise NotImplementedError(f"sparse convolution of {tensor.dtype} features")


def indice_conv(
    features: Any,
    filters: Any,
    indice_pairs: Any,
    indice_pair_num: Any,
    num_activate_out: Any,
    inverse: bool = False,
    subm: bool = False,
) -> Any:
    _floating(filters)
    return _kernels().indice_conv(
        features, filters, indice_pairs, indice_pair_num, int(num_activate_out), inverse, subm
    )


def fused_indice_conv(
    features: Any,
    filters: Any,
    bias: Any,
    indice_pairs: Any,
    indice_pair_num: Any,
    num_activate_out: Any,
    inverse: bool,
    subm: bool,
) -> Any:
    _floating(filters)
    return _kernels().fused_indice_conv(
        features,
        filters,
        bias,
        indice_pairs,
        indice_pair_num,
        int(num_activate_out),
        inverse,
        subm,
    )


def indice_conv_backward(
    features: Any,
    filters: Any,
    out_bp: Any,
    indice_pairs: Any,
    indice_pair_num: Any,
    inverse: bool = False,
    subm: bool = False,
) -> tuple[Any, Any]:
    _floating(filters)
    return _kernels().indice_conv_backward(
        features, filters, out_bp, indice_pairs, indice_pair_num, inverse, subm
    )


def indice_maxpool(
    features: Any, indice_pairs: Any, indice_pair_num: Any, num_activate_out: Any
) -> Any:
    _floating(features)
    return _kernels().indice_maxpool(features, indice_pairs, indice_pair_num, int(num_activate_out))


def indice_maxpool_backward(
    features: Any, out_features: Any, out_bp: Any, indice_pairs: Any, indice_pair_num: Any
) -> Any:
    _floating(features)
    return _kernels().indice_maxpool_backward(
        features, out_features, out_bp, indice_pairs, indice_pair_num
    )


# name -> (replacement, how many leading tensor arguments must be on the NPU)
_OPS: dict[str, tuple[Callable[..., Any], int]] = {
    "get_indice_pairs": (get_indice_pairs, 1),
    "indice_conv": (indice_conv, 2),
    "fused_indice_conv": (fused_indice_conv, 2),
    "indice_conv_backward": (indice_conv_backward, 3),
    "indice_maxpool": (indice_maxpool, 1),
    "indice_maxpool_backward": (indice_maxpool_backward, 3),
}
_ALIASES = {"get_indice_pairs": ("mmcv.ops.sparse_pool:get_indice_pairs",)}


def _check(tensors: int) -> Callable[..., bool]:
    def check(*args: Any, **kwargs: Any) -> bool:
        return _on_npu(*args[:tensors]) if len(args) >= tensors else False

    return check


def _op_patches(note: str) -> Iterator[AtomicPatch]:
    for name, (replacement, tensors) in _OPS.items():
        yield AtomicPatch(
            f"{_SPARSE_OPS}:{name}",
            replacement,
            aliases=_ALIASES.get(name, ()),
            runtime_check=_check(tensors),
            note=note,
        )


def _mmcv_major() -> int | None:
    for dist in ("mmcv", "mmcv-full", "mmcv-lite"):
        try:
            return int(importlib.metadata.version(dist).split(".")[0])
        except (importlib.metadata.PackageNotFoundError, ValueError):
            continue
    return None


def mx_driving_patches(note: str, mmcv_major: int | None) -> Iterator[AtomicPatch]:
    """DrivingSDK's sparse classes at mmcv's class paths and registry entries."""
    for module, names in MX_CLASSES.items():
        for name in names:
            yield AtomicPatch(
                f"{module}:{name}",
                f"mx_driving:{name}",
                aliases=() if name in _NOT_IN_OPS else f"mmcv.ops:{name}",
                note=note,
            )
    registry = _REGISTRY.get(mmcv_major or 0)
    if registry is None:
        return
    for name in REGISTERED:
        yield AtomicPatch(
            f"{registry}._module_dict['{name}']",
            f"mx_driving:{name}",
            after_import="mmcv.ops.sparse_conv",
            note=note,
        )


def sparse_conv_patches(options: Any = None) -> Iterator[AtomicPatch]:
    source = _kernel_source.choose(
        OP,
        (_kernel_source.MX_DRIVING, _kernel_source.PORTABLE),
        mx_names=tuple(n for names in MX_CLASSES.values() for n in names),
    )
    yield from _op_patches(_kernel_source.note(_kernel_source.PORTABLE))
    if source == _kernel_source.MX_DRIVING:
        yield from mx_driving_patches(_kernel_source.note(source), _mmcv_major())
