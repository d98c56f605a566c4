"""Plain-text tables for the CLI, coloured only on a terminal.

Colour follows the common conventions: only when the stream is a TTY, never with
``NO_COLOR`` set or ``TERM=dumb``; ``FORCE_COLOR`` forces it (for pagers like ``less -R``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO


__all__ = ["Style", "table"]

_CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2"}


class Style:
    def __init__(self, stream: TextIO) -> None:
        if os.environ.get("NO_COLOR"):
            self.enabled = False
        elif os.environ.get("FORCE_COLOR"):
            self.enabled = True
        else:
            isatty = getattr(stream, "isatty", None)
            self.enabled = bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"

    def paint(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles or not text:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\033[{codes}m{text}\033[0m"

    def level(self, level: str, text: str | None = None) -> str:
        """Colour a level word: error red, warning yellow, ok green."""
        colour = {
            "error": ("red", "bold"),
            "broken": ("red", "bold"),
            "warning": ("yellow",),
            "note": ("blue",),
            "ok": ("green",),
            "loaded": ("green",),
            "active": ("green",),
            "covered": ("green",),
        }.get(level, ())
        return self.paint(level if text is None else text, *colour)


Cell = str | tuple[str, Sequence[str]]


def table(
    rows: Sequence[Sequence[Cell]], style: Style, *, indent: int = 2, max_width: int = 48
) -> list[str]:
    """Align columns; a cell is text or (text, styles). The last column is never padded."""
    plain = [[c if isinstance(c, str) else c[0] for c in row] for row in rows]
    if not plain:
        return []
    columns = max(len(r) for r in plain)
    widths = [
        min(max((len(r[i]) for r in plain if i < len(r)), default=0), max_width)
        for i in range(columns)
    ]
    lines = []
    for row, texts in zip(rows, plain, strict=True):
        parts = []
        for i, (cell, text) in enumerate(zip(row, texts, strict=True)):
            last = i == len(row) - 1
            padded = text if last else text.ljust(widths[i])
            if isinstance(cell, tuple):
                padded = style.paint(text, *cell[1]) + (
                    "" if last else " " * (len(padded) - len(text))
                )
            parts.append(padded)
        lines.append((" " * indent + "  ".join(parts)).rstrip())
    return lines
