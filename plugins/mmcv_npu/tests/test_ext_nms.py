"""The ``mmcv._ext`` NMS family (``served/mmcv_ext/nms.py``) against mmcv's compiled CPU kernels.

Runs where mmcv 2.1.0 has its compiled ops (nox -s openmmlab_cpu_ops): each case calls
the real ``mmcv._ext`` function and ours on the same inputs (ours by keyword, as
mmcv's wrappers call them) and asks for equal results -- the same indices in the same
order, the same groups, the same ``dets`` written in place. The one tolerance:
Gaussian soft-NMS scores may differ in the last bit (the C library's ``expf`` and
torch's ``exp`` round a few values differently); its indices are still equal.

Both greedy strategies run (blocks in score order, then the sweep over ``x1`` for
what is left): ``BLOCK`` is made small so that small inputs take several blocks.
"""

from __future__ import annotations

import inspect

import pytest
from mmcv_stacks import require_stack


require_stack("mmcv-ops")

import mmcv._ext as compiled  # noqa: E402
import torch  # noqa: E402
from ascend_patch_mmcv.served.mmcv_ext import nms as ours  # noqa: E402


THRESHOLDS = [-0.1, 0.0, 0.3, 0.5, 0.7, 1.0]


def _boxes(generator: torch.Generator, n: int, field: float, scale: float = 80.0) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=generator) * field
    wh = torch.rand(n, 2, generator=generator) * scale + 1
    return torch.cat([xy, xy + wh], 1)


def _scene(seed: int, n: int, field: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes (every 4th scene on integer coordinates: equal edges) and scores (every 3rd tied)."""
    generator = torch.Generator().manual_seed(seed)
    boxes = _boxes(generator, n, field)
    if seed % 4 == 0:
        boxes = boxes.round()
    scores = torch.rand(n, generator=generator)
    if seed % 3 == 0:
        scores = (scores * 5).round() / 5
    return boxes, scores


@pytest.fixture(params=[(4, 1), (32, 8), (ours.BLOCK, ours.FIRST_BLOCK)], ids=str)
def block(request, monkeypatch):
    monkeypatch.setattr(ours, "BLOCK", request.param[0])
    monkeypatch.setattr(ours, "FIRST_BLOCK", request.param[1])
    return request.param


@pytest.mark.parametrize("field", [30.0, 300.0, 3000.0], ids=["crowded", "mixed", "spread"])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_nms_and_nms_match_equal_the_compiled_kernels(block, field, offset, threshold):
    for seed in range(4):
        boxes, scores = _scene(seed + int(field) + 7 * offset, 150, field)
        expected = compiled.nms(boxes, scores, iou_threshold=threshold, offset=offset)
        got = ours.nms(boxes=boxes, scores=scores, iou_threshold=threshold, offset=offset)
        assert got.dtype == torch.int64
        assert torch.equal(got, expected), (seed, threshold, offset)
        dets = torch.cat([boxes, scores[:, None]], 1)
        assert ours.nms_match(dets=dets, iou_threshold=threshold) == compiled.nms_match(
            dets, iou_threshold=threshold
        )


def test_both_greedy_strategies_run(monkeypatch):
    """Crowded boxes end in the score-order blocks; spread-out ones hand over to the sweep."""
    calls: list[int] = []
    original = ours._greedy_swept

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(ours, "_greedy_swept", counting)
    monkeypatch.setattr(ours, "BLOCK", 16)
    crowded, scores = _scene(2, 400, 10.0)
    assert torch.equal(ours.nms(crowded, scores, 0.5, 0), compiled.nms(crowded, scores, 0.5, 0))
    assert calls == []
    spread, scores = _scene(1, 400, 5000.0)
    assert torch.equal(ours.nms(spread, scores, 0.5, 0), compiled.nms(spread, scores, 0.5, 0))
    assert calls == [1]


def test_edge_cases():
    """Empty, one box, degenerate (zero-area) and identical boxes, non-contiguous inputs."""
    empty = torch.zeros(0, 4)
    assert torch.equal(
        ours.nms(empty, torch.zeros(0), 0.5, 0), compiled.nms(empty, torch.zeros(0), 0.5, 0)
    )
    assert ours.nms_match(torch.zeros(0, 5), 0.5) == []
    one = torch.tensor([[1.0, 2.0, 5.0, 7.0]])
    assert ours.nms(one, torch.tensor([0.3]), 0.5, 1).tolist() == [0]
    assert ours.nms_match(torch.tensor([[1.0, 2.0, 5.0, 7.0, 0.3]]), 0.5) == [[0]]
    degenerate = torch.tensor(
        [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 5], [0, 0, 4, 4], [0, 0, 4, 4], [2, 2, 2, 2]],
        dtype=torch.float32,
    )
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.6, 0.1])
    for offset in (0, 1):
        for threshold in (0.0, 0.5, 1.0):
            assert torch.equal(
                ours.nms(degenerate, scores, threshold, offset),
                compiled.nms(degenerate, scores, iou_threshold=threshold, offset=offset),
            )
    wide, scores = _scene(5, 200, 300.0)
    strided = torch.cat([wide, wide], 1)[:, 2:6]  # a view with stride 8
    sparse_scores = torch.stack([scores, scores], 1)[:, 0]
    assert not strided.is_contiguous() and not sparse_scores.is_contiguous()
    assert torch.equal(
        ours.nms(strided, sparse_scores, 0.5, 0), compiled.nms(strided, sparse_scores, 0.5, 0)
    )


def test_fp16_is_computed_in_float32():
    """mmcv's CPU kernel takes float32 only; ours takes float16 and computes in float32."""
    boxes, scores = _scene(11, 200, 300.0)
    half_boxes, half_scores = boxes.half(), scores.half()
    with pytest.raises(RuntimeError):
        compiled.nms(half_boxes, half_scores, iou_threshold=0.5, offset=0)
    assert torch.equal(
        ours.nms(half_boxes, half_scores, 0.5, 0),
        compiled.nms(half_boxes.float(), half_scores.float(), iou_threshold=0.5, offset=0),
    )


@pytest.mark.parametrize("method", [0, 1, 2], ids=["naive", "linear", "gaussian"])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("min_score", [1e-3, 0.05, 0.5])
def test_softnms_equals_the_compiled_kernel(method, offset, threshold, min_score):
    for seed in range(3):
        boxes, scores = _scene(seed + 100 * method, 120, 300.0)
        expected_dets = torch.full((120, 5), -1.0)
        got_dets = torch.full((120, 5), -1.0)
        expected = compiled.softnms(
            boxes,
            scores,
            expected_dets,
            iou_threshold=threshold,
            sigma=0.5,
            min_score=min_score,
            method=method,
            offset=offset,
        )
        got = ours.softnms(
            boxes=boxes,
            scores=scores,
            dets=got_dets,
            iou_threshold=threshold,
            sigma=0.5,
            min_score=min_score,
            method=method,
            offset=offset,
        )
        assert got.dtype == torch.int64
        assert torch.equal(got, expected), (seed, method)
        kept = len(expected)
        if method == 2:
            torch.testing.assert_close(got_dets[:kept], expected_dets[:kept], rtol=1e-6, atol=0)
        else:
            assert torch.equal(got_dets[:kept], expected_dets[:kept])
        assert torch.equal(got_dets[kept:], expected_dets[kept:])  # rows past the end untouched


def test_softnms_edge_cases():
    dets = torch.empty(0, 5)
    assert ours.softnms(torch.zeros(0, 4), torch.zeros(0), dets, 0.3, 0.5, 1e-3, 1, 0).numel() == 0
    one = torch.tensor([[1.0, 2.0, 5.0, 7.0]])
    out = torch.zeros(1, 5)
    assert ours.softnms(one, torch.tensor([0.4]), out, 0.3, 0.5, 1e-3, 2, 0).tolist() == [0]
    assert out.tolist() == [[1.0, 2.0, 5.0, 7.0, pytest.approx(0.4)]]
    low = torch.zeros(1, 5)
    assert ours.softnms(one, torch.tensor([1e-4]), low, 0.3, 0.5, 1e-3, 2, 0).tolist() == [0]


def test_signatures_are_mmcvs():
    """Argument names and order of mmcv's pybind declarations (call sites pass keywords)."""
    assert list(inspect.signature(ours.nms).parameters) == [
        "boxes",
        "scores",
        "iou_threshold",
        "offset",
    ]
    assert list(inspect.signature(ours.softnms).parameters) == [
        "boxes", "scores", "dets", "iou_threshold", "sigma", "min_score", "method", "offset"
    ]  # fmt: skip
    assert list(inspect.signature(ours.nms_match).parameters) == ["dets", "iou_threshold"]


@pytest.fixture
def mmcv_ops_on_ours(monkeypatch):
    """mmcv's own Python wrappers (nms, soft_nms, batched_nms, nms_match) calling our functions."""
    import importlib
    import types

    wrappers = importlib.import_module(
        "mmcv.ops.nms"
    )  # the module (mmcv.ops.nms is also a function)

    ext = types.SimpleNamespace(
        nms=ours.nms,
        softnms=ours.softnms,
        nms_match=ours.nms_match,
        nms_rotated=compiled.nms_rotated,
        nms_quadri=compiled.nms_quadri,
    )
    reference = wrappers.ext_module
    monkeypatch.setattr(wrappers, "ext_module", ext)
    return wrappers, reference


@pytest.mark.parametrize("nms_type", ["nms", "soft_nms"])
@pytest.mark.parametrize("split_thr", [10000, 50], ids=["one-call", "per-class"])
def test_batched_nms_through_mmcvs_wrappers(mmcv_ops_on_ours, monkeypatch, nms_type, split_thr):
    wrappers, reference = mmcv_ops_on_ours
    boxes, scores = _scene(21, 300, 300.0)
    idxs = torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(3))
    cfg = {"type": nms_type, "iou_threshold": 0.6, "split_thr": split_thr}
    got = wrappers.batched_nms(boxes, scores, idxs, dict(cfg))
    monkeypatch.setattr(wrappers, "ext_module", reference)
    expected = wrappers.batched_nms(boxes, scores, idxs, dict(cfg))
    assert torch.equal(got[1], expected[1])
    torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=0)


def test_nms_match_through_mmcvs_wrapper(mmcv_ops_on_ours, monkeypatch):
    wrappers, reference = mmcv_ops_on_ours
    boxes, scores = _scene(22, 200, 200.0)
    dets = torch.cat([boxes, scores[:, None]], 1)
    got = wrappers.nms_match(dets, 0.5)
    got_numpy = wrappers.nms_match(dets.numpy(), 0.5)
    monkeypatch.setattr(wrappers, "ext_module", reference)
    expected = wrappers.nms_match(dets, 0.5)
    assert [g.tolist() for g in got] == [e.tolist() for e in expected]
    assert [g.tolist() for g in got_numpy] == [e.tolist() for e in expected]


def test_on_emulated_npu_tensors(npu_emulator):
    """NPU tensors run the portable code (IoU on the device, the greedy pass on the host)."""
    boxes, scores = _scene(31, 300, 300.0)
    expected = compiled.nms(boxes, scores, iou_threshold=0.5, offset=1)
    got = ours.nms(boxes.to("npu"), scores.to("npu"), 0.5, 1)
    assert got.is_npu  # emulated NPU tensors report device cpu (docs/emulator.md)
    assert torch.equal(got.cpu(), expected)
    dets = torch.cat([boxes, scores[:, None]], 1)
    assert ours.nms_match(dets.to("npu"), 0.5) == compiled.nms_match(dets, iou_threshold=0.5)
