"""The error strict mode raises when a patch, hook or 1.0 patch fails after apply().

Strict mode stops at ``apply()`` for what can fail there (plugins, declarations,
conflicts, patches on modules already imported). A patch whose target module the
program imports later can only fail at that import: the import statement raises.
The user then sees their own import line and this message, not the core's frames:
the message alone must say which patch failed, where it comes from, on what, why,
and how to go on -- the traceback of the underlying error is summed up as the place
it was raised.
"""

from __future__ import annotations

import os
import types

from .._model.errors import PatchError
from .._model.report import Record


__all__ = ["strict_failure"]

_CORE_DIR = os.path.dirname(os.path.abspath(__file__))


def strict_failure(
    record: Record, reason: str, *, module: str | None = None, cause: BaseException | None = None
) -> PatchError:
    """A PatchError for ``record``'s failure; ``module``: the import it happened in."""
    origin = record.provenance
    about = [f"group {record.group}"] if record.group and record.group != record.name else []
    if origin.plugin:
        dist = f" from {origin.distribution} {origin.version or '?'}" if origin.distribution else ""
        about.append(f"plugin {origin.plugin!r}{dist}")
    else:
        about.append("declared by your program")
    what = f"{record.kind} {record.name!r} ({', '.join(about)})"
    where = f"on {record.target}" if record.kind == "patch" else f"for {record.target}"
    during = f" while {module} was being imported" if module else ""
    raised_at = _raised_at(cause)
    name = record.group or record.name
    lines = [
        f"ascend-patch (strict): {what} could not be applied {where}{during}: {reason}{raised_at}",
        "Strict mode stops at the first failure"
        + (f", so `import {module}` fails." if module else ".")
        + f" To run without it: `ascend-patch run --disable {name}` or "
        f"Patcher.disable({name!r})"
        + (
            f"; ASCEND_PATCH_DISABLE={origin.plugin} drops its whole plugin"
            if origin.plugin
            else ""
        )
        + ". Without strict mode (--strict, ASCEND_PATCH_STRICT=1, strict=True) the failure "
        "is recorded in the report and the original is kept.",
    ]
    return PatchError("\n".join(lines))


def _raised_at(cause: BaseException | None) -> str:
    """`` (raised at file:line in function)``: the innermost frame outside the core."""
    seen = 0
    while cause is not None and cause.__cause__ is not None and seen < 10:
        cause, seen = cause.__cause__, seen + 1
    tb: types.TracebackType | None = cause.__traceback__ if cause is not None else None
    place = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if not os.path.abspath(code.co_filename).startswith(_CORE_DIR + os.sep):
            place = f" (raised at {code.co_filename}:{tb.tb_lineno} in {code.co_name})"
        tb = tb.tb_next
    return place
