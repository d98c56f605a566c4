"""``mmcv._ext`` iou3d family against explicit references (mmcv has no CPU kernel for it).

Runs in the nox session ``openmmlab_cpu_ops``. References written in this file:

- BEV overlap: the intersection area of the two rotated rectangles, by shapely's
  polygon intersection (shapely comes with mmdet3d), with mmcv's one deliberate
  difference: its kernel counts a corner lying less than 1e-2 outside the other box
  (in that box's frame) as inside, a vertex of the polygon; the reference takes the
  convex hull of the exact intersection and those corners. 1e-4 absolute and
  relative (float32 against float64).
- NMS: greedy suppression in score order (mmcv's ``nms3d`` sorts; the ``_ext``
  function receives sorted boxes) with IoU = overlap / (area_a + area_b - overlap),
  shapely's overlap for the rotated version and the axis-aligned formula (heading
  ignored) for ``nms3d_normal``; a box goes when its IoU with a kept one is above the
  threshold.

mmcv's own Python (``mmcv.ops.iou3d``) runs on the family (its ``ext_module``
replaced), so the calls are mmcv's own.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack


require_stack("mmcv-ops")
geometry = require_module("shapely.geometry", "mmdet3d")
affinity = require_module("shapely.affinity", "mmdet3d")

import torch  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import iou3d  # noqa: E402


OURS = SimpleNamespace(**{name: getattr(iou3d, name) for name in iou3d.__all__})
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture
def with_ours(monkeypatch):
    from mmcv.ops import iou3d as mmcv_iou3d

    monkeypatch.setattr(mmcv_iou3d, "ext_module", OURS)


def _polygon(box):
    x, y, _, dx, dy, _, heading = (float(v) for v in box)
    rectangle = geometry.box(x - dx / 2, y - dy / 2, x + dx / 2, y + dy / 2)
    return affinity.rotate(rectangle, heading, origin=(x, y), use_radians=True)


def _near_corners(box, other):
    """Corners of ``other`` less than 1e-2 outside ``box`` (mmcv's margin), or inside it."""
    x, y, _, dx, dy, _, heading = (float(v) for v in box)
    near = []
    for cx, cy in list(_polygon(other).exterior.coords)[:4]:
        along = (cx - x) * math.cos(heading) + (cy - y) * math.sin(heading)
        across = -(cx - x) * math.sin(heading) + (cy - y) * math.cos(heading)
        if abs(along) < dx / 2 + 1e-2 and abs(across) < dy / 2 + 1e-2:
            near.append((cx, cy))
    return near


def _overlap(box_a, box_b):
    exact = _polygon(box_a).intersection(_polygon(box_b))
    corners = _near_corners(box_a, box_b) + _near_corners(box_b, box_a)
    return exact.union(geometry.MultiPoint(corners)).convex_hull.area if corners else exact.area


def _reference_overlaps(a, b):
    out = torch.zeros(len(a), len(b))
    for i, box_a in enumerate(a):
        for j, box_b in enumerate(b):
            out[i, j] = _overlap(box_a, box_b)
    return out


def _boxes(count, seed, spread=6.0):
    g = torch.Generator().manual_seed(seed)
    centre = torch.rand(count, 3, generator=g) * spread
    size = torch.rand(count, 3, generator=g) * 3 + 0.5
    heading = torch.rand(count, 1, generator=g) * 2 * math.pi - math.pi
    return torch.cat((centre, size, heading), 1)


SCENES = {
    "random": (_boxes(15, 0), _boxes(11, 1)),
    "dense": (_boxes(20, 2, spread=2.0), _boxes(20, 3, spread=2.0)),
    "identical": (_boxes(4, 4), _boxes(4, 4)),
    "nested": (
        torch.tensor([[0, 0, 0, 4, 4, 1, 0.0], [0, 0, 0, 4, 2, 1, 0.5]]),
        torch.tensor([[0, 0, 0, 1, 1, 1, 0.3], [0.5, 0, 0, 1, 1.5, 1, -1.0]]),
    ),
    "apart": (_boxes(3, 5), _boxes(3, 6) + torch.tensor([100.0, 0, 0, 0, 0, 0, 0])),
    "degenerate": (
        torch.tensor([[0, 0, 0, 0, 2, 1, 0.0], [1, 1, 0, 0, 0, 1, 0.2]]),
        _boxes(3, 7, spread=1.0),
    ),
    "axis-aligned": (
        torch.tensor([[0, 0, 0, 2, 2, 1, 0.0], [1, 0.5, 0, 2, 3, 1, 0.0]]),
        torch.tensor([[0.5, 0.5, 0, 2, 1, 1, 0.0], [-1.3, 0.2, 0, 1.1, 1.7, 1, 0.0]]),
    ),
}


@pytest.mark.parametrize("scene", list(SCENES))
def test_boxes_overlap_bev_matches_the_polygon_areas(with_ours, scene):
    from mmcv.ops import boxes_overlap_bev

    a, b = SCENES[scene]
    got = boxes_overlap_bev(a, b)
    assert got.dtype == torch.float32 and got.shape == (len(a), len(b))
    torch.testing.assert_close(got, _reference_overlaps(a, b), **TOL)


def test_boxes_iou3d_and_empty_sets(with_ours):
    from mmcv.ops import boxes_iou3d

    a, b = SCENES["dense"]
    overlap = _reference_overlaps(a, b)
    low = torch.max((a[:, 2] - a[:, 5] / 2)[:, None], (b[:, 2] - b[:, 5] / 2)[None])
    high = torch.min((a[:, 2] + a[:, 5] / 2)[:, None], (b[:, 2] + b[:, 5] / 2)[None])
    inter = overlap * (high - low).clamp(min=0)
    volume = (a[:, 3] * a[:, 4] * a[:, 5])[:, None] + (b[:, 3] * b[:, 4] * b[:, 5])[None]
    torch.testing.assert_close(boxes_iou3d(a, b), inter / (volume - inter).clamp(min=1e-6), **TOL)
    assert boxes_iou3d(a[:0], b).shape == (0, len(b))
    assert boxes_iou3d(a, b[:0]).shape == (len(a), 0)


def test_overlap_on_non_contiguous_and_fp64_boxes():
    a, b = SCENES["random"]
    out = torch.zeros(len(a), len(b))
    iou3d.iou3d_boxes_overlap_bev_forward(a.double().t().contiguous().t(), b.double(), out)
    torch.testing.assert_close(out, _reference_overlaps(a, b), **TOL)


def _greedy_reference(boxes, threshold, normal):
    def iou(i, j):
        if normal:
            flat_i, flat_j = boxes[i].clone(), boxes[j].clone()
            flat_i[6] = flat_j[6] = 0.0
            inter = _polygon(flat_i).intersection(_polygon(flat_j)).area
        else:
            inter = _overlap(boxes[i], boxes[j])
        union = float(boxes[i, 3] * boxes[i, 4] + boxes[j, 3] * boxes[j, 4]) - inter
        return inter / max(union, 1e-8)

    kept = []
    for i in range(len(boxes)):
        if all(iou(k, i) <= threshold for k in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("normal", [False, True], ids=["rotated", "normal"])
@pytest.mark.parametrize(
    ("count", "seed", "spread", "threshold"),
    [(40, 0, 6.0, 0.3), (40, 1, 3.0, 0.1), (25, 2, 8.0, 0.5), (1, 3, 1.0, 0.3), (30, 4, 2.0, 0.0)],
)
def test_nms3d_matches_greedy_suppression(with_ours, normal, count, seed, spread, threshold):
    from mmcv.ops import nms3d
    from mmcv.ops import nms3d_normal

    boxes = _boxes(count, seed, spread)
    scores = torch.rand(count, generator=torch.Generator().manual_seed(seed + 50))
    keep = (nms3d_normal if normal else nms3d)(boxes, scores, threshold)
    order = scores.sort(0, descending=True)[1]
    expected = order[_greedy_reference(boxes[order], threshold, normal)]
    assert keep.dtype == torch.long and keep.tolist() == expected.tolist()


@pytest.mark.parametrize("name", ["iou3d_nms3d_forward", "iou3d_nms3d_normal_forward"])
def test_nms_edge_cases(name):
    function = getattr(iou3d, name)
    keep = torch.full((0,), 9, dtype=torch.long)
    num_out = torch.tensor(5)
    function(torch.zeros(0, 7), keep, num_out, nms_overlap_thresh=0.5)
    assert int(num_out) == 0
    duplicates = _boxes(3, 9).repeat(3, 1)  # box i equals boxes i + 3 and i + 6
    keep = torch.zeros(9, dtype=torch.long)
    function(duplicates, keep, num_out, nms_overlap_thresh=0.99)
    kept = keep[: int(num_out)].tolist()
    assert kept[0] == 0 and all(k < 3 for k in kept)
    # a negative threshold drops every later box, even ones far apart
    apart = torch.cat((_boxes(2, 1), _boxes(2, 2) + torch.tensor([50.0, 0, 0, 0, 0, 0, 0])))
    function(apart, keep, num_out, nms_overlap_thresh=-0.1)
    assert int(num_out) == 1 and int(keep[0]) == 0


def test_npu_tensors_run_on_the_portable_kernels(npu_emulator, monkeypatch):
    from ascend_patch_mmcv import _kernel_source

    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    _kernel_source.forget_choices()
    try:
        a, b = SCENES["random"]
        out = torch.zeros(len(a), len(b), device="npu")
        iou3d.iou3d_boxes_overlap_bev_forward(a.to("npu"), b.to("npu"), out)
        torch.testing.assert_close(out.cpu(), _reference_overlaps(a, b), **TOL)
        assert _kernel_source.choose("iou3d_boxes_overlap_bev_forward") == _kernel_source.PORTABLE
    finally:
        _kernel_source.forget_choices()


def test_mx_driving_paths(npu_emulator, monkeypatch):
    """Test doubles of mx_driving's functions (the emulator has no kernel for them).

    They return what DrivingSDK's Python wrappers document -- overlap areas ``[N, M]``;
    for NMS, indices into the caller's boxes after sorting by the given scores -- and
    check the glue: mmcv's ``_ext`` NMS gets boxes already sorted, so the scores passed
    must keep that order.
    """
    from ascend_patch_mmcv import _kernel_source

    mx_driving = pytest.importorskip("mx_driving")
    monkeypatch.delenv(_kernel_source.VARIABLE, raising=False)
    a, b = SCENES["random"]
    expected = _reference_overlaps(a, b)
    calls = []

    def nms_double(normal):
        def nms(boxes, scores, threshold):
            calls.append("nms3d_normal" if normal else "nms3d")
            order = scores.sort(0, descending=True)[1]
            kept = _greedy_reference(boxes[order], threshold, normal)
            return order[kept]

        return nms

    monkeypatch.setattr(
        mx_driving, "boxes_overlap_bev", lambda x, y: calls.append("bev") or expected.clone()
    )
    monkeypatch.setattr(mx_driving, "nms3d", nms_double(False))
    monkeypatch.setattr(mx_driving, "nms3d_normal", nms_double(True))
    _kernel_source.forget_choices()
    try:
        out = torch.zeros(len(a), len(b))
        iou3d.iou3d_boxes_overlap_bev_forward(a.to("npu"), b.to("npu"), out)
        assert torch.equal(out, expected)
        boxes = _boxes(30, 8, spread=3.0)
        for name, normal in (("iou3d_nms3d_forward", False), ("iou3d_nms3d_normal_forward", True)):
            keep = torch.zeros(30, dtype=torch.long)
            num_out = torch.zeros((), dtype=torch.long)
            getattr(iou3d, name)(boxes.to("npu"), keep, num_out, nms_overlap_thresh=0.2)
            assert keep[: int(num_out)].tolist() == _greedy_reference(boxes, 0.2, normal)
        assert calls == ["bev", "nms3d", "nms3d_normal"]
    finally:
        _kernel_source.forget_choices()
