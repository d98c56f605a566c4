"""The libraries a plugin serves, read from its distribution's metadata without importing it.

A plugin distribution names the libraries its patches are for in the entry-point
group ``ascend_patch.serves``: one entry point per library, named by the library's
distribution name, whose value repeats the plugin's own entry point (which plugin of
the distribution serves it)::

    [project.entry-points.ascend_patch]
    mmcv = "ascend_patch_mmcv.plugin"

    [project.entry-points."ascend_patch.serves"]
    mmcv = "ascend_patch_mmcv.plugin"
    mmdet = "ascend_patch_mmcv.plugin"

A plugin none of whose served libraries is installed is *idle*: ``apply()`` does not
import it (its record says why) and doctor lists it as idle. A plugin that declares
nothing is always imported. This is OpenTelemetry's ``_instruments`` (the libraries
an instrumentation is for), moved from a module attribute, which costs an import to
read, into the metadata the core already caches (docs/plugin-authors.md says why this
form and not extras on the entry point).
"""

from __future__ import annotations

from collections.abc import Sequence

from .metadata import EntryPointInfo
from .metadata import MetadataCache
from .metadata import normalize_name


__all__ = ["GROUP", "IDLE", "idle_reason", "served_by", "served_in"]

#: The entry-point group a plugin distribution names its libraries in.
GROUP = "ascend_patch.serves"

#: How the record of an idle plugin starts (doctor shows such a plugin as ``idle``).
IDLE = "none of the libraries it serves is installed"


def served_by(
    cache: MetadataCache, plugins: Sequence[EntryPointInfo], shadowed: Sequence[EntryPointInfo]
) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Plugin entry-point name -> the distributions it serves, and warnings about stray rows.

    ``plugins`` are the plugin entry points in use, ``shadowed`` those another
    distribution's plugin of the same name hides (their rows are dropped silently).
    Two plugins may serve one library, so rows hidden by the first-wins rule of entry
    points count as much as the others.
    """
    rows = [*cache.entry_points(GROUP), *cache.shadowed_entry_points(GROUP)]
    if not rows:
        return {}, []
    owner = {(normalize_name(p.distribution), p.value): p.name for p in plugins}
    hidden = {(normalize_name(p.distribution), p.value) for p in shadowed}
    served: dict[str, set[str]] = {}
    warnings: list[str] = []
    for row in rows:
        key = (normalize_name(row.distribution), row.value)
        name = owner.get(key)
        if name is not None:
            served.setdefault(name, set()).add(normalize_name(row.name))
        elif key not in hidden:
            warnings.append(
                f"{row.distribution} {row.version} declares '{row.name} = {row.value}' in "
                f"[{GROUP}], but no plugin of that distribution has the entry point "
                f"{row.value!r}: the row is ignored"
            )
    return {name: tuple(sorted(libraries)) for name, libraries in served.items()}, warnings


def idle_reason(cache: MetadataCache, served: Sequence[str]) -> str | None:
    """Why a plugin serving ``served`` is idle here, or None when one of them is installed.

    Installed as requirements see it: a version announced by an extension (the
    emulator's torch-npu) counts.
    """
    from .requires import check_requirement

    if any(check_requirement(name, cache)[0] for name in served):
        return None
    return f"{IDLE} ({', '.join(served)})"


def served_in(reason: str | None) -> list[str]:
    """The libraries named by a reason :func:`idle_reason` wrote; [] for any other reason."""
    if not reason or not reason.startswith(IDLE + " ("):
        return []
    return reason[len(IDLE) + 2 : -1].split(", ")
