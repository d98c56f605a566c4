"""mindstudio-probe's PrecisionDebugger around every training step (``with_precision_check(msprobe=...)``).

The debugger starts when training starts (the loop's start, or the first forward of a
plain loop), and at the end of every training step it is stopped, stepped and
started again, as msprobe's documentation asks of a training loop. It is the
distribution ``mindstudio-probe`` (import name ``msprobe``); the unrelated PyPI
package called ``msprobe`` is recognised and refused with a clear message.
"""

from __future__ import annotations

import threading
from typing import Any

from ascend_patch_core import Record
from ascend_patch_core import Status


__all__ = ["MsprobeControl", "msprobe_missing"]

_INSTALL = "pip install mindstudio-probe (the PyPI package named 'msprobe' is a different project)"


def msprobe_missing() -> str | None:
    """Why msprobe's PrecisionDebugger cannot be used here, or None. Imports nothing."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version

    try:
        version("mindstudio-probe")
    except PackageNotFoundError:
        return f"mindstudio-probe is not installed; {_INSTALL}"
    return None


class MsprobeControl:
    """Owns the PrecisionDebugger of a training session."""

    def __init__(self, options: dict[str, Any], record: Record) -> None:
        self.options = options
        self.record = record
        self._debugger: Any = None
        self._model: Any = None
        self._lock = threading.Lock()
        self._broken = False

    def begin(self, model: Any = None) -> None:
        """Training starts: create the debugger (once) and start it."""
        with self._lock:
            if self._broken:
                return
            if model is not None:
                self._model = model
            try:
                if self._debugger is None:
                    import importlib

                    debugger_class = importlib.import_module("msprobe.pytorch").PrecisionDebugger
                    self._debugger = debugger_class(**self.options)
                    self.record.set(
                        Status.APPLIED,
                        "msprobe PrecisionDebugger started around each training step",
                    )
                self._debugger.start(model=self._model)
            except Exception as exc:
                self._fail(f"msprobe PrecisionDebugger failed to start: {exc!r}")

    def step_ended(self, step: int, *, last: bool = False) -> None:
        """Close this step's dump and, unless it was the ``last``, open the next one."""
        with self._lock:
            if self._debugger is None or self._broken:
                return
            try:
                self._debugger.stop()
                self._debugger.step()
                if last:
                    self._debugger = None
                else:
                    self._debugger.start(model=self._model)
            except Exception as exc:
                self._fail(f"msprobe PrecisionDebugger failed at training step {step}: {exc!r}")

    def close(self) -> None:
        with self._lock:
            debugger, self._debugger = self._debugger, None
            if debugger is None:
                return
            try:
                debugger.stop()
            except Exception as exc:
                self._fail(f"msprobe PrecisionDebugger failed to stop: {exc!r}")

    def _fail(self, why: str) -> None:
        self._broken = True
        self._debugger = None
        self.record.set(Status.FAILED, why)
