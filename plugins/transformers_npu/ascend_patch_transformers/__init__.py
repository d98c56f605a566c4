"""ascend_patch_transformers: the ascend-patch plugin for Hugging Face transformers, accelerate."""

from __future__ import annotations


__all__: list[str] = []
