"""Repairs of a foreign graph's dependency defects that have one sound answer.

A dependency that names a node id absent from its rank (*dangling*) constrains nothing the rank
can run, and a node that depends on itself (*self-dependency*) can never start: dropping such an
edge is the only repair, and it changes nothing else. A dependency cycle through two or more
distinct nodes has no such repair (which edge is wrong is not in the file): :func:`find_cycles`
names them so a writer can refuse. Real Chakra conversions hold all three (Chakra's own converter
left 1,277 dangling dependencies, 383 self-dependencies and 417 cycles in ``resnet_converted.0.et``).

Both passes are columnar, O(nodes + edges) with numpy (cycles through scipy's compiled strongly
connected components), and run once per shared structure: ranks stamped out from one graph keep
sharing their arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ettools.checks import Problem, check_acyclic, structure_key
from ettools.graph import RankGraph, Trace


@dataclass
class Repairs:
    """What :func:`drop_unsound_deps` / :func:`repair_trace` removed, summed over ranks."""

    dangling: int = 0  # dependencies naming a node id not in the rank
    self_deps: int = 0  # dependencies of a node on itself

    def __bool__(self) -> bool:
        return bool(self.dangling or self.self_deps)


def drop_unsound_deps(g: RankGraph) -> tuple[RankGraph, Repairs]:
    """``g`` without its dangling dependencies and self-dependencies, and how many each.

    Every other edge keeps its order and kind; node columns, attributes and tensors are shared with
    ``g`` (not copied). A graph with nothing to drop is returned as it is.
    """
    src, dst, _ = g.edge_rows()
    dangling = src < 0
    self_dep = src == dst  # dst is never -1, so this is a present node depending on itself
    drop = dangling | self_dep
    rep = Repairs(int(dangling.sum()), int(self_dep.sum()))
    if not rep:
        return g, rep
    keep = ~drop
    n = len(g)
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst[keep], minlength=n), out=dep_ptr[1:])  # edges are stored owner-major
    h = RankGraph(
        g.rank, g.strings, g.columns, dep_ptr, g.dep_id[keep], g.dep_kind[keep], dict(g.attrs),
        g.tensors, g.in_ptr, g.in_tensor, g.out_ptr, g.out_tensor, dict(g.meta),
    )
    return h, rep


def repair_trace(trace: Trace) -> tuple[Trace, Repairs]:
    """:func:`drop_unsound_deps` on every rank; counts are summed over ranks.

    Ranks sharing their id and dependency arrays are repaired once and keep sharing the repaired
    arrays (so a writer still encodes them once).
    """
    total = Repairs()
    done: dict[tuple, tuple[RankGraph, Repairs]] = {}
    graphs: dict[int, RankGraph] = {}
    for r, g in trace.graphs.items():
        key = structure_key(g)
        hit = done.get(key)
        if hit is None:
            h, rep = drop_unsound_deps(g)
            done[key] = (h, rep)
        else:
            first, rep = hit
            h = g if not rep else RankGraph(  # this rank's columns, the repaired shared edges
                g.rank, g.strings, g.columns, first.dep_ptr, first.dep_id, first.dep_kind, dict(g.attrs),
                g.tensors, g.in_ptr, g.in_tensor, g.out_ptr, g.out_tensor, dict(g.meta),
            )
        graphs[r] = h
        total.dangling += rep.dangling
        total.self_deps += rep.self_deps
    if not total:
        return trace, total
    return Trace(trace.meta, graphs, trace.strings), total


def find_cycles(trace: Trace) -> list[Problem]:
    """The dependency cycles of every rank (:func:`ettools.checks.check_acyclic`: one problem per
    strongly connected set, naming one cycle in it), checked once per shared structure."""
    out: list[Problem] = []
    done: dict[tuple, list[Problem]] = {}
    for r in trace.ranks:
        g = trace.graphs[r]
        key = structure_key(g)
        found = done.get(key)
        if found is None:
            found = done[key] = check_acyclic(g)
            out += found
        else:
            out += [replace(p, rank=g.rank) for p in found]
    return out
