"""The emulated runtime's state: active or not, how many devices, the current one.

Also the flags that :meth:`_State.reset` restores (``torch.npu.config``,
``matmul``, ``conv``). Shared by every part of the emulated ``torch.npu``:
:func:`device_index` is the one rule for reading what a caller passes as a device,
so every function rejects a bad device with the same message.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch


__all__ = ["config", "conv", "device_index", "host_memory", "invalid_ordinal", "matmul", "state"]


class _State:
    """Per-activation runtime settings, reset by :func:`reset`."""

    def __init__(self) -> None:
        self.active = False
        self.version = ""
        self.device_count = 1
        self._local = threading.local()
        self.jit_compile = True
        self.options: dict[str, Any] = {}

    @property
    def current(self) -> int:
        index: int = getattr(self._local, "device", 0)
        return index

    @current.setter
    def current(self, index: int) -> None:
        self._local.device = index

    def reset(self, *, version: str, device_count: int) -> None:
        self.version = version
        self.device_count = device_count
        self._local = threading.local()
        self.jit_compile = True
        self.options = {}
        config.allow_internal_format = False
        matmul.allow_hf32 = False
        conv.allow_hf32 = True


state = _State()


class _Config:
    """``torch.npu.config``: plain flags, read by nothing in the emulator."""

    allow_internal_format = False


class _Hf32:
    allow_hf32 = False


config = _Config()
matmul = _Hf32()
conv = _Hf32()


def device_index(device: Any, *, optional: bool = True) -> int:
    """The device index named by an int, ``"npu:1"``, ``torch.device`` or None (current)."""
    if device is None:
        if optional:
            return state.current
        raise ValueError("expected an NPU device, got None")
    if isinstance(device, bool):
        raise TypeError(f"expected an NPU device (int, 'npu:N' or torch.device), got {device!r}")
    if isinstance(device, int):
        index = device
    else:
        parsed = torch.device(device) if isinstance(device, str) else device
        if not isinstance(parsed, torch.device) or parsed.type != "npu":
            raise ValueError(f"expected an NPU device ('npu', 'npu:N'), got {device!r}")
        index = state.current if parsed.index is None else parsed.index
    if not 0 <= index < state.device_count:
        raise invalid_ordinal(index)
    return index


def invalid_ordinal(index: int) -> RuntimeError:
    """The error for a device index the emulator does not have, saying how to get more."""
    return RuntimeError(
        f"invalid NPU device ordinal {index}: the NPU emulator has {state.device_count} "
        f"device(s). Emulate more with `ascend-patch run --emulate-npu --emulated-devices N` "
        f"or ASCEND_PATCH_EMULATED_DEVICES=N (under torchrun the default is the local world "
        f"size, LOCAL_WORLD_SIZE); in Python, ascend_patch_emulator.activate(device_count=N)"
    )


def host_memory() -> tuple[int, int]:
    """(available, total) host memory in bytes, or (0, 0) where sysconf cannot tell."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_AVPHYS_PAGES"), page * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0
