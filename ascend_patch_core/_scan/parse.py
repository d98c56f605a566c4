"""Parsing for ``ascend-patch scan``: a deeply nested file is parsed, not a crash.

``ast.parse`` builds the tree recursively and gives up with ``RecursionError`` at a
depth tied to the interpreter's recursion limit: about 3,000 terms of ``a + a + ...``
on CPython 3.11, which is also where CPython itself stops compiling the file. A
scanner must not die there (nor on a file that ``python`` would still run), so a
file that fails that way is parsed again in a helper thread with a large stack and a
high recursion limit. What still fails is reported by the caller as a file not
scanned, with the reason.
"""

from __future__ import annotations

import ast
import sys
import threading
from typing import Any

from .._model.work_locks import work_lock


__all__ = ["DEEP_RECURSION_LIMIT", "parse"]

#: The recursion limit of the second attempt (the C parser scales its own limits from it).
DEEP_RECURSION_LIMIT = 200_000
# Enough C stack for that depth: a thread's stack is reserved, not committed, memory.
_DEEP_STACK_BYTES = 512 * 1024 * 1024
_lock = work_lock(reentrant=False)


def parse(source: str | bytes, path: str = "<string>") -> ast.Module:
    """``ast.parse``, retried with room to recurse when the tree is too deep for the default.

    Raises what ``ast.parse`` raises (SyntaxError, ValueError, RecursionError, MemoryError).
    """
    try:
        return ast.parse(source, filename=path)
    except RecursionError:
        pass
    return _parse_deep(source, path)


def _parse_deep(source: str | bytes, path: str) -> ast.Module:
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["tree"] = ast.parse(source, filename=path)
        except BaseException as exc:  # handed to the calling thread
            outcome["error"] = exc

    # The recursion limit is interpreter-wide: one deep parse at a time, limit restored after.
    with _lock:
        limit = sys.getrecursionlimit()
        try:
            stack = threading.stack_size(_DEEP_STACK_BYTES)
        except (ValueError, RuntimeError):  # a platform that cannot size thread stacks
            raise RecursionError(f"{path}: too deeply nested to parse") from None
        try:
            sys.setrecursionlimit(max(limit, DEEP_RECURSION_LIMIT))
            worker = threading.Thread(target=work, name="ascend-patch-deep-parse")
            try:
                worker.start()
            except RuntimeError:  # no room for such a stack (ulimit -v): give up on this file
                outcome["error"] = RecursionError(f"{path}: too deeply nested to parse")
            else:
                worker.join()
        finally:
            threading.stack_size(stack)
            sys.setrecursionlimit(limit)
    if "error" in outcome:
        raise outcome["error"]
    tree: ast.Module = outcome["tree"]
    return tree
