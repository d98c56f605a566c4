"""``mmcv._ext``'s sparse convolution functions, on the plugin's portable kernels.

mmcv's ``sparse_ops`` calls ``get_indice_pairs_{2,3,4}d_forward`` (and the ``_backward``
variants, given a ``grid`` scratch buffer, which the kernels do not need), then
``indice_conv_forward`` / ``indice_conv_backward`` / ``fused_indice_conv_forward`` and
``indice_maxpool_forward`` / ``indice_maxpool_backward``. Each is the kernel of
:mod:`ascend_patch_mmcv.sparse_conv_kernels` (mmcv's formats: ``indice_pairs`` int32
``[K, 2, N]``, ``-1`` past ``indice_num[k]``; ``outids`` in mmcv's order), which the
SparseConv3D group also serves NPU tensors with. The C++ functions return
``std::vector`` s: lists here too. No mx_driving kernel has mmcv's pair formats, so
NPU tensors use the same portable kernels.
"""

from __future__ import annotations

from typing import Any

from .registry import implements


__all__: list[str] = []


def _kernels() -> Any:
    from ... import sparse_conv_kernels

    return sparse_conv_kernels


def _pairs(
    indices: Any,
    batchSize: Any,
    outSpatialShape: Any,
    spatialShape: Any,
    kernelSize: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    outPadding: Any,
    _subM: Any,
    _transpose: Any,
) -> list[Any]:
    """``get_indice_pairs_{2,3,4}d_forward`` (the kernel takes any number of dimensions)."""
    sizes = (outSpatialShape, spatialShape, kernelSize, stride, padding, dilation, outPadding)
    outids, pairs, counts = _kernels().indice_pairs(
        indices, int(batchSize), *(list(v) for v in sizes), int(_subM), int(_transpose)
    )
    return [outids, pairs, counts]


def _pairs_with_grid(
    indices: Any,
    gridOut: Any,
    batchSize: Any,
    outSpatialShape: Any,
    spatialShape: Any,
    kernelSize: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    outPadding: Any,
    _subM: Any,
    _transpose: Any,
) -> list[Any]:
    """``get_indice_pairs_{2,3}d_backward``: the same, given mmcv's ``grid`` scratch table,
    which only the CUDA kernel uses."""
    return _pairs(
        indices, batchSize, outSpatialShape, spatialShape, kernelSize, stride, padding,
        dilation, outPadding, _subM, _transpose,
    )  # fmt: skip


for _ndim in (2, 3, 4):
    implements(f"get_indice_pairs_{_ndim}d_forward")(_pairs)
for _ndim in (2, 3):
    implements(f"get_indice_pairs_{_ndim}d_backward")(_pairs_with_grid)


@implements("indice_conv_forward")
def indice_conv_forward(
    features: Any,
    filters: Any,
    indicePairs: Any,
    indiceNum: Any,
    numActOut: Any,
    _inverse: Any,
    _subM: Any,
) -> Any:
    return _kernels().indice_conv(
        features, filters, indicePairs, indiceNum, int(numActOut), int(_inverse), int(_subM)
    )


@implements("fused_indice_conv_forward")
def fused_indice_conv_forward(
    features: Any,
    filters: Any,
    bias: Any,
    indicePairs: Any,
    indiceNum: Any,
    numActOut: Any,
    _inverse: Any,
    _subM: Any,
) -> Any:
    return _kernels().fused_indice_conv(
        features, filters, bias, indicePairs, indiceNum, int(numActOut), int(_inverse), int(_subM)
    )


@implements("indice_conv_backward")
def indice_conv_backward(
    features: Any,
    filters: Any,
    outGrad: Any,
    indicePairs: Any,
    indiceNum: Any,
    _inverse: Any,
    _subM: Any,
) -> list[Any]:
    input_grad, filters_grad = _kernels().indice_conv_backward(
        features, filters, outGrad, indicePairs, indiceNum, int(_inverse), int(_subM)
    )
    return [input_grad, filters_grad]


@implements("indice_maxpool_forward")
def indice_maxpool_forward(features: Any, indicePairs: Any, indiceNum: Any, numAct: Any) -> Any:
    return _kernels().indice_maxpool(features, indicePairs, indiceNum, int(numAct))


@implements("indice_maxpool_backward")
def indice_maxpool_backward(
    features: Any, outFeatures: Any, outGrad: Any, indicePairs: Any, indiceNum: Any
) -> Any:
    return _kernels().indice_maxpool_backward(
        features, outFeatures, outGrad, indicePairs, indiceNum
    )
