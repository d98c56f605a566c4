"""ascend_patch_torch: the ascend-patch plugin for plain PyTorch (torch.cuda, torch.distributed)."""

from __future__ import annotations


__all__: list[str] = []
