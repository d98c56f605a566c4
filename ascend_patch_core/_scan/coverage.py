"""What covers a finding of ``ascend-patch scan``: the installed plugins' declarations, indexed.

Coverage is decided from declarations alone (see docs/cli-reference.md, "What covers a
finding"): a finding is covered when a patch targets one of its *candidate*
targets (or an object containing or contained in it), or an import rule serves
its module. A candidate is also looked up where the installed library defines it
(:mod:`.library`), so ``torch.cuda.amp.GradScaler`` is judged by the patch of
``torch.amp.grad_scaler.GradScaler.__init__`` that the run applies; a module is
covered when something in it is, including the names it exports from elsewhere, so
``from torch.cuda import amp`` is judged by its ``GradScaler`` and ``autocast``. A device value
consumed elsewhere is covered when each of its uses is (:mod:`.values`).
Module hooks only ever *possibly* cover a finding.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from .._engine.declarations import Inventory
from .library import Definition
from .library import LibrarySource
from .rules import matches_module


__all__ = ["CoverageIndex"]

#: How deep into a package's submodules a module's verdict looks.
_MAX_MODULE_DEPTH = 4


class CoverageIndex:
    """The installed plugins' declarations, indexed for finding what covers a target."""

    def __init__(self, inventory: Inventory | None) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.hooks: list[tuple[str, dict[str, Any]]] = []
        self.rules: list[tuple[str, str | None, dict[str, Any]]] = []
        self._library: LibrarySource | None = None
        #: Module name -> what covers something in it (see _in_module).
        self._modules: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {}
        if inventory is None:
            return
        for patch in inventory.patches():
            if patch.verdict is not None:
                # Disabled, an opt-in group not enabled, a broken declaration: the run
                # would not apply it, so it covers nothing. (A library missing here is
                # another machine's question: doctor's, not scan's.)
                continue
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

    def judge(
        self, candidates: Iterable[str], uses: Iterable[Iterable[str]] = ()
    ) -> tuple[bool, list[dict[str, Any]], list[dict[str, Any]]]:
        """Whether a finding is covered, what covers it, and which module hooks might.

        Covered by a candidate, or -- for a device value -- by covering every use.
        """
        covered_by, possibly = self.covering(candidates)
        groups = [self.covering(group) for group in uses]
        by_uses = bool(groups) and all(found for found, _ in groups)
        if by_uses:
            covered_by += [entry for found, _ in groups for entry in found]
        possibly += [entry for _, maybe in groups for entry in maybe]
        return (
            bool(covered_by),
            _unique(covered_by),
            _unique(possibly),
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
        for literal in candidates:
            before = len(found)
            for candidate in (Definition(literal), *self._definitions(literal)):
                self._match(candidate, found)
            if len(found) == before and (self.patches or self.rules):
                for key, entry in self._in_module(literal, 0).items():
                    found.setdefault(key, entry)
            containers = _containers(literal)
            for pattern, entry in self.hooks:
                if any(fnmatch.fnmatchcase(c, pattern) for c in containers):
                    possible.setdefault((entry["plugin"], pattern), entry)
        return [_public(e) for e in found.values()], [_public(e) for e in possible.values()]

    def _definitions(self, name: str) -> tuple[Definition, ...]:
        return self._source().definitions(name)

    def _in_module(self, name: str, depth: int) -> dict[tuple[str, str, str], dict[str, Any]]:
        """What covers something the module ``name`` exports (nothing if it is no module).

        A module is covered, as ``import torch.cuda`` is by the patches of the functions
        in it, when something in it is -- including what it exports from elsewhere,
        judged where that is defined (``torch.cuda.amp.GradScaler``), and its submodules.
        """
        known = self._modules.get(name)
        if known is not None:
            return known
        self._modules[name] = {}  # while under way: a package exporting itself is no loop
        found: dict[tuple[str, str, str], dict[str, Any]] = {}
        members = self._source().exports(name) if depth <= _MAX_MODULE_DEPTH else ()
        for member in members:
            for candidate in (Definition(member), *self._definitions(member)):
                self._match(candidate, found)
        for member in members if not found else ():
            found.update(self._in_module(member, depth + 1))
            if found:
                break
        self._modules[name] = found
        return found

    def _source(self) -> LibrarySource:
        if self._library is None:
            self._library = LibrarySource()
        return self._library

    def _match(
        self, candidate: Definition, found: dict[tuple[str, str, str], dict[str, Any]]
    ) -> None:
        name = candidate.name
        inside_counts = candidate.role != "base"
        for target, entry in self.patches:
            if matches_module(name, target) or (inside_counts and target.startswith(name + ".")):
                found.setdefault((entry["plugin"], entry["kind"], target), entry)
        for kind, attribute, entry in self.rules:
            module = entry["module"]
            hit = (
                name == f"{module}.{attribute}"
                if kind == "inject"
                else matches_module(name, module)
            )
            if hit:
                found.setdefault((entry["plugin"], "rule", entry["name"]), entry)


def _unique(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for entry in entries:
        seen.setdefault((entry["plugin"], entry["kind"], entry["target"], entry["name"]), entry)
    return list(seen.values())


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "module"}


def _containers(name: str) -> list[str]:
    """Modules that may define ``name``: its strict prefixes, the top-level package only for ``pkg.attr``."""
    parts = name.split(".")
    first = 1 if len(parts) == 2 else 2
    return [".".join(parts[:i]) for i in range(first, len(parts))]
