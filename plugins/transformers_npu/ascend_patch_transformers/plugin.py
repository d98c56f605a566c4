"""Will patch Hugging Face transformers and accelerate CUDA paths. Hook implementations only."""

from __future__ import annotations

from ascend_patch_core import hookimpl


@hookimpl
def register_patches() -> list[object]:
    # Patches arrive with the plugin's own issue; an empty list keeps the plugin discoverable.
    return []
