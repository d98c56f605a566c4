"""``ascend-patch suggest``: the plugins that would serve the libraries installed here.

Like ``opentelemetry-bootstrap``: transformers is installed and ascend-patch-transformers
is not, so say so, with the pip command that installs it where the user is (from
their clone, when the core came from one: :mod:`.install_advice`). The table of
which plugin serves which library is data, ``known_plugins.json`` next to this
module, in one place. Everything is read from distribution metadata: no plugin and
no library is imported.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .._discovery.metadata import MetadataCache


__all__ = ["SCHEMA", "doctor_findings", "known_plugins", "render", "suggest"]

SCHEMA = "ascend-patch-suggest/1"
_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "known_plugins.json")


def known_plugins() -> list[dict[str, Any]]:
    """The rows of ``known_plugins.json``: distribution, entry_point, directory, libraries."""
    with open(_TABLE, encoding="utf-8") as fh:
        rows: list[dict[str, Any]] = json.load(fh)["plugins"]
    return rows


def suggest(meta: MetadataCache | None = None) -> dict[str, Any]:
    """The ``ascend-patch-suggest/1`` object: per known plugin whose libraries are
    installed here, those libraries, whether the plugin is installed, and the command."""
    from .install_advice import pip_install

    meta = meta or MetadataCache(persistent=False)
    plugins = []
    for row in known_plugins():
        libraries = [
            {"name": name, "version": version}
            for name in row["libraries"]
            if (version := meta.version(name)) is not None
        ]
        if not libraries:
            continue
        installed = meta.version(row["distribution"])
        plugins.append(
            {
                "plugin": row["distribution"],
                "entry_point": row["entry_point"],
                "installed": installed,
                "libraries": libraries,
                "command": None
                if installed
                else pip_install((row["distribution"], row["directory"])),
            }
        )
    missing = [p for p in plugins if p["installed"] is None]
    by_name = {row["distribution"]: row for row in known_plugins()}
    return {
        "schema": SCHEMA,
        "plugins": plugins,
        "missing": [p["plugin"] for p in missing],
        "command": pip_install(*((p["plugin"], by_name[p["plugin"]]["directory"]) for p in missing))
        if missing
        else None,
    }


def _libraries(plugin: dict[str, Any]) -> str:
    return ", ".join(f"{lib['name']} {lib['version']}" for lib in plugin["libraries"])


def render(result: dict[str, Any]) -> str:
    plugins = result["plugins"]
    if not plugins:
        known = sorted({lib for row in known_plugins() for lib in row["libraries"]})
        return (
            "No installed library has an ascend-patch plugin (plugins exist for: "
            f"{', '.join(known)})."
        )
    lines = ["Installed libraries and the ascend-patch plugins that serve them:"]
    width = max(len(_libraries(p)) for p in plugins)
    name_width = max(len(p["plugin"]) for p in plugins)
    for p in plugins:
        state = f"installed ({p['installed']})" if p["installed"] else "NOT installed"
        lines.append(f"  {_libraries(p):<{width}}  ->  {p['plugin']:<{name_width}}  {state}")
    if result["command"]:
        lines += ["", "To install the missing plugins:", f"  {result['command']}"]
    else:
        lines += ["", "Every plugin these libraries need is installed."]
    return "\n".join(lines)


def doctor_findings(meta: MetadataCache) -> list[tuple[str, str]]:
    """(code, message) notes for doctor: one per plugin that would serve a library here."""
    return [
        (
            "plugin-suggested",
            f"{_libraries(p)} {'is' if len(p['libraries']) == 1 else 'are'} installed but "
            f"{p['plugin']}, which patches {'it' if len(p['libraries']) == 1 else 'them'} "
            f"for the NPU, is not: {p['command']}",
        )
        for p in suggest(meta)["plugins"]
        if p["installed"] is None
    ]
