"""The import-cycle finder the architecture tests share (this directory is on sys.path:
tests/conftest.py). test_architecture runs it over every package's import-time edges,
test_architecture_layers over the core's graph of every edge kind."""

from __future__ import annotations

from collections.abc import Mapping


__all__ = ["find_cycles"]


def find_cycles(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan; the graphs are small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)

    cycles = []
    for component in components:
        start, members = component[0], set(component)
        paths = {start: [start]}
        queue = [start]
        while queue:  # breadth first: the shortest way back to start inside the component
            node = queue.pop(0)
            for nxt in sorted(graph[node]):
                if nxt == start:
                    cycles.append([*paths[node], start])
                    queue = []
                    break
                if nxt in members and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    queue.append(nxt)
    return cycles
