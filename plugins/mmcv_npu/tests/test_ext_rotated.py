"""``mmcv._ext`` rotated boxes: the portable functions against mmcv 2.1.0's compiled ones.

``box_iou_rotated`` and ``nms_rotated`` are compared with mmcv's compiled CPU kernels
(the real ``mmcv._ext`` of the ``openmmlab_cpu_ops`` session) on the same inputs, with
the same preallocated outputs: random boxes, identical, nested, touching and zero-area
boxes, boxes turned by 90 degrees, one box, none, iou / iof / plain intersection,
aligned pairs, several thresholds, tied scores, ``multi_label`` (labels as a sixth
column), float64 and non-contiguous inputs; then through mmcv's own wrappers
(``box_iou_rotated``, ``nms_rotated``, ``nms_bev``) and mmdet3d's
``box3d_multiclass_nms`` with rotated NMS, and on (emulated) NPU tensors, where mmcv's
wrappers hand the angles over in degrees.

Tolerances: 1e-5 absolute and relative (the same float32 polygon, its area summed in
another order; relative for mode 2, which returns the area itself);
NMS keeps exactly the same indices in the same order.
"""

from __future__ import annotations

import importlib
import math
import types

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import rotated  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext.registry import IMPLEMENTATIONS  # noqa: E402


F32 = {"atol": 1e-5, "rtol": 1e-5}
PORTABLE = types.SimpleNamespace(
    box_iou_rotated=rotated.box_iou_rotated, nms_rotated=rotated.nms_rotated
)


def _boxes(count, seed=0, extent=50.0, size=(0.5, 10.0)):
    generator = torch.Generator().manual_seed(seed)
    centre = torch.rand(count, 2, generator=generator) * extent
    sides = torch.rand(count, 2, generator=generator) * (size[1] - size[0]) + size[0]
    angle = (torch.rand(count, 1, generator=generator) - 0.5) * 4 * math.pi
    return torch.cat((centre, sides, angle), 1)


def _edge_boxes():
    """Identical, turned by 90 degrees (the same rectangle), nested, touching, degenerate."""
    half_pi = math.pi / 2
    return torch.tensor(
        [
            [10.0, 10.0, 4.0, 2.0, 0.3],
            [10.0, 10.0, 4.0, 2.0, 0.3],  # identical
            [10.0, 10.0, 2.0, 4.0, 0.3 + half_pi],  # the same rectangle, turned
            [10.0, 10.0, 1.0, 0.5, 1.1],  # inside the first
            [14.0, 10.0, 4.0, 2.0, 0.0],  # edge to edge with the next
            [18.0, 10.0, 4.0, 2.0, 0.0],
            [10.0, 10.0, 0.0, 3.0, 0.2],  # zero width
            [10.0, 10.0, 0.0, 0.0, 0.0],  # a point
            [10.0, 10.0, 6.0, 6.0, math.pi / 4],  # a diamond over the first
            [10.0, 10.0, 6.0, 6.0, -math.pi],  # a square, upside down
            [40.0, 40.0, 3.0, 3.0, 0.0],  # far away
        ]
    )


def _iou(module, boxes1, boxes2, mode_flag=0, aligned=False):
    count = boxes1.shape[0] if aligned else boxes1.shape[0] * boxes2.shape[0]
    ious = boxes1.new_zeros(count)
    result = module.box_iou_rotated(boxes1, boxes2, ious, mode_flag=mode_flag, aligned=aligned)
    assert result is None
    return ious


def _nms(module, dets, scores, threshold, labels=None):
    order = scores.sort(0, descending=True)[1]
    rows = dets if labels is None else torch.cat((dets, labels[:, None].to(dets.dtype)), 1)
    input_labels = scores.new_empty(0, dtype=torch.int) if labels is None else labels
    return module.nms_rotated(
        rows, scores, order, rows[order], input_labels, threshold, int(labels is not None)
    )


def test_registered():
    assert IMPLEMENTATIONS["box_iou_rotated"] is rotated.box_iou_rotated
    assert IMPLEMENTATIONS["nms_rotated"] is rotated.nms_rotated


@pytest.mark.parametrize("mode_flag", [0, 1, 2])
@pytest.mark.parametrize("aligned", [False, True])
def test_box_iou_rotated_random(mode_flag, aligned):
    boxes1, boxes2 = _boxes(120, seed=1), _boxes(120 if aligned else 90, seed=2)
    if aligned:  # overlapping pairs, not only strangers
        boxes2[:, :2] = boxes1[:, :2] + torch.randn(
            120, 2, generator=torch.Generator().manual_seed(3)
        )
    expected = _iou(compiled, boxes1, boxes2, mode_flag, aligned)
    actual = _iou(rotated, boxes1, boxes2, mode_flag, aligned)
    assert (expected > 0).sum() > 20
    torch.testing.assert_close(actual, expected, **F32)


@pytest.mark.parametrize("mode_flag", [0, 1])
def test_box_iou_rotated_edge_cases(mode_flag):
    boxes = _edge_boxes()
    expected = _iou(compiled, boxes, boxes, mode_flag)
    actual = _iou(rotated, boxes, boxes, mode_flag)
    torch.testing.assert_close(actual, expected, **F32)
    square = actual.view(len(boxes), len(boxes))
    assert square[0, 1] == pytest.approx(1.0, abs=1e-5)
    assert square[0, 2] == pytest.approx(1.0, abs=1e-5)
    assert float(square[6:8].abs().sum() + square[:, 6:8].abs().sum()) == 0.0  # zero area


def test_box_iou_rotated_aligned_edge_cases():
    boxes = _edge_boxes()
    others = boxes.roll(1, 0)
    for mode_flag in (0, 1):
        expected = _iou(compiled, boxes, others, mode_flag, aligned=True)
        torch.testing.assert_close(_iou(rotated, boxes, others, mode_flag, True), expected, **F32)


def test_box_iou_rotated_one_and_empty():
    one = _boxes(1, seed=4)
    many = _boxes(7, seed=5, extent=8.0)
    torch.testing.assert_close(_iou(rotated, one, many), _iou(compiled, one, many), **F32)
    torch.testing.assert_close(_iou(rotated, many, one), _iou(compiled, many, one), **F32)
    for first, second in ((one[:0], many), (many, one[:0]), (one[:0], one[:0])):
        assert _iou(rotated, first, second).numel() == 0


def test_box_iou_rotated_dense_scene_and_non_contiguous():
    """Many overlapping boxes; columns of a wider tensor (non-contiguous rows)."""
    wide = torch.cat((_boxes(150, seed=6, extent=12.0), torch.zeros(150, 3)), 1)
    boxes1 = wide[:, :5]
    boxes2 = _boxes(80, seed=7, extent=12.0).t().contiguous().t()
    assert not boxes1.is_contiguous() and not boxes2.is_contiguous()
    expected = _iou(compiled, boxes1.contiguous(), boxes2.contiguous())
    torch.testing.assert_close(_iou(rotated, boxes1, boxes2), expected, **F32)


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.3, 0.5, 0.7, 0.95])
def test_nms_rotated_random(threshold):
    dets = _boxes(600, seed=8, extent=60.0)
    scores = torch.rand(600, generator=torch.Generator().manual_seed(9))
    expected = _nms(compiled, dets, scores, threshold)
    actual = _nms(rotated, dets, scores, threshold)
    assert actual.dtype == torch.long
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("threshold", [-0.5, 0.0, 0.1, 0.5, 0.9999])
def test_nms_rotated_edge_boxes_and_tied_scores(threshold):
    dets = _edge_boxes()
    for scores in (
        torch.linspace(1.0, 0.1, len(dets)),
        torch.linspace(0.1, 1.0, len(dets)),
        torch.tensor([0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.2, 0.2, 0.5, 0.5, 0.1]),
    ):
        expected = _nms(compiled, dets, scores, threshold)
        assert torch.equal(_nms(rotated, dets, scores, threshold), expected)


def test_nms_rotated_one_and_empty():
    one = _boxes(1, seed=10)
    assert torch.equal(
        _nms(rotated, one, torch.ones(1), 0.5), _nms(compiled, one, torch.ones(1), 0.5)
    )
    empty = _nms(rotated, one[:0], torch.ones(0), 0.5)
    assert empty.dtype == torch.long and empty.numel() == 0


def test_nms_rotated_multi_label_labels_do_not_separate_boxes():
    """mmcv's CPU (and CUDA) kernels read five values per box: labels never split them."""
    dets = _boxes(300, seed=11, extent=30.0)
    generator = torch.Generator().manual_seed(12)
    scores = torch.rand(300, generator=generator)
    labels = torch.randint(0, 3, (300,), generator=generator, dtype=torch.int)
    expected = _nms(compiled, dets, scores, 0.3, labels)
    assert torch.equal(_nms(rotated, dets, scores, 0.3, labels), expected)
    assert torch.equal(expected, _nms(compiled, dets, scores, 0.3))


def test_nms_rotated_float64():
    dets = _boxes(200, seed=13, extent=25.0).double()
    scores = torch.rand(200, generator=torch.Generator().manual_seed(14)).double()
    assert torch.equal(_nms(rotated, dets, scores, 0.4), _nms(compiled, dets, scores, 0.4))


# ------------------------------------------------------------------- through mmcv's wrappers


def _with_ext(monkeypatch, module_name, ext_module):
    module = importlib.import_module(module_name)
    monkeypatch.setattr(module, "ext_module", ext_module)
    return module


def test_through_mmcvs_box_iou_rotated(monkeypatch):
    boxes1, boxes2 = _boxes(60, seed=15, extent=20.0), _boxes(40, seed=16, extent=20.0)
    results = []
    for ext_module in (compiled, PORTABLE):
        module = _with_ext(monkeypatch, "mmcv.ops.box_iou_rotated", ext_module)
        results.append(
            [
                module.box_iou_rotated(boxes1, boxes2, mode, aligned=False, clockwise=clockwise)
                for mode in ("iou", "iof")
                for clockwise in (True, False)
            ]
            + [module.box_iou_rotated(boxes1[:40], boxes2, "iou", aligned=True)]
        )
    for expected, actual in zip(*results, strict=True):
        torch.testing.assert_close(actual, expected, **F32)


def test_through_mmcvs_nms_rotated_and_nms_bev(monkeypatch):
    dets = _boxes(400, seed=17, extent=40.0)
    generator = torch.Generator().manual_seed(18)
    scores = torch.rand(400, generator=generator)
    labels = torch.randint(0, 4, (400,), generator=generator)
    corners = torch.cat((dets[:, :2] - dets[:, 2:4] / 2, dets[:, :2] + dets[:, 2:4] / 2), 1)
    xyxyr = torch.cat((corners, dets[:, 4:]), 1)
    results = []
    for ext_module in (compiled, PORTABLE):
        nms_module = _with_ext(monkeypatch, "mmcv.ops.nms", ext_module)
        iou3d = importlib.import_module("mmcv.ops.iou3d")
        with pytest.warns(DeprecationWarning):
            bev = iou3d.nms_bev(xyxyr, scores, 0.25, pre_max_size=300, post_max_size=100)
        results.append(
            (
                *nms_module.nms_rotated(dets, scores, 0.3),
                *nms_module.nms_rotated(dets, scores, 0.3, labels=labels),
                *nms_module.nms_rotated(dets, scores, 0.3, clockwise=False),
                bev,
            )
        )
    for expected, actual in zip(*results, strict=True):
        assert torch.equal(actual, expected)


def test_through_mmdet3d_box3d_multiclass_nms(monkeypatch):
    """SECOND / PointPillars predict: box3d_multiclass_nms with rotated BEV NMS."""
    require_stack("mmdet3d")
    from mmdet3d.models.layers import box3d_multiclass_nms
    from mmdet3d.structures import LiDARInstance3DBoxes
    from mmdet3d.structures import xywhr2xyxyr
    from mmengine.config import ConfigDict

    generator = torch.Generator().manual_seed(19)
    bev = _boxes(500, seed=20, extent=40.0, size=(1.0, 5.0))
    boxes = torch.cat(
        (bev[:, :2], torch.zeros(500, 1), bev[:, 2:4], torch.ones(500, 1), bev[:, 4:]), 1
    )
    scores = torch.rand(500, 4, generator=generator)
    scores[:, -1] = 0  # background
    cfg = ConfigDict(use_rotate_nms=True, nms_thr=0.2, score_thr=0.3, max_num=200)
    for_nms = xywhr2xyxyr(LiDARInstance3DBoxes(boxes).bev)
    results = []
    for ext_module in (compiled, PORTABLE):
        _with_ext(monkeypatch, "mmcv.ops.nms", ext_module)
        results.append(box3d_multiclass_nms(boxes, for_nms, scores, 0.3, 200, cfg))
    for expected, actual in zip(*results, strict=True):
        assert torch.equal(actual, expected)


def test_through_mmcvs_wrappers_on_npu_tensors(npu_emulator, monkeypatch):
    """On (emulated) NPU tensors, through mmcv's wrappers: the compiled kernel's results."""
    boxes1, boxes2 = _boxes(50, seed=21, extent=20.0), _boxes(30, seed=22, extent=20.0)
    scores = torch.rand(50, generator=torch.Generator().manual_seed(23))
    iou_module = _with_ext(monkeypatch, "mmcv.ops.box_iou_rotated", compiled)
    expected_iou = iou_module.box_iou_rotated(boxes1, boxes2, "iou")
    nms_module = _with_ext(monkeypatch, "mmcv.ops.nms", compiled)
    expected_keep = nms_module.nms_rotated(boxes1, scores, 0.2)[1]
    monkeypatch.setattr(iou_module, "ext_module", PORTABLE)
    monkeypatch.setattr(nms_module, "ext_module", PORTABLE)
    npu_boxes1, npu_boxes2 = boxes1.to("npu"), boxes2.to("npu")
    assert npu_boxes1.is_npu
    actual_iou = iou_module.box_iou_rotated(npu_boxes1, npu_boxes2, "iou")
    assert actual_iou.is_npu
    torch.testing.assert_close(actual_iou.cpu(), expected_iou, **F32)
    dets, keep = nms_module.nms_rotated(npu_boxes1, scores.to("npu"), 0.2)
    assert keep.is_npu
    assert torch.equal(keep.cpu(), expected_keep)
    assert dets.shape == (len(expected_keep), 6)


def test_angles_in_degrees_from_mmcvs_npu_branch(monkeypatch):
    """Where mmcv's wrappers take their NPU branch (device type ``npu``: a real NPU, not
    the emulator) they pass angles in degrees, scaled as below; the functions turn them
    back. The device test is replaced here, the scaling is mmcv 2.1.0's."""
    monkeypatch.setattr(rotated, "_angles_in_degrees", lambda tensor: True)
    boxes1, boxes2 = _boxes(50, seed=24, extent=20.0), _boxes(30, seed=25, extent=20.0)
    scores = torch.rand(50, generator=torch.Generator().manual_seed(26))
    scale = boxes1.new_ones(5)
    scale[-1] = 1.0 / 0.01745329252  # mmcv.ops.box_iou_rotated on npu
    torch.testing.assert_close(
        _iou(rotated, boxes1 * scale, boxes2 * scale), _iou(compiled, boxes1, boxes2), **F32
    )
    degrees = boxes1.clone()
    degrees[:, 4] *= 57.29578  # mmcv.ops.nms_rotated on npu
    empty_order = scores.new_empty(0, dtype=torch.long)
    keep = rotated.nms_rotated(
        degrees, scores, empty_order, degrees, scores.new_empty(0, dtype=torch.int), 0.2, 0
    )
    assert torch.equal(keep, _nms(compiled, boxes1, scores, 0.2))


def test_box_iou_rotated_where_mmcvs_hull_misorders_points():
    """A box inside another, edges nearly coinciding (an angle of -2 pi in float32):
    mmcv's CPU kernel returns 0.6 (its Graham scan leaves the points out of order, an
    intersection larger than the inner box); the portable code returns the IoU, 1/3."""
    inner = torch.tensor([[4.0, 0.0, 3.0, 1.0, 0.0]])
    outer = torch.tensor([[4.0, 1.0, 3.0, 3.0, -2 * math.pi]])
    assert float(_iou(compiled, inner, outer)) == pytest.approx(0.6, abs=1e-5)
    assert float(_iou(rotated, inner, outer)) == pytest.approx(1 / 3, abs=1e-6)


def test_nms_rotated_iou_exactly_at_the_threshold():
    """A 3x2 box inside a 6x5 one: IoU 6/30, exactly 0.2f in mmcv's float32 fan, which
    ``>=`` drops; the portable fan starts at mmcv's point, so it rounds alike."""
    dets = torch.tensor(
        [[4.0, 0.0, 6.0, 5.0, 1.7223012447357178], [4.0, 1.0, 3.0, 2.0, -2.37103009223938]]
    )
    scores = torch.tensor([0.9, 0.8])
    expected = _nms(compiled, dets, scores, 0.2)
    assert expected.tolist() == [0]
    assert torch.equal(_nms(rotated, dets, scores, 0.2), expected)
