"""A time bound on loading one plugin: its import and its hooks (docs/plugin-authors.md, "Hangs").

Loaded only when a bound is set -- always by ``ascend-patch doctor`` and ``scan``,
by ``apply()`` and ``run`` only with ``ASCEND_PATCH_PLUGIN_TIMEOUT`` -- so the usual
``apply()`` neither imports this module nor starts a thread or a timer.

Two ways to stop waiting, the first where it can be used:

* **An alarm** (POSIX, the main thread, a SIGALRM handler Python can put back):
  ``setitimer`` raises :class:`PluginTimeout` in the hook itself, wherever it waits
  (``time.sleep``, a lock, a socket, a Python loop), so it fails like a raising hook:
  nothing of it keeps running. The alarm fires again every second until the hook gives
  up, since a plugin may catch the first one; the caller's own alarm and handler are
  put back afterwards.
* **A thread**: elsewhere the plugin loads in a daemon thread that is left behind
  when the bound passes (no thread can be stopped from outside). What it returns
  after that is ignored; what it does on its own (an import, a variable) is not undone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any
from typing import TypeVar


__all__ = ["PluginTimeout", "call_bounded"]

_T = TypeVar("_T")
#: After the bound has passed, the alarm repeats this often until the hook gives up.
_REPEAT_S = 1.0


class PluginTimeout(BaseException):
    """The plugin did not finish in time. A BaseException, so ``except Exception`` in a hook cannot keep it.

    ``where`` is the plugin's own line it was stopped (or left running) at, or None;
    ``left_running``: the thread way, where the plugin goes on in the background.
    """

    def __init__(self, seconds: float, where: str | None, left_running: bool) -> None:
        super().__init__(f"did not finish within {seconds:g} s")
        self.seconds = seconds
        self.where = where
        self.left_running = left_running


def call_bounded(fn: Callable[[], _T], seconds: float, roots: Callable[[], list[str]]) -> _T:
    """``fn()``, or :class:`PluginTimeout` once ``seconds`` have passed.

    ``roots()`` gives the directories of the plugin's own files, to say which of its
    lines it was stuck at.
    """
    if _alarm_usable():
        return _by_alarm(fn, seconds, roots)
    return _by_thread(fn, seconds, roots)


def _alarm_usable() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        # None: a handler installed outside Python, which could not be put back.
        and signal.getsignal(signal.SIGALRM) is not None
    )


def _by_alarm(fn: Callable[[], _T], seconds: float, roots: Callable[[], list[str]]) -> _T:
    fired = False

    def on_alarm(signum: int, frame: types.FrameType | None) -> None:
        nonlocal fired
        fired = True
        raise PluginTimeout(seconds, None, left_running=False)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds, _REPEAT_S)
    try:
        try:
            result = fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if old_delay:  # the caller's alarm, less the time spent here
                left = max(old_delay - (time.monotonic() - started), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, old_interval)
    except PluginTimeout as timeout:
        timeout.where = _plugin_line(_frames_of(timeout.__traceback__), roots())
        raise
    except BaseException as exc:
        if not fired or isinstance(exc, KeyboardInterrupt):
            raise
        # The hook caught the alarm and raised something else: the bound is the cause.
        late = PluginTimeout(seconds, _plugin_line(_frames_of(exc.__traceback__), roots()), False)
        raise late from exc
    if fired:  # the hook caught the alarm and returned anyway: still too late
        raise PluginTimeout(seconds, None, left_running=False)
    return result


def _by_thread(fn: Callable[[], _T], seconds: float, roots: Callable[[], list[str]]) -> _T:
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller, who decides
            outcome.append((False, exc))

    worker = threading.Thread(target=work, name="ascend-patch plugin loader", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() or not outcome:
        frame = sys._current_frames().get(worker.ident or -1)
        raise PluginTimeout(seconds, _plugin_line(_stack(frame), roots()), left_running=True)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _frames_of(tb: types.TracebackType | None) -> list[tuple[str, int, str]]:
    """(file, line, function) of a traceback, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    return frames


def _stack(frame: types.FrameType | None) -> list[tuple[str, int, str]]:
    """(file, line, function) of a thread's stack, outermost first."""
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames[::-1]


def _plugin_line(frames: list[tuple[str, int, str]], roots: list[str]) -> str | None:
    """The innermost frame in the plugin's own files (else the innermost outside the core)."""

    def inside(path: str) -> bool:
        path = os.path.normpath(os.path.abspath(path))
        return any(path == root or path.startswith(root + os.sep) for root in roots)

    core = os.path.dirname(os.path.abspath(__file__)) + os.sep
    candidates = [f for f in frames if inside(f[0])] or [
        f for f in frames if not os.path.abspath(f[0]).startswith(core) and "<frozen" not in f[0]
    ]
    if not candidates:
        return None
    file, line, function = candidates[-1]
    return f"{file}:{line} in {function}"
