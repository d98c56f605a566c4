"""What ``ascend-patch scan`` looks for: its rule ids and the CUDA-only packages.

Shared by the finder (:mod:`.visitor`), the coverage index and the text
report, so each of them names rules and modules the same way.
"""

from __future__ import annotations

import re


__all__ = [
    "CUDA_ONLY_MODULES",
    "DEVICE_FIRST_ARGUMENT",
    "DEVICE_KEYWORDS",
    "RULES",
    "cuda_only",
    "is_cuda_string",
    "matches_module",
]

#: Rule id -> what it finds.
RULES: dict[str, str] = {
    "cuda-call": "a .cuda() call",
    "torch-cuda": "the torch.cuda API (use or import)",
    "cuda-device": 'a CUDA device ("cuda", "cuda:N", an index) given to a call or as a default',
    "nccl": "the NCCL backend",
    "cuda-import": "an import of a CUDA-only package",
    "cuda-extension": "a CUDA extension built or loaded with torch.utils.cpp_extension",
}

#: Packages that need CUDA to import or to work, with what they are.
CUDA_ONLY_MODULES: dict[str, str] = {
    "flash_attn": "FlashAttention CUDA kernels",
    "flash_attn_2_cuda": "FlashAttention CUDA extension",
    "xformers": "xFormers CUDA kernels",
    "apex": "NVIDIA Apex (fused optimizers, amp)",
    "torch_scatter": "PyG scatter CUDA extension",
    "torch_sparse": "PyG sparse CUDA extension",
    "torch_cluster": "PyG cluster CUDA extension",
    "spconv": "sparse convolution CUDA library",
    "mmcv.ops": "mmcv's compiled CUDA ops",
    "mmcv._ext": "mmcv's compiled extension",
    "cupy": "CuPy (CUDA arrays)",
    "pycuda": "PyCUDA",
    "bitsandbytes": "bitsandbytes CUDA kernels",
}


#: Keyword arguments that name a device.
DEVICE_KEYWORDS = ("device", "device_type", "map_location", "device_id")

#: torch's functions that take a device as their first argument.
DEVICE_FIRST_ARGUMENT = (
    "torch.device",
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.GradScaler",
    "torch.set_default_device",
)


def is_cuda_string(value: object) -> bool:
    """``"cuda"`` or ``"cuda:N"``."""
    return isinstance(value, str) and re.fullmatch(r"cuda(:\d+)?", value) is not None


def matches_module(name: str, module: str) -> bool:
    """Whether the dotted ``name`` is ``module`` or something inside it."""
    return name == module or name.startswith(module + ".")


def cuda_only(name: str) -> str | None:
    """The CUDA-only package that ``name`` belongs to, if any."""
    return next((m for m in CUDA_ONLY_MODULES if matches_module(name, m)), None)
