"""A one-line progress display on a terminal, for long CLI work (``ascend-patch scan``).

Shown only when the stream is a TTY: in a pipe, a log file or CI output, a line
rewritten with ``\\r`` is noise, and ``--json`` output must stay machine-readable.
The line is rewritten at most ten times a second (a terminal write per file would
slow a scan of 5 000 files down) and wiped when the work ends, so the report that
follows starts on a clean line. Only ``\\r`` and spaces are used, no ANSI codes:
it works on ``TERM=dumb`` too.
"""

from __future__ import annotations

import shutil
import time
from typing import TextIO


__all__ = ["Progress"]

_INTERVAL_S = 0.1


class Progress:
    """``update(done, total, where)``; ``close()`` wipes the line. A no-op off a TTY."""

    def __init__(self, stream: TextIO | None, label: str) -> None:
        isatty = getattr(stream, "isatty", None)
        try:
            self.enabled = bool(stream is not None and isatty and isatty())
        except (OSError, ValueError):  # a closed stream
            self.enabled = False
        self._stream = stream
        self._label = label
        self._last = 0.0
        self._shown = 0  # length of the line on screen, to wipe it

    def update(self, done: int, total: int, where: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < _INTERVAL_S and done != total:
            return
        self._last = now
        text = f"{self._label} {done}/{total} files"
        if where:
            text += f"  {where}"
        # One column short of the width: a line that fills it wraps on some terminals.
        width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
        if len(text) > width:
            text = text[: width - 3] + "..."
        self._write("\r" + text.ljust(self._shown))
        self._shown = len(text)

    def close(self) -> None:
        if self.enabled and self._shown:
            self._write("\r" + " " * self._shown + "\r")
            self._shown = 0

    def _write(self, text: str) -> None:
        assert self._stream is not None
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # the terminal went away: the work goes on
            self.enabled = False
