"""PseudoSampler on the real mmdet 3.3.0: the same SamplingResult as mmdet's, field by field.

Random assign results (mmdet's own ``AssignResult.random``: ignored, unassigned and
assigned priors, with and without labels, no ground truth at all, no priors at all)
are sampled by mmdet's ``PseudoSampler.sample`` and, on "npu" under the emulator, by
the group's replacement; every attribute of the two results must be equal, with the
same dtype. mmdet.models imports mmcv.ops: nox session ``openmmlab_cpu_ops``.
"""

from __future__ import annotations

import pytest
from mmcv_stacks import require_module
from mmcv_stacks import require_stack


require_stack("mmcv-ops")
require_stack("mmdet")

import torch  # noqa: E402
from ascend_patch_mmcv.groups import PseudoSampler  # noqa: E402


samplers = require_module("mmdet.models.task_modules.samplers", "mmdet")
assigners = require_module("mmdet.models.task_modules.assigners", "mmdet")
structures = require_module("mmengine.structures", "mmengine")
boxes = require_module("mmdet.structures.bbox", "mmdet")

TARGET = "mmdet.models.task_modules.samplers.pseudo_sampler:PseudoSampler.sample"
MMDET2_TARGET = "mmdet.core.bbox.samplers.pseudo_sampler:PseudoSampler.sample"


def random_case(seed, box_type):
    rng = seed
    generator = torch.Generator().manual_seed(seed)
    kwargs = {"rng": rng, "p_use_label": seed % 2 == 0}
    if seed % 7 == 3:
        kwargs["num_gts"] = 0
    if seed % 11 == 5:
        kwargs["num_preds"] = 0
    assign = assigners.AssignResult.random(**kwargs)
    num_preds, num_gts = assign.gt_inds.shape[0], assign.num_gts
    priors = torch.rand(num_preds, 4, generator=generator) * 100
    gt_bboxes = torch.rand(num_gts, 4, generator=generator) * 100
    if box_type:
        priors, gt_bboxes = boxes.HorizontalBoxes(priors), boxes.HorizontalBoxes(gt_bboxes)
    pred = structures.InstanceData(priors=priors)
    gt = structures.InstanceData(bboxes=gt_bboxes, labels=torch.zeros(num_gts, dtype=torch.long))
    return assign, pred, gt


def fields(result):
    out = {}
    for name, value in vars(result).items():
        if isinstance(value, boxes.BaseBoxes):
            value = (type(value).__name__, value.tensor)
        out[name] = value
    return out


def assert_same(expected, got):
    expected, got = fields(expected), fields(got)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        other = got[name]
        if isinstance(value, tuple):  # a box type: its class, then its tensor
            assert value[0] == other[0], name
            value, other = value[1], other[1]
        if isinstance(value, torch.Tensor):
            assert value.dtype == other.dtype and value.shape == other.shape, name
            assert torch.equal(value, other), name
        else:
            assert value == other, name


@pytest.mark.parametrize("box_type", [False, True], ids=["tensor", "HorizontalBoxes"])
def test_the_sampling_result_is_mmdets(box_type, npu_emulator, isolated_patcher):
    sampler = samplers.PseudoSampler()
    cases = [random_case(seed, box_type) for seed in range(40)]
    expected = [sampler.sample(*case) for case in cases]

    isolated_patcher.add(PseudoSampler).apply()
    got = [sampler.sample(*case) for case in cases]

    for want, have in zip(expected, got, strict=True):
        assert_same(want, have)
        assert have.avg_factor == want.avg_factor  # avg_factor_with_neg=False, as mmdet's
    record = isolated_patcher.report.get(TARGET)
    assert (record.counters.replacement_calls, record.counters.fallback_calls) == (40, 0)
    # mmdet 3.x: the 2.x patch is reported (its requirement is not met), not dropped.
    mmdet2 = isolated_patcher.report.get(MMDET2_TARGET)
    assert mmdet2.status == "skipped" and "mmdet" in mmdet2.reason


def test_cpu_tensors_keep_mmdets_code(isolated_patcher):
    sampler = samplers.PseudoSampler()
    case = random_case(1, False)
    expected = sampler.sample(*case)
    isolated_patcher.add(PseudoSampler).apply()
    assert_same(expected, sampler.sample(*case))
    record = isolated_patcher.report.get(TARGET)
    assert (record.counters.replacement_calls, record.counters.fallback_calls) == (0, 1)
