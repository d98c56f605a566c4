"""The emulator's exceptions (no torch import, so they can be caught without it)."""

from __future__ import annotations


__all__ = ["EmulatorInactiveError", "EmulatorVersionError", "KernelNotImplementedError"]


class KernelNotImplementedError(NotImplementedError):
    """The op exists in the emulated torch_npu version, but the emulator has no kernel for it."""


class EmulatorInactiveError(RuntimeError):
    """An emulated op or device was used after the emulator was deactivated."""


class EmulatorVersionError(RuntimeError):
    """Another torch_npu version's schemas are already registered in this process."""
