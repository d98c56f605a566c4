"""NPU runtime settings a patcher can ask for: ``Patcher.allow_internal_format()``.

The engine only records the request; this module, published in the entry-point
group ``ascend_patch.settings``, carries it out: once torch_npu is imported it sets
``torch.npu.config.allow_internal_format``, and ``revert()`` puts the previous value
back. Unlike the DrivingSDK patcher, nothing is forced when the user did not ask.
"""

from __future__ import annotations

import types
from typing import Any

from ascend_patch_core import PatchDefinitionError
from ascend_patch_core import Record
from ascend_patch_core import Status
from ascend_patch_core import imports


__all__ = ["InternalFormat", "NpuSettings", "npu_settings"]


class InternalFormat:
    """The session of one ``allow_internal_format`` request."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.record = Record(
            "setting",
            "allow_internal_format",
            f"torch.npu.config.allow_internal_format={allow}",
            Status.PENDING,
            "waiting for import of torch_npu",
        )
        self._restore: list[Any] = []
        self._handle = imports.when_imported("torch_npu", self._imported)

    @property
    def records(self) -> list[Record]:
        return [self.record]

    def _imported(self, _module: types.ModuleType) -> None:
        try:
            import torch

            config = torch.npu.config
            previous = config.allow_internal_format
            config.allow_internal_format = self.allow
        except Exception as exc:
            self.record.set(Status.FAILED, f"cannot set it: {exc!r}")
            return
        self._restore.append((config, previous))
        self.record.set(Status.APPLIED, None)

    def undo(self) -> None:
        imports.cancel(self._handle)
        for config, previous in reversed(self._restore):
            config.allow_internal_format = previous
        self._restore.clear()
        if self.record.status is Status.APPLIED:
            self.record.set(Status.REVERTED, None)


class NpuSettings:
    """The provider of the setting ``allow_internal_format``."""

    def check(self, name: str, value: Any) -> None:
        if name != "allow_internal_format" or not isinstance(value, bool):
            raise PatchDefinitionError(f"ascend-patch-torch: invalid setting {name}={value!r}")

    def start(self, patcher: Any, settings: dict[str, Any]) -> InternalFormat:
        return InternalFormat(settings["allow_internal_format"])


#: What the entry point ``allow_internal_format`` names.
npu_settings = NpuSettings()
