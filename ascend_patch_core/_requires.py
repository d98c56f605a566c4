"""Version constraints on patches, checked from distribution metadata before any import.

A requirement is ``"dist SPECIFIERS"`` (``"mmcv>=2.0,<2.3"``); alternatives are joined
with ``|`` (``"mmcv>=2.0,<2.3 | mmcv-lite>=2.0,<2.3"``) because one import package
is often shipped by several distributions (mmcv, mmcv-full, mmcv-lite). ``packaging``
does the version logic; it is imported only on a cache miss (``packaging.specifiers``
costs ~12 ms to import).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from ._metadata import MetadataCache
from ._metadata import normalize_name


__all__ = ["check_requirement"]

_HEAD = r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*$"


def _emulated_torch_npu() -> str | None:
    """The torch_npu version the NPU emulator stands in for, while it is active."""
    emulator = sys.modules.get("ascend_patch_core.emulator")
    if emulator is None or not emulator.is_active():
        return None
    version: str | None = emulator.active_version()
    return version


def check_requirement(text: str, cache: MetadataCache) -> tuple[bool, str]:
    """Return (satisfied, explanation) for one requirement string with alternatives.

    Under the NPU emulator, ``torch-npu`` has the emulated version (never cached:
    the emulation ends with the process or with ``deactivate()``).
    """
    emulated = _emulated_torch_npu() is not None and any(
        _distribution_name(alternative) == "torch-npu" for alternative in text.split("|")
    )
    cached = None if emulated else cache.cached_requirement(text)
    if cached is not None:
        return cached
    explanations: list[str] = []
    result: tuple[bool, str] | None = None
    for alternative in text.split("|"):
        ok, why = _check_one(alternative.strip(), cache)
        if ok:
            result = (True, why)
            break
        explanations.append(why)
    if result is None:
        result = (False, "; ".join(explanations))
    if not emulated:
        cache.store_requirement(text, result)
    return result


def _distribution_name(text: str) -> str | None:
    match = re.match(_HEAD, text)
    return normalize_name(match.group(1)) if match else None


def _check_one(text: str, cache: MetadataCache) -> tuple[bool, str]:
    match = re.match(_HEAD, text)
    specifier: Any = None  # packaging's SpecifierSet; None: any installed version
    if not match or any(c in text for c in ";[@"):
        from packaging.requirements import InvalidRequirement
        from packaging.requirements import Requirement

        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            return False, f"invalid requirement {text!r}: {exc}"
        name, specifier = req.name, req.specifier
        if req.marker is not None and not req.marker.evaluate():
            return True, f"{text!r} does not apply to this environment"
    else:
        name = match.group(1)
        # A bare name ("torch-npu") needs no version logic: installed is enough, and
        # packaging (~10 ms to import) stays unimported. Under the emulator such
        # answers are never cached, so this matters on every run.
        if match.group(2):
            from packaging.specifiers import InvalidSpecifier
            from packaging.specifiers import SpecifierSet

            try:
                specifier = SpecifierSet(match.group(2))
            except InvalidSpecifier as exc:
                return False, f"invalid requirement {text!r}: {exc}"
    emulated = _emulated_torch_npu() if normalize_name(name) == "torch-npu" else None
    version = emulated or cache.version(name)
    if version is None:
        return False, f"{name} is not installed"
    # Pre-releases count: an installed mmcv 2.0.0rc4 is what the user runs.
    if specifier is None or specifier.contains(version, prereleases=True):
        return True, f"{name} {version}" + (" (emulated)" if emulated else "")
    return False, f"{name} {version} is installed; the patch requires {name}{specifier}"
