"""``after=``: linking planned entries to what they name, cycles, dependency order.

Loaded by the planner when a plan has ``after=`` names (most have none). Every step
costs what the links are: names are found through the ledger's index, cycles in one
pass (Tarjan's components), the order by one depth-first walk, neither recursive,
so ``add()`` one patch at a time and chains thousands long stay linear.
"""

from __future__ import annotations

from collections.abc import Iterator

from .._model.report import FAILED
from .._model.report import REVERTED
from .entries import Entry
from .entries import Ledger


__all__ = ["cycle_members", "dependency_order", "link_dependencies"]


def link_dependencies(
    entries: list[Entry], ledger: Ledger, missing_after: list[tuple[Entry, str]]
) -> list[Entry]:
    """Link each entry to what its ``after=`` names (in ``entries`` and ``ledger``); fail
    unknown names and cycles; return ``entries`` in dependency order.

    Unknown names also go to ``missing_after`` as (entry, name).
    """
    new_names: dict[str, list[Entry]] = {}
    for entry in entries:
        for name in entry.names:
            new_names.setdefault(name, []).append(entry)
    for entry in entries:
        linked: set[int] = set()
        for name in entry.after:
            with ledger.lock:  # the ledger's entries by name: planned before, still live
                old = [d for d in ledger.named((name,)) if d.status is not REVERTED]
            candidates = old + new_names.get(name, [])
            found = [
                d
                for d in candidates
                if d is not entry and not (name == entry.group and d.group == entry.group)
            ]
            if not found:
                missing_after.append((entry, name))
                if entry.open:
                    entry.record.set(
                        FAILED, f"after={name!r} names no patch or group of this patcher"
                    )
                break
            for dep in found:
                if id(dep) not in linked:
                    linked.add(id(dep))
                    entry.depends_on(dep)
    # A dependency cycle can never be satisfied: fail its members instead of waiting
    # forever. (Only this plan's entries can close one: earlier ones never depend on them.)
    cyclic = cycle_members(entries)
    for entry in entries:
        if entry.open and id(entry) in cyclic:
            entry.record.set(FAILED, "dependency cycle through 'after'")
    return dependency_order(entries)


def cycle_members(entries: list[Entry]) -> set[int]:
    """ids of the entries that lie on a dependency cycle among ``entries``.

    Tarjan's strongly connected components, without recursion: one pass over the
    links, so a plan costs what its ``after=`` links are, however long their chains
    (a walk from every entry cost the square of a chain's length).
    """
    members = {id(e) for e in entries}
    number: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[Entry] = []
    on_stack: set[int] = set()
    found: set[int] = set()
    for root in entries:
        if id(root) in number or not root.deps:
            continue
        number[id(root)] = low[id(root)] = len(number)
        stack.append(root)
        on_stack.add(id(root))
        work: list[tuple[Entry, Iterator[Entry]]] = [(root, iter(root.deps))]
        while work:
            node, deps = work[-1]
            for dep in deps:
                key = id(dep)
                if key not in members:
                    continue
                if key not in number:
                    number[key] = low[key] = len(number)
                    stack.append(dep)
                    on_stack.add(key)
                    work.append((dep, iter(dep.deps)))
                    break
                if key in on_stack:
                    low[id(node)] = min(low[id(node)], number[key])
            else:
                work.pop()
                if work:
                    parent = id(work[-1][0])
                    low[parent] = min(low[parent], low[id(node)])
                if low[id(node)] == number[id(node)]:
                    component: list[int] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(id(member))
                        component.append(id(member))
                        if member is node:
                            break
                    if len(component) > 1:  # an entry never depends on itself
                        found.update(component)
    return found


def dependency_order(entries: list[Entry]) -> list[Entry]:
    """Stable topological order: declaration order, except that dependencies come first.

    Depth first without recursion (a chain of ``after=`` may be thousands long).
    """
    if not any(entry.deps for entry in entries):
        return entries
    ordered: list[Entry] = []
    placed: set[int] = set()
    members = {id(e) for e in entries}
    for entry in entries:
        if id(entry) in placed:
            continue
        trail = {id(entry)}  # entered from this root: a cycle is not followed twice
        work: list[tuple[Entry, Iterator[Entry]]] = [(entry, iter(entry.deps))]
        while work:
            node, deps = work[-1]
            for dep in deps:
                key = id(dep)
                if key in members and key not in placed and key not in trail:
                    trail.add(key)
                    work.append((dep, iter(dep.deps)))
                    break
            else:
                work.pop()
                placed.add(id(node))
                ordered.append(node)
    return ordered
