"""ascend_patch_mmcv: the ascend-patch plugin for OpenMMLab (mmcv, mmengine, mmdet and friends)."""

from __future__ import annotations


__all__: list[str] = []
