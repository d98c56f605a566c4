"""``mmcv._ext.bbox_overlaps`` against mmcv 2.1.0's compiled CPU kernel.

Both are called with the same preallocated ``ious``, as ``mmcv/ops/bbox.py`` calls
them (keywords), for IoU and IoF, aligned and not, offset 0 and 1, random boxes,
degenerate ones (points, lines, inverted corners), one box, empty inputs,
non-contiguous inputs and outputs, half precision (mmcv's CPU kernel raises for
half: compared with its float32 result on the same values). Tolerance: float32 1e-6
(the same operations); float16 2e-3.
"""

from __future__ import annotations

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import bbox  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext.registry import IMPLEMENTATIONS  # noqa: E402


def _boxes(count, seed):
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * 50
    return torch.cat((corner, corner + torch.rand(count, 2, generator=generator) * 30), 1)


def _degenerate():
    return torch.tensor(
        [
            [5.0, 5.0, 5.0, 5.0],  # a point
            [0.0, 0.0, 10.0, 0.0],  # a line
            [10.0, 10.0, 0.0, 0.0],  # inverted corners
            [0.0, 0.0, 10.0, 10.0],
            [-5.0, -5.0, 3.0, 4.0],
        ]
    )


def _overlaps(module, boxes1, boxes2, mode, aligned, offset):
    shape = (boxes1.shape[0],) if aligned else (boxes1.shape[0], boxes2.shape[0])
    ious = boxes1.new_zeros(shape)
    module.bbox_overlaps(boxes1, boxes2, ious, mode=mode, aligned=aligned, offset=offset)
    return ious


def test_registered():
    assert IMPLEMENTATIONS["bbox_overlaps"] is bbox.bbox_overlaps


@pytest.mark.parametrize("mode", [0, 1], ids=["iou", "iof"])
@pytest.mark.parametrize("aligned", [False, True], ids=["pairs", "aligned"])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("case", ["random", "degenerate", "one"])
def test_bbox_overlaps_matches_mmcvs_cpu_kernel(mode, aligned, offset, case):
    if case == "random":
        boxes1, boxes2 = _boxes(30, 0), _boxes(30 if aligned else 45, 1)
    elif case == "degenerate":
        boxes1, boxes2 = _degenerate(), _degenerate().flip(0)
    else:
        boxes1, boxes2 = _boxes(1, 2), _boxes(1, 3)
    expected = _overlaps(compiled, boxes1, boxes2, mode, aligned, offset)
    actual = _overlaps(bbox, boxes1, boxes2, mode, aligned, offset)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6, equal_nan=True)


def test_bbox_overlaps_half_and_non_contiguous():
    boxes1, boxes2 = _boxes(20, 4), _boxes(25, 5)
    # mmcv's CPU kernel has no half path (its clamp bound overflows half): the reference
    # is the float32 kernel on the same half values.
    with pytest.raises(RuntimeError, match="Half"):
        _overlaps(compiled, boxes1.half(), boxes2.half(), 0, False, 0)
    for mode in (0, 1):
        expected = _overlaps(compiled, boxes1.half().float(), boxes2.half().float(), mode, False, 0)
        actual = _overlaps(bbox, boxes1.half(), boxes2.half(), mode, False, 0)
        assert actual.dtype == torch.half
        torch.testing.assert_close(actual.float(), expected, atol=2e-3, rtol=2e-3)
    strided1 = torch.cat((boxes1, boxes1), 1)[:, ::2]
    strided1[:] = boxes1
    strided2 = boxes2.t().contiguous().t()
    assert not strided1.is_contiguous() and not strided2.is_contiguous()
    ious = torch.zeros(45, 20)[::, :].t()  # a transposed output view
    bbox.bbox_overlaps(strided1, strided2, ious[:, :25], mode=0, aligned=False, offset=0)
    torch.testing.assert_close(
        ious[:, :25], _overlaps(compiled, boxes1, boxes2, 0, False, 0), atol=1e-6, rtol=1e-6
    )


def test_bbox_overlaps_empty_inputs_leave_ious_alone():
    for rows, cols in ((0, 3), (3, 0), (0, 0)):
        ious = torch.zeros(rows, cols)
        bbox.bbox_overlaps(_boxes(rows, 0), _boxes(cols, 1), ious, 0, False, 0)
        assert ious.shape == (rows, cols)


def test_bbox_overlaps_on_npu_tensors(npu_emulator):
    boxes1, boxes2 = _boxes(10, 6), _boxes(12, 7)
    expected = _overlaps(compiled, boxes1, boxes2, 0, False, 1)
    actual = _overlaps(bbox, boxes1.to("npu"), boxes2.to("npu"), 0, False, 1)
    assert actual.is_npu
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-6, rtol=1e-6)


def test_through_mmcvs_bbox_overlaps(monkeypatch):
    """mmcv.ops.bbox_overlaps (its allocation and call) on this function."""
    import types

    from mmcv.ops import bbox as mmcv_bbox

    boxes1, boxes2 = _boxes(7, 8), _boxes(9, 9)
    expected = mmcv_bbox.bbox_overlaps(boxes1, boxes2, "iof", offset=1)
    monkeypatch.setattr(
        mmcv_bbox, "ext_module", types.SimpleNamespace(bbox_overlaps=bbox.bbox_overlaps)
    )
    torch.testing.assert_close(mmcv_bbox.bbox_overlaps(boxes1, boxes2, "iof", offset=1), expected)
    aligned = mmcv_bbox.bbox_overlaps(boxes1, boxes2[:7], aligned=True)
    assert aligned.shape == (7,)
    assert mmcv_bbox.bbox_overlaps(boxes1[:0], boxes2).shape == (0, 9)
