"""``mmcv._ext`` RoI pooling: ``roi_align_forward/backward`` and ``roi_pool_forward/backward``.

Arguments, order and in-place outputs are mmcv 2.1.0's (``mmcv/ops/roi_align.py``
and ``roi_pool.py`` allocate the outputs and call these); ``rois`` are ``[K, 5]``
rows ``(batch_index, x1, y1, x2, y2)``.

RoIAlign follows mmcv's CPU kernel (Detectron2's): samples at ``start + (i + 0.5) *
bin / grid``, bilinear with the kernel's clamping, ``aligned`` shifts by half a pixel
and drops the 1-pixel minimum roi size, ``sampling_ratio <= 0`` takes
``ceil(roi_size / pooled_size)`` samples per bin side, a count that differs per roi.
Every ``(roi, bin, sample)`` goes into one flat index (``repeat_interleave`` over each
roi's own count: no padding to the largest roi, no loop over rois); average pooling
reduces each bin with ``embedding_bag`` (per-sample weights = bilinear weight / count)
over the channels-last map, building no ``samples x channels`` tensor; max pooling
builds it, reduces with ``scatter_reduce`` and records the first largest sample
(``argmax_y/argmax_x``, -1 for none). The backward scatters back the same way (an
``embedding_bag`` over the entries sorted by pixel for average pooling).

On NPU tensors average pooling runs ``torch_npu.npu_roi_align`` /
``npu_roi_alignbk`` (``roi_end_mode`` 3 for ``aligned``, 0 otherwise, as
``torch_npu.contrib.module.ROIAlign`` passes; equal to the portable kernel on the
emulator's reference kernels); max pooling has no NPU kernel and runs portable.

RoIPool (mmcv has no CPU kernel; the reference is its CUDA kernel): bins
``floor/ceil`` of ``roi * scale`` split in equal parts, clipped to the map, max
over the bin's pixels, ``argmax`` the flat pixel offset of the first maximum (-1
and output 0 for an empty bin); a roi of zero or negative size is skipped (its
output and argmax are left as the caller allocated them, as the kernel does).
"""

from __future__ import annotations

from typing import Any

from ... import _kernel_source
from .registry import implements


__all__ = ["roi_align_backward", "roi_align_forward", "roi_pool_backward", "roi_pool_forward"]

OP = "roi_align"
_SOURCES = (_kernel_source.TORCH_NPU, _kernel_source.PORTABLE)
_AVG = 1  # pool_mode: 0 max, 1 average
#: The CPU kernel's starting maximum: a bin whose samples are all below it keeps it.
_MAX_START = -10000.0


def _on_npu(*tensors: Any) -> bool:
    return all(getattr(t, "is_npu", False) is True for t in tensors)


def _wide(dtype: Any) -> Any:
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


class _Samples:
    """Every RoIAlign sample of every bin, flat; bins numbered ``roi * PH * PW + bin``."""

    def __init__(
        self,
        rois: Any,
        shape: tuple[int, int, int, int],
        pooled: tuple[int, int],
        spatial_scale: float,
        sampling_ratio: int,
        aligned: bool,
    ) -> None:
        import torch

        _, _, height, width = shape
        ph_count, pw_count = pooled
        boxes = rois.to(_wide(rois.dtype))
        device = boxes.device
        shift = 0.5 if aligned else 0.0
        start_x = boxes[:, 1] * spatial_scale - shift
        start_y = boxes[:, 2] * spatial_scale - shift
        roi_w = boxes[:, 3] * spatial_scale - shift - start_x
        roi_h = boxes[:, 4] * spatial_scale - shift - start_y
        if aligned:
            if bool(((roi_w < 0) | (roi_h < 0)).any()):
                raise RuntimeError("ROIs in ROIAlign cannot have non-negative size!")
        else:
            roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
        bin_h, bin_w = roi_h / ph_count, roi_w / pw_count
        if sampling_ratio > 0:
            grid_h = torch.full_like(roi_h, sampling_ratio, dtype=torch.long)
            grid_w = torch.full_like(roi_w, sampling_ratio, dtype=torch.long)
        else:
            grid_h = torch.ceil(roi_h / ph_count).long()
            grid_w = torch.ceil(roi_w / pw_count).long()
        per_bin = grid_h * grid_w
        rois_count, bins_per_roi = boxes.shape[0], ph_count * pw_count
        #: samples per bin, for every bin
        self.counts = per_bin.repeat_interleave(bins_per_roi)
        roi = torch.arange(rois_count, device=device).repeat_interleave(per_bin * bins_per_roi)
        first = torch.cumsum(per_bin * bins_per_roi, 0) - per_bin * bins_per_roi
        local = torch.arange(roi.numel(), device=device) - first[roi]
        gh, gw = grid_h[roi], grid_w[roi]
        ix = local % gw
        iy = (local // gw) % gh
        in_roi = local // (gh * gw)
        pw, ph = in_roi % pw_count, in_roi // pw_count
        #: the bin of each sample
        self.bin = roi * bins_per_roi + in_roi
        wide = boxes.dtype
        #: sample coordinates before clamping (the max-pool argmax)
        self.y = start_y[roi] + ph * bin_h[roi] + (iy.to(wide) + 0.5) * bin_h[roi] / gh.to(wide)
        self.x = start_x[roi] + pw * bin_w[roi] + (ix.to(wide) + 0.5) * bin_w[roi] / gw.to(wide)
        self.batch = boxes[:, 0].long()[roi]
        self.size = (height, width)
        self.bins = rois_count * bins_per_roi

    def corners(self) -> tuple[Any, Any]:
        """Per sample, 4 flat pixel indices into ``[N * H * W]`` and bilinear weights."""
        import torch

        index, weights = _bilinear_corners(self.y, self.x, self.batch, *self.size)
        return torch.stack(index, 1), torch.stack(weights, 1)


def _bilinear_corners(y: Any, x: Any, batch: Any, height: int, width: int) -> tuple[Any, Any]:
    """mmcv's ``bilinear_interpolate``: 4 index tensors into ``N*H*W`` and 4 weights.

    Clamping into ``[0, size - 1]`` first is the kernel's rule: below 0 counts as 0,
    from the last pixel on both corners are the last pixel; more than one pixel
    outside, every weight is 0.
    """
    inside = (y >= -1.0) & (y <= height) & (x >= -1.0) & (x <= width)
    y, x = y.clamp(0, height - 1), x.clamp(0, width - 1)
    y_low, x_low = y.floor(), x.floor()
    ly, lx = (y - y_low) * inside, x - x_low
    hy, hx = (1 - (y - y_low)) * inside, 1 - lx
    y_low_i, x_low_i = y_low.long(), x_low.long()
    row_low = batch * (height * width) + y_low_i * width
    row_high = row_low + (y_low_i < height - 1) * width
    x_high_i = x_low_i + (x_low_i < width - 1)
    index = (row_low + x_low_i, row_low + x_high_i, row_high + x_low_i, row_high + x_high_i)
    return index, (hy * hx, hy * lx, ly * hx, ly * lx)


def _channels_last(input: Any, dtype: Any) -> Any:
    """``[N, C, H, W]`` -> ``[N * H * W, C]`` rows, one per pixel."""
    return input.to(dtype).permute(0, 2, 3, 1).reshape(-1, input.shape[1])


def _bag_sum(table: Any, index: Any, weights: Any, bag_of_entry: Any, bags: int) -> Any:
    """``out[b] = sum(weights[j] * table[index[j]] for j in bag b)``; entries sorted by bag."""
    import torch
    import torch.nn.functional as F

    if index.numel() == 0:
        return table.new_zeros(bags, table.shape[1])
    sizes = torch.bincount(bag_of_entry, minlength=bags)
    offsets = torch.cumsum(sizes, 0) - sizes
    return F.embedding_bag(
        index, table, offsets, mode="sum", per_sample_weights=weights.to(table.dtype)
    )


def _write_bins(target: Any, bins: Any, pooled: tuple[int, int]) -> None:
    """``[K * PH * PW, C]`` -> ``target [K, C, PH, PW]``."""
    rois = target.shape[0]
    target.copy_(bins.view(rois, pooled[0], pooled[1], -1).permute(0, 3, 1, 2))


def _grouped_max(values: Any, counts: Any, channels: int) -> tuple[Any, Any]:
    """Each bin's largest sample (at least the kernel's start) and the first one reaching it.

    Bins are grouped by their sample count (a handful of ``ceil(roi / bin)`` values): a
    loop over the counts, each a plain max over its bins' rows of samples.
    """
    import torch

    points, bins = values.shape[0], counts.shape[0]
    starts = torch.cumsum(counts, 0) - counts
    best = values.new_full((bins, channels), _MAX_START)
    first = torch.full((bins, channels), points, dtype=torch.long, device=values.device)
    for count in torch.unique(counts).tolist():
        if count == 0:
            continue
        which = (counts == count).nonzero().squeeze(1)
        rows = starts[which].unsqueeze(1) + torch.arange(count, device=values.device)
        top, where = values[rows].max(1)
        wins = top > _MAX_START
        best[which] = torch.where(wins, top, _MAX_START)
        first[which] = torch.where(wins, rows.gather(1, where), points)
    return best, first


def _portable_align(
    input: Any,
    rois: Any,
    output: Any,
    argmax_y: Any,
    argmax_x: Any,
    pooled: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    pool_mode: int,
    aligned: bool,
) -> None:
    import torch

    wide = _wide(input.dtype)
    samples = _Samples(rois, tuple(input.shape), pooled, spatial_scale, sampling_ratio, aligned)
    index, weights = samples.corners()
    table = _channels_last(input, wide)
    if pool_mode == _AVG:
        count = samples.counts.clamp(min=1).to(wide)[samples.bin]
        per_entry = (weights / count.unsqueeze(1)).flatten()
        bag = samples.bin.repeat_interleave(4)
        _write_bins(output, _bag_sum(table, index.flatten(), per_entry, bag, samples.bins), pooled)
        return
    # Max: every sample's value (a bag of its 4 corners), then the largest per bin.
    points = samples.bin.numel()
    values = _bag_sum(
        table,
        index.flatten(),
        weights.flatten(),
        torch.arange(points, device=table.device).repeat_interleave(4),
        points,
    )
    channels = table.shape[1]
    if sampling_ratio > 0:
        # Every bin has the same samples, in a row: a plain max (its index is the first).
        best, first = values.view(samples.bins, -1, channels).max(1)
        first += torch.arange(0, points, points // samples.bins, device=first.device).unsqueeze(1)
        first = torch.where(best > _MAX_START, first, points)
        best = best.clamp(min=_MAX_START)
    else:
        best, first = _grouped_max(values, samples.counts, channels)
    found = first < points
    picked = first.clamp(max=max(points - 1, 0))
    if points:
        ys = torch.where(found, samples.y[picked], -1.0)
        xs = torch.where(found, samples.x[picked], -1.0)
    else:
        ys = xs = best.new_full(best.shape, -1.0)
    _write_bins(output, best, pooled)
    _write_bins(argmax_y, ys, pooled)
    _write_bins(argmax_x, xs, pooled)


def _portable_align_backward(
    grad_output: Any,
    rois: Any,
    argmax_y: Any,
    argmax_x: Any,
    grad_input: Any,
    pooled: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    pool_mode: int,
    aligned: bool,
) -> None:
    import torch

    wide = _wide(grad_output.dtype)
    batch, channels, height, width = grad_input.shape
    grads = grad_output.to(wide).permute(0, 2, 3, 1).reshape(-1, channels)
    if pool_mode == _AVG:
        samples = _Samples(
            rois, tuple(grad_input.shape), pooled, spatial_scale, sampling_ratio, aligned
        )
        index, weights = samples.corners()
        count = samples.counts.clamp(min=1).to(wide)[samples.bin]
        per_entry = (weights / count.unsqueeze(1)).flatten()
        bag = samples.bin.repeat_interleave(4)
        # Transposed: each pixel is a bag of the bins that sampled it.
        pixel = index.flatten()
        order = torch.argsort(pixel, stable=True)
        found = _bag_sum(grads, bag[order], per_entry[order], pixel[order], batch * height * width)
        grad_input += (
            found.view(batch, height, width, channels).permute(0, 3, 1, 2).to(grad_input.dtype)
        )
        return
    # Max: the gradient goes to the 4 pixels around each bin's recorded sample.
    rois_count = rois.shape[0]
    y = argmax_y.to(wide).flatten()
    x = argmax_x.to(wide).flatten()
    roi_of = torch.arange(rois_count, device=y.device).repeat_interleave(
        channels * pooled[0] * pooled[1]
    )
    channel_of = torch.arange(channels, device=y.device).repeat_interleave(pooled[0] * pooled[1])
    channel_of = channel_of.repeat(rois_count)
    image = rois[:, 0].long()[roi_of]
    grads = grad_output.to(wide).flatten() * (y != -1.0)
    index, weights = _bilinear_corners(y, x, image * channels + channel_of, height, width)
    total = torch.zeros(grad_input.numel(), dtype=wide, device=grad_input.device)
    for corner, weight in zip(index, weights, strict=True):
        total.index_add_(0, corner, weight * grads)
    grad_input += total.view(grad_input.shape).to(grad_input.dtype)


def _use_npu_kernel(features: Any, rois: Any, pool_mode: int, ratio: int, aligned: bool) -> bool:
    """Average pooling on NPU tensors with torch_npu chosen, except adaptive sampling of an
    aligned zero-width/height roi (mmcv: 0; the emulator's kernel divides by zero)."""
    if (
        pool_mode != _AVG
        or not _on_npu(features, rois)
        or _kernel_source.choose(OP, _SOURCES) != _kernel_source.TORCH_NPU
    ):
        return False
    return ratio > 0 or not aligned or not bool((rois[:, 3:5] == rois[:, 1:3]).any())


@implements("roi_align_forward", npu="torch_npu npu_roi_align (average pooling)")
def roi_align_forward(
    input: Any,
    rois: Any,
    output: Any,
    argmax_y: Any,
    argmax_x: Any,
    aligned_height: int,
    aligned_width: int,
    spatial_scale: float,
    sampling_ratio: int,
    pool_mode: int,
    aligned: bool,
) -> None:
    """RoIAlign into ``output [K, C, PH, PW]`` (and ``argmax_y/argmax_x`` for max pooling)."""
    if rois.shape[0] == 0 or output.numel() == 0:
        return
    pooled = (int(aligned_height), int(aligned_width))
    if _use_npu_kernel(input, rois, pool_mode, sampling_ratio, aligned):
        import torch_npu

        mode = 3 if aligned else 0
        scale, ratio = float(spatial_scale), int(sampling_ratio)
        output.copy_(
            torch_npu.npu_roi_align(input, rois.to(input.dtype), scale, *pooled, ratio, mode)
        )
        return
    settings = (pooled, float(spatial_scale), int(sampling_ratio), int(pool_mode), bool(aligned))
    _portable_align(input, rois, output, argmax_y, argmax_x, *settings)


@implements("roi_align_backward", npu="torch_npu npu_roi_alignbk (average pooling)")
def roi_align_backward(
    grad_output: Any,
    rois: Any,
    argmax_y: Any,
    argmax_x: Any,
    grad_input: Any,
    aligned_height: int,
    aligned_width: int,
    spatial_scale: float,
    sampling_ratio: int,
    pool_mode: int,
    aligned: bool,
) -> None:
    """Adds the input gradient of RoIAlign into ``grad_input [N, C, H, W]``."""
    if rois.shape[0] == 0 or grad_output.numel() == 0:
        return
    pooled = (int(aligned_height), int(aligned_width))
    if _use_npu_kernel(grad_output, rois, pool_mode, sampling_ratio, aligned):
        import torch_npu

        shape, mode = list(grad_input.shape), 3 if aligned else 0
        scale, ratio = float(spatial_scale), int(sampling_ratio)
        found = torch_npu.npu_roi_alignbk(
            grad_output.contiguous(), rois.to(grad_output.dtype), shape, pooled[1], pooled[0],
            scale, ratio, mode,
        )  # fmt: skip
        grad_input += found.to(grad_input.dtype)
        return
    settings = (pooled, float(spatial_scale), int(sampling_ratio), int(pool_mode), bool(aligned))
    _portable_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input, *settings)


@implements("roi_pool_forward")
def roi_pool_forward(
    input: Any,
    rois: Any,
    output: Any,
    argmax: Any,
    pooled_height: int,
    pooled_width: int,
    spatial_scale: float,
) -> None:
    """RoIPool (max) into ``output [K, C, PH, PW]`` and ``argmax`` (int32 pixel offsets)."""
    import torch

    if rois.shape[0] == 0 or output.numel() == 0:
        return
    ph_count, pw_count = int(pooled_height), int(pooled_width)
    _, channels, height, width = input.shape
    wide = _wide(input.dtype)
    boxes = rois.to(wide)
    device = boxes.device
    x1 = boxes[:, 1] * spatial_scale
    y1 = boxes[:, 2] * spatial_scale
    roi_w = (boxes[:, 3] + 1) * spatial_scale - x1
    roi_h = (boxes[:, 4] + 1) * spatial_scale - y1
    valid = (roi_w > 0) & (roi_h > 0)
    pw = torch.arange(pw_count, device=device, dtype=wide)
    ph = torch.arange(ph_count, device=device, dtype=wide)
    bin_w, bin_h = (roi_w / pw_count).unsqueeze(1), (roi_h / ph_count).unsqueeze(1)
    # [K, PW] and [K, PH] pixel ranges of each bin, clipped to the map.
    left = torch.floor(pw * bin_w + x1.unsqueeze(1)).long().clamp(0, width)
    right = torch.ceil((pw + 1) * bin_w + x1.unsqueeze(1)).long().clamp(0, width)
    top = torch.floor(ph * bin_h + y1.unsqueeze(1)).long().clamp(0, height)
    bottom = torch.ceil((ph + 1) * bin_h + y1.unsqueeze(1)).long().clamp(0, height)
    span_w = (right - left).clamp(min=0)
    span_h = (bottom - top).clamp(min=0)
    # Bins [K, PH, PW] and the pixels of each, listed row by row (the kernel's scan order).
    area = (span_h.unsqueeze(2) * span_w.unsqueeze(1)).flatten()
    bins = area.numel()
    bin_of = torch.arange(bins, device=device).repeat_interleave(area)
    local = torch.arange(bin_of.numel(), device=device) - (torch.cumsum(area, 0) - area)[bin_of]
    roi_of = bin_of // (ph_count * pw_count)
    row_of = (bin_of // pw_count) % ph_count
    col_of = bin_of % pw_count
    widths = span_w[roi_of, col_of]
    pixel_y = top[roi_of, row_of] + local // widths.clamp(min=1)
    pixel_x = left[roi_of, col_of] + local % widths.clamp(min=1)
    offset = pixel_y * width + pixel_x
    image = boxes[:, 0].long()[roi_of]
    table = _channels_last(input, wide)
    values = table[image * height * width + offset] if offset.numel() else table[:0]
    best = table.new_full((bins, channels), -torch.finfo(wide).max)
    spread = bin_of.unsqueeze(1).expand(-1, channels)
    best.scatter_reduce_(0, spread, values, "amax", include_self=True)
    pixels = bin_of.numel()
    winner = values == best[bin_of]
    order = torch.arange(pixels, device=device).unsqueeze(1).expand(-1, channels)
    first = torch.full((bins, channels), pixels, dtype=torch.long, device=device)
    first.scatter_reduce_(0, spread, torch.where(winner, order, pixels), "amin", include_self=True)
    empty = (area == 0).unsqueeze(1)
    best = torch.where(empty, 0.0, best)
    if pixels:
        where = torch.where(empty, -1, offset[first.clamp(max=pixels - 1)])
    else:
        where = torch.full((bins, channels), -1, dtype=torch.long, device=device)
    keep = valid.view(-1, 1, 1, 1)
    found = best.view(-1, ph_count, pw_count, channels).permute(0, 3, 1, 2)
    index = where.view(-1, ph_count, pw_count, channels).permute(0, 3, 1, 2)
    output.copy_(torch.where(keep, found.to(output.dtype), output))
    argmax.copy_(torch.where(keep, index.to(argmax.dtype), argmax))


@implements("roi_pool_backward")
def roi_pool_backward(
    grad_output: Any,
    rois: Any,
    argmax: Any,
    grad_input: Any,
    pooled_height: int,
    pooled_width: int,
    spatial_scale: float,
) -> None:
    """Adds each output gradient to the input pixel its ``argmax`` names (none for -1)."""
    import torch

    if rois.shape[0] == 0 or grad_output.numel() == 0:
        return
    _, channels, height, width = grad_input.shape
    per_roi = channels * int(pooled_height) * int(pooled_width)
    image = rois[:, 0].long().repeat_interleave(per_roi)
    channel = (
        torch.arange(channels, device=image.device)
        .repeat_interleave(int(pooled_height) * int(pooled_width))
        .repeat(rois.shape[0])
    )
    offset = argmax.long().flatten()
    hit = offset != -1
    index = (image * channels + channel) * (height * width) + offset
    values = grad_output.flatten().to(_wide(grad_input.dtype))
    total = torch.zeros(grad_input.numel(), dtype=values.dtype, device=values.device)
    total.index_add_(0, index[hit], values[hit])
    grad_input += total.view(grad_input.shape).to(grad_input.dtype)
