"""``ascend-patch doctor``: plugins, their declarations and the NPU stack, checked without applying.

Nothing is patched and no target library is imported: plugins are loaded (their
hooks only return declarations), patch groups expanded, version constraints checked
from distribution metadata, libraries looked up with ``find_spec`` of their top-level
name. The on-disk metadata cache is loaded as ``apply()`` would and checked against
a fresh scan (:func:`._doctor_checks.cache_check`). The JSON form (``--json``)
follows the ``ascend-patch-doctor/1`` schema in docs/cli-reference.md; the exit status is 1
when something is broken (an ``error`` finding), or, with ``--strict``, when there
is any warning.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable
from typing import Any
from typing import TextIO

from .._discovery.metadata import MetadataCache
from .._engine.declarations import DeclaredPatch
from .._engine.declarations import Inventory
from .._engine.declarations import PluginInfo
from .._engine.declarations import collect
from .._model.output import Style
from .._model.output import table
from .bootstrap import PTH_NAME
from .bootstrap import PTH_TEXT
from .doctor_checks import cache_check
from .doctor_checks import plugin_findings
from .doctor_checks import stack_findings
from .doctor_checks import torch_findings
from .doctor_stack import Finding
from .doctor_stack import gather


__all__ = ["SCHEMA", "diagnose", "exit_status", "render"]

SCHEMA = "ascend-patch-doctor/1"


def _core_info(meta: MetadataCache) -> dict[str, Any]:
    import ascend_patch_core

    from .bootstrap import EMULATOR_GROUP

    package_dir = os.path.dirname(os.path.abspath(ascend_patch_core.__file__ or "."))
    return {
        "version": meta.version("ascend-patch-core"),
        "path": package_dir,
        "start_hook": _start_hook(),
        # The kits are separate distributions: say which are here.
        "emulator": meta.version("ascend-patch-emulator"),
        "training": meta.version("ascend-patch-training"),
        "emulator_entry_point": meta.entry_point(EMULATOR_GROUP, "torch_npu") is not None,
    }


def _site_dirs() -> list[str]:
    import site

    dirs: list[str] = []
    # Old virtualenv releases ship a site.py without these functions.
    with contextlib.suppress(AttributeError):
        dirs.extend(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(dirs))


def _start_hook() -> dict[str, Any]:
    for directory in _site_dirs():
        path = os.path.join(directory, PTH_NAME)
        if os.path.isfile(path):
            try:
                with open(path, "rb") as installed:
                    current: bool | None = installed.read() == PTH_TEXT.encode("utf-8")
            except OSError:
                current = None
            return {"installed": True, "path": path, "current": current}
    return {"installed": False, "path": None, "current": None}


def _patch_dict(patch: DeclaredPatch) -> dict[str, Any]:
    return {
        "kind": patch.kind,
        "name": patch.name,
        "group": patch.group,
        "target": patch.target,
        "aliases": list(patch.aliases),
        "library": patch.library,
        "library_installed": patch.library_installed,
        "requires": [
            {"requirement": r.text, "satisfied": r.satisfied, "detail": r.detail}
            for r in patch.requirements
        ],
        "after": list(patch.after),
        "applicable": patch.applicable,
        "not_applicable_reason": patch.not_applicable_reason,
        "note": patch.note,
    }


def _group_dicts(plugin: PluginInfo) -> list[dict[str, Any]]:
    """Each group of the plugin: default or opt-in, and whether it applies here.

    ``applicable`` counts the group's patches apply() would install on this machine;
    ``reason`` is why the others would not be (a switch -- disabled, opt-in -- before
    the first unmet requirement), or that the group declares none here (an op group
    with no kernel on this machine); ``notes`` collects what its patches say of how
    they work (an op group's kernel source).
    """
    groups: list[dict[str, Any]] = []
    for name, (opt_in, requires) in plugin.group_facts.items():
        patches = [p for p in plugin.patches if p.group == name]
        applicable = [p for p in patches if p.applicable]
        # A switch (disabled, opt-in) says more than the first unmet requirement.
        reasons: list[str | None] = [p.verdict for p in patches if p.verdict]
        reasons = reasons or [p.not_applicable_reason for p in patches if not p.applicable]
        if not patches:
            reasons = ["declares no patch on this machine"]
        groups.append(
            {
                "name": name,
                "default": not opt_in,
                "requires": list(requires),
                "patches": len(patches),
                "applicable": len(applicable),
                "reason": reasons[0] if reasons else None,
                "notes": sorted({p.note for p in patches if p.note}),
            }
        )
    return groups


def _plugin_dict(plugin: PluginInfo) -> dict[str, Any]:
    prov = plugin.provenance
    return {
        "name": plugin.name,
        "distribution": prov.distribution,
        "version": prov.version,
        "entry_point": prov.entry_point,
        "file": prov.file,
        "status": plugin.status,
        "reason": plugin.reason,
        "warnings": list(plugin.warnings),
        "errors": list(plugin.errors),
        "patches": [_patch_dict(p) for p in plugin.patches],
        "groups": _group_dicts(plugin),
        "rules": [
            {
                "kind": r.kind,
                "module": r.module,
                "description": r.description,
                "in_use": r.in_use,
                "real_origin": r.real_origin,
            }
            for r in plugin.rules
        ],
        "env": [
            {"name": s.name, "value": s.value, "why": s.why, "user_value": os.environ.get(s.name)}
            for s in plugin.env
        ],
    }


def _libraries(inventory: Inventory) -> list[dict[str, Any]]:
    meta = MetadataCache(persistent=False)
    libraries: dict[str, dict[str, Any]] = {}
    for patch in inventory.patches():
        entry = libraries.setdefault(
            patch.library,
            {
                "name": patch.library,
                "installed": patch.library_installed,
                "version": None,
                "patches": 0,
                "applicable": 0,
            },
        )
        entry["patches"] += 1
        entry["applicable"] += int(patch.applicable)
        if entry["version"] is None and patch.library_installed:
            entry["version"] = meta.version(patch.library)
    return sorted(libraries.values(), key=lambda e: str(e["name"]))


def diagnose(
    *,
    disable: Iterable[str] = (),
    plugins: Iterable[str] | None = None,
    enable: Iterable[str] = (),
    try_import: bool = False,
    strict: bool = False,
) -> dict[str, Any]:
    """Everything doctor knows, as the ``ascend-patch-doctor/1`` JSON object."""
    started = time.perf_counter()
    disable = list(disable)
    meta = MetadataCache(persistent=False)
    inventory = collect(disable=disable, plugins=plugins, enable=enable, meta=meta)
    core = _core_info(meta)
    stack = gather(meta, try_import)
    facts = stack.environment
    cache, cache_findings = cache_check()
    findings = (
        plugin_findings(inventory, disable)
        + stack_findings(core)
        + torch_findings(inventory, facts)
        + stack.findings
        + cache_findings
        + _suggested_plugins(meta)
    )
    order = {"error": 0, "warning": 1, "note": 2}
    findings.sort(key=lambda f: order.get(f.level, 3))
    counts = {level: sum(f.level == level for f in findings) for level in order}
    selection = inventory.selection
    return {
        "schema": SCHEMA,
        "ok": counts["error"] == 0 and not (strict and counts["warning"]),
        "counts": counts,
        "core": core,
        "selection": {
            "disable": sorted(set(selection.disable) | set(disable)),
            "plugins": sorted(selection.allow) if selection.allow is not None else None,
            "enable": sorted(selection.enable),
            "autoload": selection.autoload,
            "strict": strict or selection.strict,
        },
        "plugins": [_plugin_dict(p) for p in inventory.plugins],
        "libraries": _libraries(inventory),
        "environment": facts,
        # The Environment table's lines from the reporters (torch_npu, CANN, NPUs ...).
        "environment_rows": [list(row) for row in stack.rows],
        "metadata_cache": cache,
        "findings": [f._asdict() for f in findings],
        "elapsed_s": round(time.perf_counter() - started, 3),
    }


def _suggested_plugins(meta: MetadataCache) -> list[Finding]:
    """Notes naming the plugins that would serve installed libraries (``ascend-patch suggest``)."""
    from .suggest import doctor_findings

    return [Finding("note", code, message) for code, message in doctor_findings(meta)]


def exit_status(result: dict[str, Any]) -> int:
    return 0 if result["ok"] else 1


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}es" if word.endswith(("ch", "sh", "s", "x")) else f"{n} {word}s"


def _module_rows(plugins: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per ``when_missing`` rule: which module an import gets on this machine."""
    rows: list[list[Any]] = []
    for plugin in plugins:
        for rule in plugin["rules"]:
            in_use = rule.get("in_use")
            if in_use is None or in_use == "none":  # "none": its package is not installed
                continue
            text = {
                "real": f"the real one: {rule['real_origin']}",
                "replacement": f"served by plugin {plugin['name']!r} (no real one installed)",
            }.get(in_use, in_use)
            rows.append([rule["module"], text])
    return rows


def _group_rows(plugins: list[dict[str, Any]], style: Style) -> list[list[Any]]:
    """One row per group of a loaded plugin: applies here, partly, or why not."""
    rows: list[list[Any]] = []
    for plugin in plugins:
        for group in plugin.get("groups", ()):
            if group["patches"] and group["applicable"] == group["patches"]:
                state = style.level("ok", "applies")
            elif group["applicable"]:
                state = style.level("ok", "partly")
            else:
                state = style.paint("no", "dim")
            count = f"{group['applicable']}/{group['patches']}"
            complete = group["patches"] and group["applicable"] == group["patches"]
            why = "" if complete else group["reason"] or ""
            detail = "; ".join([*group["notes"], why] if why else group["notes"])
            kind = "default" if group["default"] else "opt-in"
            rows.append([plugin["name"], group["name"], kind, state, count, detail])
    return rows


def render(result: dict[str, Any], *, verbose: bool = False, stream: TextIO | None = None) -> str:
    """The human-readable report."""
    style = Style(stream if stream is not None else sys.stdout)
    core = result["core"]
    lines = [
        style.paint("ascend-patch doctor", "bold")
        + f"  ascend-patch-core {core['version'] or '?'}  {core['path']}",
        "",
    ]

    plugins = result["plugins"]
    lines.append(style.paint(f"Plugins ({len(plugins)})", "bold"))
    rows: list[list[Any]] = []
    for plugin in plugins:
        status = plugin["status"]
        level = {"loaded": "ok", "broken": "error"}.get(status, "note")
        origin = f"{plugin['distribution'] or '?'} {plugin['version'] or ''}".strip()
        if status == "loaded":
            applicable = sum(p["applicable"] for p in plugin["patches"])
            detail = (
                f"{_plural(len(plugin['patches']), 'patch')} ({applicable} applicable here), "
                f"{_plural(len(plugin['rules']), 'import rule')}"
            )
            if plugin["env"]:
                detail += f", {_plural(len(plugin['env']), 'env default')}"
        else:
            detail = plugin["reason"] or ""
        rows.append(
            [
                style.level(level, status.upper() if level == "error" else status),
                plugin["name"],
                origin,
                detail,
            ]
        )
    lines.extend(table(rows, style) if rows else ["  none installed"])
    group_rows = _group_rows(plugins, style)
    if group_rows:
        lines += ["", style.paint("Groups", "bold")]
        lines.extend(table(group_rows, style))
    module_rows = _module_rows(plugins)
    if module_rows:
        lines += ["", style.paint("Modules served when missing", "bold")]
        lines.extend(table(module_rows, style))
    if verbose:
        for plugin in plugins:
            lines.append("")
            lines.append(f"  {style.paint(plugin['name'], 'bold')}  {plugin['entry_point'] or ''}")
            if plugin["file"]:
                lines.append(f"    file: {plugin['file']}")
            patch_rows: list[list[Any]] = []
            for patch in plugin["patches"]:
                state = style.level("ok") if patch["applicable"] else style.paint("skip", "dim")
                requires = ", ".join(r["requirement"] for r in patch["requires"]) or "-"
                why = patch["not_applicable_reason"] or ""
                kind = "" if patch["kind"] == "patch" else f"[{patch['kind']}] "
                patch_rows.append([state, kind + patch["target"], requires, why])
            lines.extend(table(patch_rows, style, indent=4, max_width=72))
            for rule in plugin["rules"]:
                lines.append(f"    rule    {rule['description']}")
            for setting in plugin["env"]:
                lines.append(f"    env     {setting['name']}={setting['value']}  {setting['why']}")

    if result["libraries"]:
        lines += ["", style.paint("Target libraries", "bold")]
        rows = []
        for lib in result["libraries"]:
            if lib["installed"]:
                state = style.level("ok", lib["version"] or "installed")
            else:
                state = style.paint("not installed", "dim")
            rows.append(
                [lib["name"], state, f"{lib['applicable']}/{lib['patches']} patches applicable"]
            )
        lines.extend(table(rows, style))

    env = result["environment"]
    py, torch = env["python"], env["torch"]
    lines += ["", style.paint("Environment", "bold")]
    rows = [["python", f"{py['version']} {py['implementation']}  {py['executable']}"]]
    rows.append(["torch", torch["version"] if torch["installed"] else "not installed"])
    rows.extend(list(row) for row in result.get("environment_rows", []))
    hook = core["start_hook"]
    rows.append(["start hook", hook["path"] if hook["installed"] else "not installed"])
    cache = result["metadata_cache"]
    rows.append(["metadata cache", f"{cache['state']}  {cache['path'] or ''}".rstrip()])
    lines.extend(table(rows, style))
    shown = [v for v in env["variables"] if verbose or v["value"] is not None]
    if shown:
        lines += ["", style.paint("Variables", "bold")]
        rows = [
            [
                v["name"],
                v["value"] if v["value"] is not None else style.paint("(unset)", "dim"),
                v["meaning"] if verbose else "",
            ]
            for v in shown
        ]
        lines.extend(table(rows, style))

    findings = result["findings"]
    if findings:
        lines += ["", style.paint("Findings", "bold")]
        rows = [[style.level(f["level"]), f["code"], f["message"]] for f in findings]
        lines.extend(table(rows, style))
    counts = result["counts"]
    summary = ", ".join(
        [
            style.level("error", _plural(counts["error"], "error"))
            if counts["error"]
            else "0 errors",
            _plural(counts["warning"], "warning"),
            _plural(counts["note"], "note"),
        ]
    )
    verdict = style.level("ok", "ok") if result["ok"] else style.level("error", "problems found")
    lines += ["", f"{verdict}: {summary} ({result['elapsed_s']:.2f} s)"]
    return "\n".join(lines)
