"""Version constraints on patches, checked from distribution metadata before any import.

A requirement is ``"dist SPECIFIERS"`` (``"mmcv>=2.0,<2.3"``); alternatives are joined
with ``|`` (``"mmcv>=2.0,<2.3 | mmcv-lite>=2.0,<2.3"``) because one import package
is often shipped by several distributions (mmcv, mmcv-full, mmcv-lite). ``packaging``
does the version logic; it is imported only on a cache miss (``packaging.specifiers``
costs ~12 ms to import).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .metadata import MetadataCache
from .metadata import normalize_name


__all__ = ["check_requirement", "override_version"]

_HEAD = r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*$"
#: The shape of a PEP 440 specifier list (``>=4.51,<6``), for a distribution that is not
#: installed: its answer needs no version logic, so packaging is not imported to parse
#: it; a text of another shape still goes to packaging, which says what is wrong.
#: A pattern, not a compiled one: ``re`` compiles (and caches) it on first use, on a
#: cache miss; compiling it at import cost ~0.3 ms of every apply().
_SPECIFIERS = (
    r"\s*(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9][A-Za-z0-9.*+!_-]*\s*"
    r"(?:,\s*(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9][A-Za-z0-9.*+!_-]*\s*)*"
)


#: Versions announced by extensions, by normalized distribution name: what such a
#: distribution counts as (a version, or None for "not installed"), and a note for the
#: explanation. The NPU emulator announces the torch_npu it stands in for here.
_overrides: dict[str, tuple[str | None, str]] = {}


def override_version(distribution: str, version: str | None, note: str = "") -> Callable[[], None]:
    """Make requirements see ``distribution`` at ``version`` (None: not installed) until undone.

    For extensions that stand in for a distribution, like the NPU emulator for
    ``torch-npu``. Answers about an overridden distribution are never written to the
    on-disk cache (the override ends with the process, or with the returned undo
    function, which restores whatever was announced before).
    """
    key = normalize_name(distribution)
    previous = _overrides.get(key)
    _overrides[key] = (version, note)

    def undo() -> None:
        if previous is None:
            _overrides.pop(key, None)
        else:
            _overrides[key] = previous

    return undo


def check_requirement(text: str, cache: MetadataCache) -> tuple[bool, str]:
    """Return (satisfied, explanation) for one requirement string with alternatives.

    A distribution with an :func:`override_version` has the announced version; such
    answers are not cached.
    """
    overridden = bool(_overrides) and any(
        _distribution_name(alternative) in _overrides for alternative in text.split("|")
    )
    cached = None if overridden else cache.cached_requirement(text)
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
    if not overridden:
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
        # packaging (~10 ms to import) stays unimported. Answers about an overridden
        # distribution (torch-npu under the emulator) are never cached, so this
        # matters on every run. Nor does a specifier of a distribution that is not
        # installed ("transformers>=4.51,<6" without transformers): on a cache miss,
        # most plugin groups ask about libraries the program does not have.
        absent = (
            match.group(2)
            and re.fullmatch(_SPECIFIERS, match.group(2))
            and (_overrides.get(normalize_name(name)) if _overrides else None) is None
            and cache.version(name) is None
        )
        if absent:
            return False, f"{name} is not installed"
        if match.group(2):
            from packaging.specifiers import InvalidSpecifier
            from packaging.specifiers import SpecifierSet

            try:
                specifier = SpecifierSet(match.group(2))
            except InvalidSpecifier as exc:
                return False, f"invalid requirement {text!r}: {exc}"
    override = _overrides.get(normalize_name(name)) if _overrides else None
    version = cache.version(name) if override is None else override[0]
    note = f" ({override[1]})" if override is not None and override[1] else ""
    if version is None:
        return False, f"{name} is not installed{note}"
    # Pre-releases count: an installed mmcv 2.0.0rc4 is what the user runs.
    if specifier is None or specifier.contains(version, prereleases=True):
        return True, f"{name} {version}{note}"
    return False, f"{name} {version} is installed; the patch requires {name}{specifier}"
