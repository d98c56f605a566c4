"""PseudoSampler: mmdet's ``PseudoSampler.sample`` without ``unique()`` on the NPU.

mmdet takes the positive and negative samples as
``torch.nonzero(gt_inds > 0).squeeze(-1).unique()`` (and ``== 0``). For the 1-D
``gt_inds`` of an assign result, ``nonzero`` already gives distinct indices in
increasing order, so ``unique()`` (sort and deduplicate: a costly op on the NPU)
returns its input unchanged. The replacement leaves it out and builds the
``SamplingResult`` with exactly mmdet's arguments, so every field (indices, priors,
gt flags, assigned gts and labels) is the same.

(DrivingSDK's patch passes the boolean masks instead of the indices, which changes
``pos_inds``/``neg_inds`` and every count taken from them; this one does not.)

Targets, one per mmdet line, each with its ``requires``:

* mmdet 2.x: ``mmdet.core.bbox.samplers.pseudo_sampler:PseudoSampler.sample``
  ``(assign_result, bboxes, gt_bboxes)``;
* mmdet 3.x: ``mmdet.models.task_modules.samplers.pseudo_sampler:PseudoSampler.sample``
  ``(assign_result, pred_instances, gt_instances)``, with ``avg_factor_with_neg=False``
  where its ``SamplingResult`` takes that argument (3.3 does).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Iterator
from typing import Any

from ascend_patch_core import AtomicPatch


__all__ = [
    "MMDET2_TARGET",
    "MMDET3_TARGET",
    "gt_inds_on_npu",
    "pseudo_sampler_patches",
    "sample_mmdet2",
    "sample_mmdet3",
    "sampled_indices",
]

MMDET2_MODULE = "mmdet.core.bbox.samplers.pseudo_sampler"
MMDET3_MODULE = "mmdet.models.task_modules.samplers.pseudo_sampler"
MMDET2_TARGET = f"{MMDET2_MODULE}:PseudoSampler.sample"
MMDET3_TARGET = f"{MMDET3_MODULE}:PseudoSampler.sample"
NOTE = "no unique(): nonzero's indices are already distinct and sorted"


def gt_inds_on_npu(sampler: Any, assign_result: Any, *args: Any, **kwargs: Any) -> bool:
    """``runtime_check``: 1-D ``gt_inds`` on the NPU (2-D ones: ``unique()`` flattens them)."""
    gt_inds: Any = getattr(assign_result, "gt_inds", None)
    return bool(getattr(gt_inds, "is_npu", False)) and gt_inds.dim() == 1


def sampled_indices(gt_inds: Any) -> tuple[Any, Any]:
    """``(positive, negative)`` indices: mmdet's, without the no-op ``unique()``."""
    torch = sys.modules["torch"]
    positive = torch.nonzero(gt_inds > 0, as_tuple=False).squeeze(-1)
    negative = torch.nonzero(gt_inds == 0, as_tuple=False).squeeze(-1)
    return positive, negative


def _sampling_result(module: str) -> Any:
    """The ``SamplingResult`` the sampler's own module uses."""
    return vars(sys.modules[module])["SamplingResult"]


@functools.lru_cache(maxsize=8)
def _takes_avg_factor_with_neg(sampling_result: type) -> bool:
    return "avg_factor_with_neg" in inspect.signature(sampling_result).parameters


def sample_mmdet2(
    self: Any, assign_result: Any, bboxes: Any, gt_bboxes: Any, *args: Any, **kwargs: Any
) -> Any:
    """mmdet 2.x ``PseudoSampler.sample``."""
    pos_inds, neg_inds = sampled_indices(assign_result.gt_inds)
    gt_flags = bboxes.new_zeros(bboxes.shape[0], dtype=sys.modules["torch"].uint8)
    sampling_result = _sampling_result(MMDET2_MODULE)
    return sampling_result(pos_inds, neg_inds, bboxes, gt_bboxes, assign_result, gt_flags)


def sample_mmdet3(
    self: Any, assign_result: Any, pred_instances: Any, gt_instances: Any, *args: Any, **kwargs: Any
) -> Any:
    """mmdet 3.x ``PseudoSampler.sample``."""
    priors = pred_instances.priors
    pos_inds, neg_inds = sampled_indices(assign_result.gt_inds)
    gt_flags = priors.new_zeros(priors.shape[0], dtype=sys.modules["torch"].uint8)
    sampling_result = _sampling_result(MMDET3_MODULE)
    extra = {"avg_factor_with_neg": False} if _takes_avg_factor_with_neg(sampling_result) else {}
    return sampling_result(
        pos_inds=pos_inds,
        neg_inds=neg_inds,
        priors=priors,
        gt_bboxes=gt_instances.bboxes,
        assign_result=assign_result,
        gt_flags=gt_flags,
        **extra,
    )


def pseudo_sampler_patches(options: Any = None) -> Iterator[AtomicPatch]:
    """The patches of :class:`ascend_patch_mmcv.groups.PseudoSampler`: one per mmdet line."""
    yield AtomicPatch(
        MMDET2_TARGET,
        sample_mmdet2,
        runtime_check=gt_inds_on_npu,
        requires="mmdet>=2.0,<3",
        note=NOTE,
    )
    yield AtomicPatch(
        MMDET3_TARGET,
        sample_mmdet3,
        runtime_check=gt_inds_on_npu,
        requires="mmdet>=3.0.0rc0,<4",
        note=NOTE,
    )
