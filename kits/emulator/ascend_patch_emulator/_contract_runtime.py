"""The run-time half of the contract check: the op calls the emulator dispatched.

The emulator reports every torch_npu op call it dispatches, and every call of a
public name of the emulated mx_driving, to :func:`record_call`; the active
:class:`CallRecorder` objects keep them with the caller's file and line (the first
frame outside the emulator and torch), so that :func:`recorded_in` can say which
plugin made each call.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from ._scan import OpCall
from ._scan import contract_markers
from ._scan import overload_name
from ._scan import versions_for


__all__ = ["CallRecorder", "RecordedCall", "record_call", "recorded_in"]

_EMULATOR_DIR = os.path.dirname(os.path.abspath(__file__))


class RecordedCall(NamedTuple):
    """An op call the emulator dispatched, with the file and line that made it."""

    op: str
    overload: str | None
    positional: int
    keywords: tuple[str, ...]
    file: str
    line: int
    #: ``"torch_npu"`` or ``"mx_driving"``.
    library: str = "torch_npu"


_active: list[CallRecorder] = []
_active_lock = threading.Lock()


class CallRecorder:
    """Collects the op calls reported to :func:`record_call` while it is entered.

    ::

        with CallRecorder() as recorder:
            run_the_plugin_under_the_emulator()
        mismatches = check_plugin(path, recorded=recorder.calls).mismatches

    Recorders nest and may be used from several threads; each distinct call
    (op, arguments shape, site) is kept once.
    """

    def __init__(self) -> None:
        self._calls: dict[RecordedCall, None] = {}
        self._lock = threading.Lock()

    @property
    def calls(self) -> list[RecordedCall]:
        with self._lock:
            return list(self._calls)

    def record(self, call: RecordedCall) -> None:
        with self._lock:
            self._calls.setdefault(call, None)

    def __enter__(self) -> CallRecorder:
        with _active_lock:
            _active.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with _active_lock:
            _active.remove(self)


def record_call(
    op: str,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    site: tuple[str, int] | None = None,
    *,
    library: str = "torch_npu",
) -> None:
    """Report one op call to the active recorders (a no-op when none is active).

    ``op`` is the name the caller used: ``"npu_rms_norm"`` for the packet, or
    ``"npu_rms_norm.default"`` / ``"npu_max.dim"`` for an overload (an ``npu::``
    prefix is dropped). ``site`` is ``(file, line)``; by default it is the first
    frame outside the emulator and torch, i.e. the code that called the op.
    ``library="mx_driving"``: ``op`` is a public name of mx_driving as called
    (``"scatter_add"``, ``"DeformConv2dFunction.apply"``).
    """
    if not _active:
        return
    if site is None:
        site = _caller_site()
    if library == "torch_npu":
        base, dot, overload = op.removeprefix("npu::").partition(".")
        name, variant = base, (overload_name(overload) if dot else None)
    else:
        name, variant = op, None
    call = RecordedCall(
        name,
        variant,
        len(args),
        tuple(kwargs),
        os.path.abspath(site[0]),
        site[1],
        library,
    )
    with _active_lock:
        recorders = list(_active)
    for recorder in recorders:
        recorder.record(call)


def _caller_site() -> tuple[str, int]:
    skip = [_EMULATOR_DIR + os.sep]
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file:
        skip.append(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(tuple(skip)):
            return filename, frame.f_lineno
        if frame.f_back is None:
            break
        frame = frame.f_back
    return os.path.abspath(frame.f_code.co_filename), frame.f_lineno


def recorded_in(root: Path, recorded: Iterable[RecordedCall]) -> list[OpCall]:
    """The recorded calls made from files under ``root``, as :class:`OpCall` rows."""
    root = root.resolve()
    calls: list[OpCall] = []
    markers: dict[str, list[tuple[int, int, str]]] = {}
    for call in recorded:
        path = Path(call.file).resolve()
        inside = path.is_relative_to(root) if root.is_dir() else path == root
        if not inside:
            continue
        relative = path.relative_to(root.parent)
        if call.file not in markers:
            try:
                source = path.read_text(encoding="utf-8")
                markers[call.file] = contract_markers(source, ast.parse(source))
            except (OSError, SyntaxError, ValueError):
                markers[call.file] = []
        calls.append(
            OpCall(
                call.op,
                call.overload,
                f"{relative.as_posix()}:{call.line}",
                call.positional,
                call.keywords,
                False,
                True,
                # The torch-npu markers limit torch_npu calls only.
                versions_for(call.line, call.line, markers[call.file])
                if call.library == "torch_npu"
                else "",
                call.library,
            )
        )
    return calls
