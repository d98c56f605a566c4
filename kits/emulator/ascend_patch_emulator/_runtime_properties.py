"""``torch.npu.get_device_properties()``: the object torch_npu returns, with the emulated values.

torch_npu binds ``NPUDeviceProp`` as ``torch_npu._C._NPUDeviceProperties``
(``torch_npu/csrc/npu/Module.cpp``, the same from 2.1 to 2.14; the 2.13.0 wheel's
``libtorch_npu.so`` carries these names): ``name`` (the SoC name), ``total_memory``,
``cube_core_num``, ``vector_core_num``, ``L2_cache_size``, ``uuid`` (a ``_CUuuid``
with ``bytes``), and the CUDA/ROCm names ``major``, ``minor``, ``is_multi_gpu_board``,
``is_integrated``, ``multi_processor_count``, ``max_threads_per_multi_processor``,
``warp_size``, ``regs_per_multiprocessor``, ``gcnArchName`` -- ``std::optional``
fields that torch_npu leaves empty (``None``; newer releases fill
``multi_processor_count`` with the vector core count).

Code written for CUDA reads those through ``torch.cuda.get_device_properties()``
once the torch plugin redirects it: inductor's cache key
(``torch._inductor.codecache.CacheBase.get_system``) sees ``torch.cuda.is_available()``
and, with ``torch.version.cuda`` unset, reads ``gcnArchName``. An emulated object
without those names raised where torch_npu's answers None, so it has them all, with
torch_npu's values; ``emulated`` (True) is the one addition.
"""

from __future__ import annotations

import dataclasses


__all__ = ["NPUDeviceProperties", "NPUUuid", "device_properties"]

_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class NPUUuid:
    """torch_npu's ``_CUuuid``: 16 ``bytes``; ``str()`` is the 8-4-4-4-12 hex form."""

    bytes: tuple[int, ...]

    def __str__(self) -> str:
        text = "".join(f"{b:02x}" for b in self.bytes)
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@dataclasses.dataclass(frozen=True, repr=False)
class NPUDeviceProperties:
    """torch_npu's ``_NPUDeviceProperties``, field for field (read-only, like its binding)."""

    name: str
    total_memory: int
    cube_core_num: int
    vector_core_num: int
    L2_cache_size: int
    uuid: NPUUuid
    # The CUDA / ROCm names torch_npu binds and leaves empty.
    major: int | None = None
    minor: int | None = None
    is_multi_gpu_board: int | None = None
    is_integrated: int | None = None
    multi_processor_count: int | None = None
    max_threads_per_multi_processor: int | None = None
    warp_size: int | None = None
    regs_per_multiprocessor: int | None = None
    gcnArchName: str | None = None
    #: Not torch_npu's: says that no NPU answered.
    emulated: bool = True

    def __repr__(self) -> str:
        # torch_npu's own __repr__ (Module.cpp), so logs look alike.
        return (
            f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // _MB}MB, "
            f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num}, "
            f"uuid={self.uuid}, L2_cache_size={self.L2_cache_size // _MB}MB)"
        )


# The emulated NPU is the host: one core of each kind, no L2 of its own.
_CORES = 1


def device_properties(index: int, name: str, total_memory: int) -> NPUDeviceProperties:
    """The properties of emulated device ``index``."""
    # A fixed, recognisable uuid per device: "emulated" is not hex, the index is.
    raw = (0,) * 12 + tuple(index.to_bytes(4, "big"))
    return NPUDeviceProperties(
        name=name,
        total_memory=total_memory,
        cube_core_num=_CORES,
        vector_core_num=_CORES,
        L2_cache_size=0,
        uuid=NPUUuid(raw),
        multi_processor_count=_CORES,
    )
