"""Portable sparse convolution: mmcv's compiled spconv ops, written with PyTorch tensor ops.

Each function takes and returns what the ``mmcv._ext`` function of the same role does
(mmcv 1.7 and 2.x share that code), so a caller can serve either mmcv's Python op
layer (``mmcv.ops.sparse_ops``) or the ``_ext`` functions themselves:

* :func:`indice_pairs` -- ``get_indice_pairs_{2,3,4}d_forward`` (and ``_backward``,
  whose extra ``grid`` argument is only a scratch buffer there): from the active
  input sites ``indices`` (``[N, 1 + ndim]``, batch index first) it returns
  ``(outids, indice_pairs, indice_num)``. ``indice_pairs`` is int32 ``[K, 2, N]``
  (``K`` the kernel volume, offsets row-major over the kernel dimensions): for
  offset ``k``, row 0 holds input rows and row 1 output rows, the first
  ``indice_num[k]`` columns used (ordered by input row), the rest -1. A regular
  convolution's output site ``o`` takes input ``x = o * stride - padding + k *
  dilation`` with weight ``k``; a transposed one puts input ``x`` at ``o = x * stride -
  padding + k * dilation``. ``outids`` (int32 ``[M, 1 + ndim]``) lists the output
  sites in mmcv's order: first reached when the inputs are walked in order, each
  input's kernel offsets ascending (descending for a transposed convolution). A
  submanifold convolution keeps the input sites (``outids`` is ``indices`` itself)
  with stride 1 and padding ``kernel // 2``, as mmcv does whatever the module says.
* :func:`indice_conv` / :func:`indice_conv_backward` / :func:`fused_indice_conv` --
  gather, GEMM with ``filters`` (``[*kernel, C_in, C_out]``), scatter-add; ``inverse``
  reads the pairs the other way (the inverse convolution of ``SparseInverseConv3d``).
  For a submanifold convolution mmcv multiplies every row by the weight of the
  offset with the most pairs (its centre) instead of using that offset's pairs;
  so does this code.
* :func:`indice_maxpool` / :func:`indice_maxpool_backward` -- mmcv's output starts
  at zero, so a site whose inputs are all negative gets 0; the gradient goes to
  every input equal to its output's value.

Sites are matched by hashing coordinates to one int64 key, sorting and
``searchsorted``; the only Python loop runs over kernel offsets (one GEMM each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


__all__ = [
    "KERNEL_VOLUME_LIMIT",
    "fused_indice_conv",
    "indice_conv",
    "indice_conv_backward",
    "indice_maxpool",
    "indice_maxpool_backward",
    "indice_pairs",
]

#: mmcv's kernels refuse larger kernels (``kernelVolume <= 4096``).
KERNEL_VOLUME_LIMIT = 4096


def _kernel_offsets(kernel_size: Sequence[int], device: torch.device) -> torch.Tensor:
    """``[K, ndim]`` kernel positions, row-major (the last dimension fastest)."""
    axes = [torch.arange(int(k), device=device) for k in kernel_size]
    grids = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=1)


def _keys(batch: torch.Tensor, coords: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """One int64 per site: the batch index, then the coordinates, row-major in ``shape``."""
    key = batch
    for axis, size in enumerate(shape):
        key = key * int(size) + coords[..., axis]
    return key


def _lookup(table: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """For each query key, the LAST row of ``table`` with that key, or -1.

    mmcv's grid keeps the last input written to a site, so duplicated input sites
    resolve to their last row, as there.
    """
    if table.numel() == 0:
        return torch.full_like(queries, -1)
    sorted_keys, order = torch.sort(table, stable=True)
    position = torch.searchsorted(sorted_keys, queries, right=True) - 1
    clamped = position.clamp(min=0)
    found = (position >= 0) & (sorted_keys[clamped] == queries)
    return torch.where(found, order[clamped], torch.full_like(queries, -1))


def _pair_table(
    inputs: torch.Tensor, outputs: torch.Tensor, offsets: torch.Tensor, volume: int, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """mmcv's ``[K, 2, rows]`` pair table and ``[K]`` counts from pairs listed input-major."""
    device = inputs.device
    counts = torch.bincount(offsets, minlength=volume)
    pairs = torch.full((volume, 2, rows), -1, dtype=torch.int32, device=device)
    if offsets.numel():
        # A stable sort by offset keeps each offset's pairs in input order.
        by_offset = torch.sort(offsets, stable=True).indices
        offset = offsets[by_offset]
        starts = torch.cumsum(counts, 0) - counts
        column = torch.arange(offset.numel(), device=device) - starts[offset]
        pairs[offset, 0, column] = inputs[by_offset].to(torch.int32)
        pairs[offset, 1, column] = outputs[by_offset].to(torch.int32)
    return pairs, counts.to(torch.int32)


def indice_pairs(
    indices: torch.Tensor,
    batch_size: int,
    out_shape: Sequence[int],
    spatial_shape: Sequence[int],
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    out_padding: Sequence[int],
    subm: bool | int,
    transpose: bool | int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(outids, indice_pairs, indice_num)`` as mmcv's ``get_indice_pairs_*d_forward``."""
    ndim = indices.shape[1] - 1
    for name, values in (
        ("kernel_size", kernel_size),
        ("stride", stride),
        ("padding", padding),
        ("dilation", dilation),
        ("out_shape", out_shape),
    ):
        if len(values) != ndim:
            raise ValueError(f"{name} has {len(values)} values for {ndim}-D indices")
    volume = math.prod(int(k) for k in kernel_size)
    if not 0 < volume <= KERNEL_VOLUME_LIMIT:
        raise ValueError(f"kernel volume {volume} outside 1..{KERNEL_VOLUME_LIMIT}")
    device = indices.device
    sites = indices.long()
    rows = sites.shape[0]
    batch, coords = sites[:, 0], sites[:, 1:]
    offsets = _kernel_offsets(kernel_size, device)
    dil = torch.tensor([int(d) for d in dilation], device=device)
    if subm:
        step = torch.ones(ndim, dtype=torch.long, device=device)
        pad = torch.tensor([int(k) // 2 for k in kernel_size], device=device)
    else:
        step = torch.tensor([int(s) for s in stride], device=device)
        pad = torch.tensor([int(p) for p in padding], device=device)
    limit = torch.tensor([int(s) for s in out_shape], device=device)

    # Every (input, offset) candidate, input-major; a transposed convolution walks
    # each input's offsets in descending order, as mmcv does.
    order = torch.arange(volume, device=device)
    if transpose and not subm:
        order = order.flip(0)
    taps = offsets[order] * dil  # [K, ndim]
    if transpose and not subm:
        target = coords[:, None, :] * step - pad + taps[None]
        valid = ((target >= 0) & (target < limit)).all(-1)
    else:
        scaled = coords[:, None, :] + pad - taps[None]
        target = torch.div(scaled, step, rounding_mode="floor")
        valid = ((scaled >= 0) & (scaled % step == 0) & (target < limit)).all(-1)
    source = torch.arange(rows, device=device)[:, None].expand(rows, volume)[valid]
    offset = order[None, :].expand(rows, volume)[valid]
    target = target[valid]
    keys = _keys(batch[source], target, out_shape)

    if subm:
        site = _lookup(_keys(batch, coords, out_shape), keys)
        active = site >= 0
        pairs, counts = _pair_table(source[active], site[active], offset[active], volume, rows)
        return indices, pairs, counts

    # Output rows in order of first appearance among the candidates.
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((unique.numel(),), keys.numel(), dtype=torch.long, device=device)
    first.scatter_reduce_(0, inverse, torch.arange(keys.numel(), device=device), "amin")
    appearance = torch.argsort(first)
    rank = torch.empty_like(appearance)
    rank[appearance] = torch.arange(appearance.numel(), device=device)
    output = rank[inverse]
    leaders = first[appearance]
    outids = torch.cat((batch[source[leaders]][:, None], target[leaders]), dim=1)
    pairs, counts = _pair_table(source, output, offset, volume, rows)
    return outids.to(torch.int32), pairs, counts


def _weights(features: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    return filters.reshape(-1, features.shape[1], filters.shape[-1])


def _centre(subm: bool | int, counts: list[int]) -> int:
    """The offset mmcv treats as the identity of a submanifold convolution (-1: none)."""
    return max(range(len(counts)), key=lambda i: (counts[i], -i)) if subm and counts else -1


def _rows(pairs: torch.Tensor, offset: int, side: int, count: int) -> torch.Tensor:
    return pairs[offset, side, :count].long()


def indice_conv(
    features: torch.Tensor,
    filters: torch.Tensor,
    indice_pairs: torch.Tensor,
    indice_num: torch.Tensor,
    num_out: int,
    inverse: bool | int = False,
    subm: bool | int = False,
) -> torch.Tensor:
    """Output features ``[num_out, C_out]``: mmcv's ``indice_conv_forward``."""
    weights = _weights(features, filters)
    counts = [int(c) for c in indice_num.tolist()]
    src, dst = (1, 0) if inverse else (0, 1)
    centre = _centre(subm, counts)
    # mmcv: the submanifold centre offset is applied to every row, without its pairs.
    output = (
        features @ weights[centre]
        if centre >= 0
        else features.new_zeros(int(num_out), weights.shape[-1])
    )
    for offset, count in enumerate(counts):
        if count <= 0 or offset == centre:
            continue
        gathered = features[_rows(indice_pairs, offset, src, count)] @ weights[offset]
        output.index_add_(0, _rows(indice_pairs, offset, dst, count), gathered)
    return output


def fused_indice_conv(
    features: torch.Tensor,
    filters: torch.Tensor,
    bias: torch.Tensor,
    indice_pairs: torch.Tensor,
    indice_num: torch.Tensor,
    num_out: int,
    inverse: bool | int = False,
    subm: bool | int = False,
) -> torch.Tensor:
    """:func:`indice_conv` plus ``bias`` (mmcv's ``fused_indice_conv_forward``)."""
    output = indice_conv(features, filters, indice_pairs, indice_num, num_out, inverse, subm)
    return output + bias


def indice_conv_backward(
    features: torch.Tensor,
    filters: torch.Tensor,
    out_grad: torch.Tensor,
    indice_pairs: torch.Tensor,
    indice_num: torch.Tensor,
    inverse: bool | int = False,
    subm: bool | int = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_grad, filters_grad)``: mmcv's ``indice_conv_backward``."""
    weights = _weights(features, filters)
    counts = [int(c) for c in indice_num.tolist()]
    src, dst = (1, 0) if inverse else (0, 1)
    centre = _centre(subm, counts)
    input_grad = torch.zeros_like(features)
    filters_grad = torch.zeros_like(weights)
    if centre >= 0:
        filters_grad[centre] = features.t() @ out_grad
        input_grad = out_grad @ weights[centre].t()
    for offset, count in enumerate(counts):
        if count <= 0 or offset == centre:
            continue
        rows_in = _rows(indice_pairs, offset, src, count)
        grad_out = out_grad[_rows(indice_pairs, offset, dst, count)]
        filters_grad[offset] = features[rows_in].t() @ grad_out
        input_grad.index_add_(0, rows_in, grad_out @ weights[offset].t())
    return input_grad, filters_grad.view(filters.shape)


def _all_pairs(indice_pairs: torch.Tensor, indice_num: torch.Tensor) -> torch.Tensor:
    """``[2, P]``: every used (input row, output row) pair, without a host sync."""
    used = torch.arange(indice_pairs.shape[2], device=indice_pairs.device)[None, :]
    used = used < indice_num.to(indice_pairs.device).long()[:, None]
    return indice_pairs.permute(1, 0, 2)[:, used].long()


def indice_maxpool(
    features: torch.Tensor, indice_pairs: torch.Tensor, indice_num: torch.Tensor, num_out: int
) -> torch.Tensor:
    """Max over each output's inputs, and 0: mmcv's ``indice_maxpool_forward``."""
    rows_in, rows_out = _all_pairs(indice_pairs, indice_num)
    output = features.new_zeros(int(num_out), features.shape[1])
    index = rows_out[:, None].expand(-1, features.shape[1])
    return output.scatter_reduce_(0, index, features[rows_in], "amax", include_self=True)


def indice_maxpool_backward(
    features: torch.Tensor,
    out_features: torch.Tensor,
    out_grad: torch.Tensor,
    indice_pairs: torch.Tensor,
    indice_num: torch.Tensor,
) -> torch.Tensor:
    """Input gradient of :func:`indice_maxpool`: mmcv's ``indice_maxpool_backward``."""
    rows_in, rows_out = _all_pairs(indice_pairs, indice_num)
    hit = features[rows_in] == out_features[rows_out]
    grad = torch.zeros_like(features)
    return grad.index_add_(0, rows_in, out_grad[rows_out] * hit)
