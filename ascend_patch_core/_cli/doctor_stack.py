"""Doctor's Environment section: Python, torch, and what installed distributions report.

The core knows nothing of the NPU software stack (torch_npu, CANN, NPUs, the
runtime's variables) nor of its kits' settings: the distributions that do publish a
*reporter* in the entry-point group ``ascend_patch.doctor`` -- the torch plugin
(``ascend_patch_torch.stack``), the emulator kit (``ascend_patch_emulator.doctor``) --
as :mod:`.._install.settings` finds setting providers. A reporter may have::

    VARIABLES: Mapping[str, str]                       # name -> what it does
    facts(environment, try_import) -> dict[str, Any]   # sections of doctor's "environment"
    rows(environment) -> list[(label, text)]           # lines of the Environment table
    findings(environment, environ) -> list[(level, code, message)]

each optional. Without them doctor shows Python, torch, the core's own variables,
and nothing it does not know. A reporter that fails is a warning naming it; the
others still report.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

from .._discovery.metadata import EntryPointInfo
from .._discovery.metadata import MetadataCache
from .._model.value import Value


__all__ = ["GROUP", "VARIABLES", "Finding", "Stack", "gather", "python_info", "torch_info"]

#: The entry-point group of doctor reporters.
GROUP = "ascend_patch.doctor"

#: The core's own variables, with what they do.
VARIABLES: dict[str, str] = {
    "ASCEND_PATCH_DISABLE": "ascend-patch: plugins not to load",
    "ASCEND_PATCH_ENABLE": "ascend-patch: opt-in patch groups to turn on",
    "ASCEND_PATCH_PLUGINS": "ascend-patch: load only these plugins",
    "ASCEND_PATCH_AUTOLOAD": "ascend-patch: 0 turns plugin discovery off",
    "ASCEND_PATCH_STRICT": "ascend-patch: 1 makes every failure raise",
    "ASCEND_PATCH_PLUGIN_TIMEOUT": (
        "ascend-patch: seconds each plugin may take to load (0: no bound; default 10 in the"
        " commands, none for apply())"
    ),
    "ASCEND_PATCH_RUN": "ascend-patch: set by `ascend-patch run` for the processes it starts",
}


class Finding(NamedTuple):
    """One observation for the user. ``level``: "error", "warning" or "note"."""

    level: str
    code: str
    message: str


class Stack(Value):
    """What :func:`gather` found: doctor's ``environment``, its table rows, its findings."""

    __slots__ = ("environment", "findings", "rows")
    _fields = ("environment", "rows", "findings")

    def __init__(
        self, environment: dict[str, Any], rows: list[tuple[str, str]], findings: list[Finding]
    ) -> None:
        self.environment = environment
        self.rows = rows
        self.findings = findings


def python_info() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "platform": f"{platform.system()}-{platform.machine()}",
    }


def torch_info(meta: MetadataCache) -> dict[str, Any]:
    version = meta.version("torch")
    local = version.partition("+")[2] if version else ""
    return {"installed": version is not None, "version": version, "build": local or None}


def gather(
    meta: MetadataCache, try_import: bool, environ: Mapping[str, str] | None = None
) -> Stack:
    """Python and torch, then every reporter's facts, rows, variables and findings."""
    env = os.environ if environ is None else environ
    environment: dict[str, Any] = {"python": python_info(), "torch": torch_info(meta)}
    found: list[Finding] = []
    reporters: list[tuple[EntryPointInfo, Any]] = []
    for info in meta.entry_points(GROUP):
        try:
            reporters.append((info, info.load()))
        except Exception as exc:
            found.append(_failed(info, "cannot be loaded", exc))
    for info, reporter in reporters:
        try:
            environment.update(_call(reporter, "facts", {}, environment, try_import))
        except Exception as exc:
            found.append(_failed(info, "failed gathering its facts", exc))
    rows: list[tuple[str, str]] = []
    variables: dict[str, str] = {}
    for info, reporter in reporters:
        try:
            rows.extend((str(a), str(b)) for a, b in _call(reporter, "rows", [], environment))
            variables.update(getattr(reporter, "VARIABLES", {}))
            found.extend(
                Finding(*map(str, f)) for f in _call(reporter, "findings", [], environment, env)
            )
        except Exception as exc:
            found.append(_failed(info, "failed", exc))
    variables.update(VARIABLES)
    environment["variables"] = [
        {"name": name, "value": env.get(name), "meaning": meaning}
        for name, meaning in variables.items()
    ]
    return Stack(environment, rows, found)


def _call(reporter: Any, name: str, default: Any, *args: Any) -> Any:
    function = getattr(reporter, name, None)
    return default if function is None else function(*args)


def _failed(info: EntryPointInfo, what: str, exc: Exception) -> Finding:
    return Finding(
        "warning",
        "doctor-reporter",
        f"doctor reporter {info.name!r} ({info.value} from {info.distribution} {info.version}) "
        f"{what}: {type(exc).__name__}: {exc}",
    )
