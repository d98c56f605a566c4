"""What covers a finding of ``ascend-patch scan``: the installed plugins' declarations, indexed.

Coverage is decided from declarations alone (see docs/cli.md, "What covers a
finding"): a finding is covered when a patch targets one of its *candidate*
targets (or an object containing or contained in it), or an import rule serves
its module. Module hooks only ever *possibly* cover one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from ._declarations import Inventory
from ._scan_rules import matches_module


__all__ = ["CoverageIndex"]


class CoverageIndex:
    """The installed plugins' declarations, indexed for finding what covers a target."""

    def __init__(self, inventory: Inventory | None) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.hooks: list[tuple[str, dict[str, Any]]] = []
        self.rules: list[tuple[str, str | None, dict[str, Any]]] = []
        if inventory is None:
            return
        for patch in inventory.patches():
            entry = {
                "plugin": patch.plugin,
                "kind": patch.kind,
                "name": patch.name,
                "applicable": patch.applicable,
            }
            if patch.kind == "hook":
                self.hooks.append((patch.target, {**entry, "target": patch.target}))
            elif patch.kind == "patch":
                for target in (patch.target, *patch.aliases):
                    self.patches.append((target, {**entry, "target": target}))
        for rule in inventory.rules():
            entry = {
                "plugin": rule.plugin,
                "kind": "rule",
                "name": rule.description,
                "target": rule.module,
            }
            self.rules.append(
                (rule.kind, rule.attribute, {**entry, "module": rule.module, "applicable": True})
            )

    def covering(
        self, candidates: Iterable[str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """What covers these candidate targets, and which module hooks might.

        A module hook's patches exist only once its module is imported, so a hook whose
        pattern matches a module that may contain the target is reported as a possibility,
        never counted as coverage.
        """
        found: dict[tuple[str, str, str], dict[str, Any]] = {}
        possible: dict[tuple[str, str], dict[str, Any]] = {}
        for candidate in candidates:
            for target, entry in self.patches:
                if matches_module(candidate, target) or target.startswith(candidate + "."):
                    found.setdefault((entry["plugin"], entry["kind"], target), entry)
            for kind, attribute, entry in self.rules:
                module = entry["module"]
                hit = (
                    candidate == f"{module}.{attribute}"
                    if kind == "inject"
                    else matches_module(candidate, module)
                )
                if hit:
                    found.setdefault((entry["plugin"], "rule", entry["name"]), entry)
            containers = _containers(candidate)
            for pattern, entry in self.hooks:
                if any(fnmatch.fnmatchcase(c, pattern) for c in containers):
                    possible.setdefault((entry["plugin"], pattern), entry)
        return [_public(e) for e in found.values()], [_public(e) for e in possible.values()]


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "module"}


def _containers(name: str) -> list[str]:
    """Modules that may define ``name``: its strict prefixes, the top-level package only for ``pkg.attr``."""
    parts = name.split(".")
    first = 1 if len(parts) == 2 else 2
    return [".".join(parts[:i]) for i in range(first, len(parts))]
