"""Turning the NPU emulator on and off.

:func:`activate` makes a CPU-only process look like one with torch_npu installed
on an NPU machine: ``import torch_npu`` works (through the import system, so the
core's import hub sees it), ``torch.npu`` is the emulated runtime, ``"npu"`` device
strings give CPU tensors, and ``torch.ops.npu`` / ``torch_npu.<op>`` carry the exact
schemas of the chosen torch_npu version with CPU reference kernels.

:func:`deactivate` undoes all of it that torch allows to be undone; what stays in
the process is listed in ``_device`` and ``_library`` (and in docs/emulator.md).
This module imports torch only inside :func:`activate`.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from types import TracebackType

from ._errors import EmulatorVersionError
from ._schemas import DEFAULT_VERSION
from ._schemas import available_versions


__all__ = [
    "DEVICES_VARIABLE",
    "MAX_DEVICES",
    "EmulatorHandle",
    "EmulatorWarning",
    "activate",
    "active_version",
    "deactivate",
    "is_active",
    "resolve_device_count",
    "resolve_version",
]

_log = logging.getLogger("ascend_patch.emulator")
#: How many NPUs to emulate, for processes that do not call :func:`activate` themselves
#: (``ascend-patch run --emulated-devices N`` sets it for the program and its children).
DEVICES_VARIABLE = "ASCEND_PATCH_EMULATED_DEVICES"
#: The most NPUs one process can emulate: torch keeps a device index in 8 bits, so
#: ``torch.device("npu", 128)`` is already ``npu:-128`` (and a huge count would only
#: exhaust memory building per-device state).
MAX_DEVICES = 128
_lock = threading.RLock()


class EmulatorWarning(UserWarning):
    """Something about the emulation the user should know (e.g. a version fallback)."""


class EmulatorHandle:
    """The active emulation. ``with activate(): ...`` deactivates on exit."""

    def __init__(
        self,
        version: str,
        device_count: int,
        implemented: tuple[str, ...],
        undo: Callable[[], None],
    ) -> None:
        self.version = version
        self.device_count = device_count
        #: Op overloads with a CPU reference kernel; every other op raises when called.
        self.implemented = implemented
        self._undo: Callable[[], None] | None = undo

    @property
    def label(self) -> str:
        """How results produced under the emulator are to be described."""
        return (
            f"torch_npu {self.version}, emulated on CPU by ascend-patch "
            f"(reference kernels; not a performance model)"
        )

    @property
    def active(self) -> bool:
        return self._undo is not None

    def deactivate(self) -> None:
        """Undo the activation (a no-op when already undone)."""
        with _lock:
            undo, self._undo = self._undo, None
            if undo is None:
                return
            global _handle
            if _handle is self:
                _handle = None
            undo()

    def __enter__(self) -> EmulatorHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.deactivate()

    def __repr__(self) -> str:
        state = "active" if self.active else "deactivated"
        return f"<EmulatorHandle torch_npu {self.version} ({state}, emulated on CPU)>"


_handle: EmulatorHandle | None = None


def resolve_version(version: str | None = None) -> str:
    """The torch_npu version :func:`activate` would emulate for ``version``.

    ``None`` means :data:`DEFAULT_VERSION`; while its schema data is missing, the
    newest version with data is used instead, with an :class:`EmulatorWarning`.
    """
    available = available_versions()
    if version is None:
        if DEFAULT_VERSION in available:
            return DEFAULT_VERSION
        if not available:
            raise LookupError("no torch_npu schema data is installed with ascend-patch-emulator")
        newest = available[-1]
        warnings.warn(
            f"ascend-patch emulator: no schema data for the default torch_npu "
            f"{DEFAULT_VERSION}; emulating torch_npu {newest} instead",
            EmulatorWarning,
            stacklevel=3,
        )
        return newest
    if not isinstance(version, str):
        raise TypeError(f"version must be a string like '2.14.0', got {version!r}")
    if version not in available:
        raise LookupError(
            f"no torch_npu schema data for version {version!r}; available: "
            f"{', '.join(available) or 'none'}"
        )
    return version


def resolve_device_count(device_count: int | None = None) -> int:
    """How many NPUs :func:`activate` emulates for ``device_count``.

    None means: ``ASCEND_PATCH_EMULATED_DEVICES`` when set (``ascend-patch run
    --emulated-devices N`` sets it), else the local world size torchrun gives each
    rank (``LOCAL_WORLD_SIZE``), so that ``torch.npu.set_device(LOCAL_RANK)`` works on
    every rank as on a machine with one NPU per rank, else 1.
    """
    if device_count is None:
        text = os.environ.get(DEVICES_VARIABLE, "").strip()
        if text:
            if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_DEVICES:
                raise ValueError(
                    f"{DEVICES_VARIABLE} must be a positive number of NPUs to emulate, at most "
                    f"{MAX_DEVICES} (torch's device index is 8-bit), got {text!r}"
                )
            return int(text)
        local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        if local.isascii() and local.isdigit() and 1 <= int(local) <= MAX_DEVICES:
            return int(local)
        return 1
    if (
        not isinstance(device_count, int)
        or isinstance(device_count, bool)
        or not 1 <= device_count <= MAX_DEVICES
    ):
        raise ValueError(
            f"device_count must be a positive int, at most {MAX_DEVICES}, got {device_count!r}"
        )
    return device_count


def activate(version: str | None = None, *, device_count: int | None = None) -> EmulatorHandle:
    """Emulate torch_npu ``version`` (default :data:`DEFAULT_VERSION`) on the CPU.

    Idempotent: while active, returns the active handle (a different ``version``
    raises). ``device_count`` is how many NPUs ``torch.npu.device_count()``
    reports, all of them the CPU; None (the default) reads it from the environment
    (:func:`resolve_device_count`). One torch_npu version can be emulated per
    process (torch cannot safely drop op definitions); another raises
    :class:`EmulatorVersionError`.
    """
    global _handle
    device_count = resolve_device_count(device_count)
    with _lock:
        if _handle is not None:
            if version is not None and version != _handle.version:
                raise EmulatorVersionError(
                    f"the emulator is active with torch_npu {_handle.version}; "
                    f"deactivate() it before activating {version}"
                )
            return _handle
        resolved = resolve_version(version)
        present = sys.modules.get("torch_npu")
        if present is not None:
            raise RuntimeError(
                f"torch_npu is already imported ({present!r}); activate the NPU emulator "
                f"before anything imports torch_npu (and do not skip or replace its import)"
            )
        undos = _start(resolved, device_count)

        def undo() -> None:
            for step in reversed(undos):
                step()
            _log.info("NPU emulator deactivated (torch_npu %s)", resolved)

        from . import _library

        registration = _library.registration()
        implemented = tuple(registration.implemented) if registration is not None else ()
        _handle = EmulatorHandle(resolved, device_count, implemented, undo)
        _log.info("NPU emulator active: %s", _handle.label)
        return _handle


def _start(version: str, device_count: int) -> list[Callable[[], None]]:
    """Do the activation; on failure undo what was done and re-raise."""
    from . import _device
    from . import _library
    from . import _modules
    from . import _runtime
    from . import _runtime_graphs
    from . import _runtime_memory
    from . import _runtime_streams
    from . import _tracing

    undos: list[Callable[[], None]] = []
    try:
        registration = _library.register(version)
        _tracing.install(registration)
        package = _modules.build(
            version,
            registration.namespace,
            registration.op_names,
            registration.exposed,
            _device.npu_module(),
        )
        _runtime.state.reset(version=version, device_count=device_count)
        _runtime_streams.reset()
        _runtime_graphs.reset()
        _runtime_memory.reset_state()
        undos.append(_device.install(package.modules["torch_npu.npu"]))

        def off() -> None:
            _runtime.state.active = False
            _library.hide()

        _runtime.state.active = True
        _library.show()
        undos.append(off)
        # Patch requirements such as ``requires = "torch-npu>=2.1"`` now hold, with
        # this version, through the engine's public override (nothing is sniffed).
        from ascend_patch_core import override_version

        undos.append(override_version("torch-npu", version, "emulated"))
        _modules.install_finder(package)

        def forget() -> None:
            _modules.remove_finder(package)
            package.forget()

        undos.append(forget)
        imported = importlib.import_module("torch_npu")
        if imported is not package.modules["torch_npu"]:
            raise RuntimeError(
                f"import torch_npu gave {imported!r}, not the emulated package: an import "
                f"rule (skip_import/replace_import) or another finder serves torch_npu"
            )
        # DrivingSDK's mx_driving, with its real signatures, unless a real one is importable.
        from . import _mx_driving

        served = _mx_driving.serve()
        if served is not None:
            undos.append(served)
    except BaseException:
        for step in reversed(undos):
            step()
        raise
    return undos


def deactivate() -> None:
    """Undo :func:`activate` (a no-op when the emulator is not active)."""
    with _lock:
        handle = _handle
    if handle is not None:
        handle.deactivate()


def is_active() -> bool:
    return _handle is not None


def active_version() -> str | None:
    """The emulated torch_npu version, or None when the emulator is not active."""
    handle = _handle
    return handle.version if handle is not None else None
