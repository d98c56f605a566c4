"""Version constraints on patches, checked from distribution metadata before any import.

A requirement is ``"dist SPECIFIERS"`` (``"mmcv>=2.0,<2.3"``); alternatives are joined
with ``|`` (``"mmcv>=2.0,<2.3 | mmcv-lite>=2.0,<2.3"``) because one import package
is often shipped by several distributions (mmcv, mmcv-full, mmcv-lite). ``packaging``
does the version logic; it is imported only on a cache miss (``packaging.specifiers``
costs ~12 ms to import).
"""

from __future__ import annotations

import re

from ._metadata import MetadataCache


__all__ = ["check_requirement"]

_HEAD = r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*$"


def check_requirement(text: str, cache: MetadataCache) -> tuple[bool, str]:
    """Return (satisfied, explanation) for one requirement string with alternatives."""
    cached = cache.cached_requirement(text)
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
    cache.store_requirement(text, result)
    return result


def _check_one(text: str, cache: MetadataCache) -> tuple[bool, str]:
    match = re.match(_HEAD, text)
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
        from packaging.specifiers import InvalidSpecifier
        from packaging.specifiers import SpecifierSet

        name = match.group(1)
        try:
            specifier = SpecifierSet(match.group(2))
        except InvalidSpecifier as exc:
            return False, f"invalid requirement {text!r}: {exc}"
    version = cache.version(name)
    if version is None:
        return False, f"{name} is not installed"
    # Pre-releases count: an installed mmcv 2.0.0rc4 is what the user runs.
    if specifier.contains(version, prereleases=True):
        return True, f"{name} {version}"
    return False, f"{name} {version} is installed; the patch requires {name}{specifier}"
