"""Graph walks for tests: the ancestors of a row followed through ``RankGraph.deps_of``."""

from __future__ import annotations

from typing import Any


def ancestors(graph: Any, row: int) -> set[int]:
    """Every row ``row`` depends on, directly or transitively."""
    row_of = {int(v): i for i, v in enumerate(graph.id)}
    seen: set[int] = set()
    todo = [row]
    while todo:
        r = todo.pop()
        for dep, _kind in graph.deps_of(r):
            a = row_of.get(int(dep))
            if a is not None and a not in seen:
                seen.add(a)
                todo.append(a)
    return seen
