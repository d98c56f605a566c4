"""The checks behind ``ascend-patch doctor``'s findings: plugins, the start hook, the metadata cache.

Each function turns facts gathered by :mod:`.doctor` into :class:`Finding` objects;
the cache check also acts (it removes a cache that fails, so the next run rebuilds
it) and says so in its finding.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from .._discovery.plugin_serves import served_in
from .._engine.declarations import DeclaredPatch
from .._engine.declarations import Inventory
from .._engine.declarations import PluginInfo
from .bootstrap import PTH_NAME
from .doctor_stack import Finding


__all__ = ["cache_check", "plugin_findings", "stack_findings", "torch_findings"]


def _empty_plugin(plugin: PluginInfo) -> str:
    prov = plugin.provenance
    origin = f" ({prov.distribution} {prov.version})" if prov.distribution else ""
    return (
        f"plugin {plugin.name!r}{origin} declares nothing (no patch, import rule or "
        "environment default): installing it changes nothing. If it should, check that its "
        "hooks are marked with @hookimpl and return their declarations"
    )


def plugin_findings(inventory: Inventory, disable: Iterable[str]) -> list[Finding]:
    out: list[Finding] = []
    loaded = inventory.loaded()
    for plugin in inventory.plugins:
        if plugin.status == "broken":
            out.append(
                Finding("error", "plugin-broken", plugin.reason or f"plugin {plugin.name!r} failed")
            )
        out.extend(
            Finding("error", "declaration-error", f"plugin {plugin.name!r}: {e}")
            for e in plugin.errors
        )
        out.extend(
            Finding("warning", "plugin-warning", f"plugin {plugin.name!r}: {w}")
            for w in plugin.warnings
        )
        if plugin.status == "loaded" and not (plugin.patches or plugin.rules or plugin.env):
            out.append(Finding("warning", "plugin-empty", _empty_plugin(plugin)))
        for patch in plugin.patches:
            for requirement in patch.requirements:
                if requirement.detail.startswith("invalid requirement"):
                    out.append(
                        Finding(
                            "error",
                            "invalid-requirement",
                            f"plugin {plugin.name!r}, patch {patch.name!r}: {requirement.detail}",
                        )
                    )
        for setting in plugin.env:
            user = os.environ.get(setting.name)
            if user is not None and user != setting.value:
                why = f" ({setting.why})" if setting.why else ""
                out.append(
                    Finding(
                        "note",
                        "env-overridden",
                        f"plugin {plugin.name!r} recommends {setting.name}={setting.value}{why}; "
                        f"you set {setting.name}={user}, which is kept",
                    )
                )
    out.extend(Finding("warning", "unknown-name", w) for w in inventory.warnings)
    for names, switch in (
        (disable, "--disable"),
        (inventory.selection.enable, "--enable / ASCEND_PATCH_ENABLE"),
    ):
        out.extend(
            Finding("warning", "unknown-name", w) for w in inventory.unknown_given(names, switch)
        )
    for plugin_name, group, other in inventory.group_conflicts():
        out.append(
            Finding(
                "error",
                "group-conflict",
                f"patch groups {group!r} (plugin {plugin_name!r}) and {other!r} conflict "
                f"({group}.conflicts_with names {other!r}); apply() raises PatchConflictError: "
                f"disable one, e.g. --disable {other}",
            )
        )
    for target, patches in inventory.collisions():
        who = " and ".join(f"{p.name!r} (plugin {p.plugin!r})" for p in patches)
        out.append(
            Finding(
                "warning",
                "patch-collision",
                f"{who} {'both' if len(patches) == 2 else 'all'} patch {target}; "
                "the last one applied wins (an error in strict mode)",
            )
        )
    for patch, name in inventory.missing_dependencies():
        out.append(
            Finding(
                "error",
                "missing-dependency",
                f"plugin {patch.plugin!r}, patch {patch.name!r}: after={name!r} names no patch or "
                "group of any loaded plugin, so it would fail",
            )
        )
    # An idle plugin is not missing: the libraries it serves are (its row says which).
    if not loaded and not any(p.status in ("broken", "idle") for p in inventory.plugins):
        out.append(
            Finding(
                "warning",
                "no-plugins",
                "no plugin is loaded: install one (pip install ascend-patch-torch) or check "
                "ASCEND_PATCH_DISABLE / ASCEND_PATCH_PLUGINS / ASCEND_PATCH_AUTOLOAD",
            )
        )
    return out


def stack_findings(core: dict[str, Any]) -> list[Finding]:
    """The core's own installation (its start hook); the NPU stack's come from its reporter."""
    out: list[Finding] = []
    hook = core["start_hook"]
    if not hook["installed"]:
        out.append(
            Finding(
                "warning",
                "start-hook-missing",
                f"the start hook ({PTH_NAME}) is not in this interpreter's site-packages: "
                "'ascend-patch run' patches its own process but not spawned workers or torchrun "
                "ranks; reinstall ascend-patch-core with pip",
            )
        )
    elif hook["current"] is False:
        out.append(
            Finding(
                "warning",
                "start-hook-stale",
                f"{hook['path']} differs from the one this ascend-patch-core ships; reinstall it with pip",
            )
        )
    return out


#: Requirement names (normalized) and libraries that mean "needs PyTorch".
_TORCH = ("torch", "torch-npu", "torch_npu")


def _needs_torch(patch: DeclaredPatch) -> bool:
    if patch.library in _TORCH:
        return True
    for requirement in patch.requirements:
        # "torch>=2.1", "torch-npu", "mmcv | torch": any alternative naming torch.
        for alternative in requirement.text.split("|"):
            name = re.split(r"[\s<>=!~;\[(]", alternative.strip(), maxsplit=1)[0]
            if name.lower().replace("_", "-") in ("torch", "torch-npu"):
                return True
    return False


def torch_findings(inventory: Inventory, facts: dict[str, Any]) -> list[Finding]:
    """Without torch, what needs it cannot apply: an error naming the plugins, not an "ok"."""
    if facts["torch"]["installed"] or (facts.get("torch_npu") or {}).get("installed"):
        return []  # (torch_npu without torch is the NPU stack reporter's torch-missing error)
    needing = []
    for plugin in inventory.loaded():
        count = sum(_needs_torch(p) for p in plugin.patches)
        if count:
            needing.append(f"{count} of plugin {plugin.name!r}")
    for plugin in inventory.plugins:
        # Idle for want of torch among its libraries: its patches are not even loaded.
        served = served_in(plugin.reason) if plugin.status == "idle" else []
        if "torch" in served:
            needing.append(f"all of plugin {plugin.name!r} (it serves {', '.join(served)})")
    if not needing:
        return [Finding("note", "no-torch", "torch is not installed (no loaded plugin patches it)")]
    return [
        Finding(
            "error",
            "torch-missing",
            "torch is not installed, so the patches that need it cannot apply here: "
            f"{', '.join(needing)}. Install torch (pip install torch; on an NPU machine the "
            "version your torch_npu release pairs with)",
        )
    ]


_SECURITY = "see docs/security.md"


def cache_check() -> tuple[dict[str, Any], list[Finding]]:
    """The on-disk metadata cache as ``apply()`` would load it, checked against a fresh scan.

    Returns the ``cache`` section of doctor's JSON and the findings. A cache that is
    discarded (malformed, or an answer not backed by an installed distribution) or
    that disagrees with what is installed now is removed: the next run rebuilds it.
    """
    from .._discovery.metadata import MetadataCache

    cache = MetadataCache()
    path, answers = cache.audit()
    info: dict[str, Any] = {"path": path, "state": "disabled", "detail": None}
    out: list[Finding] = []
    if cache.ignored:
        out.append(Finding("note", "cache-setting-ignored", f"metadata cache: {cache.ignored}"))
    if cache.unplaced:
        info.update(state="memory-only", detail=cache.unplaced)
        out.append(
            Finding(
                "warning",
                "cache-memory-only",
                f"metadata cache: {cache.unplaced}, so the cache is kept in memory only and "
                "every run reads the installed distributions again (slower start-up). Set "
                "ASCEND_PATCH_CACHE_DIR (or XDG_CACHE_HOME, or HOME) to an absolute path",
            )
        )
        return info, out
    if path is None:
        return info, out
    if cache.repaired:
        out.append(Finding("note", "cache-repaired", f"metadata cache: {cache.repaired}"))
    directory = os.path.dirname(path)
    unusable = _unusable_directory(directory)
    if unusable is not None and (unusable[0] or not cache.refused):
        # What is really wrong (a file in its place, a directory this user cannot write),
        # said before the owner-and-mode advice, which does not fit these cases.
        what, fix = unusable[1:]
        info["detail"] = info["detail"] or what
        out.append(
            Finding(
                "warning",
                "cache-unwritable",
                f"metadata cache: {what}, so the cache is never written and every run reads "
                f"the installed distributions again (slower start-up). {fix}",
            )
        )
        if unusable[0]:  # neither read nor written
            info["state"] = "refused"
            return info, out
    if cache.refused:
        info.update(state="refused", detail=cache.refused)
        out.append(
            Finding(
                "warning",
                "cache-refused",
                f"metadata cache: {cache.refused}. Every run reads the installed distributions "
                "again (slower start-up) until the directory is yours and private "
                f"(chmod 700 {os.path.dirname(path)}) or ASCEND_PATCH_CACHE_DIR names one; "
                + _SECURITY,
            )
        )
    elif cache.rejected:
        cache.clear()
        info.update(state="invalid", detail=cache.rejected)
        out.append(
            Finding(
                "warning",
                "cache-invalid",
                f"metadata cache {path} was discarded: {cache.rejected}. Doctor removed it; "
                "the next run writes a fresh one. If this recurs, something else writes the "
                f"cache: {_SECURITY}",
            )
        )
    elif answers is None:
        info["state"] = "stale" if os.path.exists(path) else "absent"
    else:
        differences = _differences(answers)
        if differences:
            cache.clear()
            info.update(state="mismatch", detail="; ".join(differences))
            out.append(
                Finding(
                    "warning",
                    "cache-mismatch",
                    f"metadata cache {path} disagrees with the installed distributions: "
                    f"{'; '.join(differences[:3])}"
                    f"{f' (and {len(differences) - 3} more)' if len(differences) > 3 else ''}. "
                    "Doctor removed it; the next run rebuilds it from a fresh scan. If this "
                    f"recurs, something else writes the cache: {_SECURITY}",
                )
            )
        else:
            info["state"] = "valid"
    return info, out


def _unusable_directory(directory: str) -> tuple[bool, str, str] | None:
    """``(not a directory, what is wrong, the fix)`` when the cache cannot be written there.

    A file in place of the directory (or of a parent it would be created in), or a
    directory this user cannot write (its permissions, a read-only file system), with
    the OS's own reason (EACCES, EROFS ...): found by trying, as the cache would, with
    a probe file created and removed at once.
    """
    import errno
    import tempfile

    elsewhere = (
        "or set ASCEND_PATCH_CACHE_DIR to another directory"
        if os.environ.get("ASCEND_PATCH_CACHE_DIR")
        else "or set ASCEND_PATCH_CACHE_DIR to a directory of yours"
    )
    existing = directory
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)  # the directory is created there when missing
    if existing == directory:
        place = f"the cache directory {directory}"
    else:
        place = f"{existing}, where the cache directory {directory} would be created,"
    if os.path.lexists(existing) and not os.path.isdir(existing):
        return (
            True,
            f"{place} is a file, not a directory",
            f"Move that file away (the directory is created when missing), {elsewhere}.",
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".ascend-patch-doctor-", dir=existing)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            fix = "Set ASCEND_PATCH_CACHE_DIR to a directory on a writable file system."
        else:
            fix = f"Make it writable for this user (chmod u+w {existing}), {elsewhere}."
        return False, f"{place} is not writable ({exc.strerror or type(exc).__name__})", fix
    return None


def _differences(answers: dict[str, Any]) -> list[str]:
    """Where a loaded cache's answers differ from a fresh scan of what is installed."""
    from .._discovery.metadata import MetadataCache
    from .._discovery.requires import check_requirement

    fresh = MetadataCache(persistent=False)
    out: list[str] = []
    for field, scan in (
        ("groups", fresh.entry_points),
        ("shadowed", fresh.shadowed_entry_points),
    ):
        for group, rows in answers[field].items():
            cached = sorted(tuple(row[:5]) for row in rows)
            installed = sorted(
                (i.name, i.value, i.group, i.distribution, i.version) for i in scan(group)
            )
            if cached != installed:
                what = "entry points" if field == "groups" else "shadowed entry points"
                out.append(
                    f"{what} of {group!r}: cached {_rows(cached)}, installed {_rows(installed)}"
                )
    for key, found in answers["versions"].items():
        cached_version = None if found is None else found[0]
        installed_version = fresh.version(key)
        if cached_version != installed_version:
            out.append(
                f"{key}: cached {cached_version or 'not installed'}, "
                f"installed {installed_version or 'not installed'}"
            )
    for text, (satisfied, _, _) in answers["requirements"].items():
        now = check_requirement(text, fresh)[0]
        if now != satisfied:
            out.append(
                f"requirement {text!r}: cached {'met' if satisfied else 'unmet'}, "
                f"now {'met' if now else 'unmet'}"
            )
    return out


def _rows(rows: list[tuple[Any, ...]]) -> str:
    return (
        "[" + ", ".join(f"{r[0]} = {r[1]} ({r[3]} {r[4]})" for r in rows) + "]" if rows else "none"
    )
