"""ascend_patch_template: a copyable ascend-patch plugin (torch.nn.functional.rms_norm -> npu_rms_norm)."""

from __future__ import annotations


__all__: list[str] = []
