"""Graph algorithms of the graph model: plain functions over a rank graph's dependency arrays.

:func:`topological_sort` (Kahn's algorithm, optionally with an ASAP schedule in the same pass),
:func:`is_acyclic` (the same answer about cycles, sorting only where one can be) and
:func:`structure_key` (which ranks share their dependency arrays). This module sits below
:mod:`ettools.graph` (whose :meth:`RankGraph.topological_order` calls it) and the analyses built
on the graph (:mod:`ettools.checks`, :mod:`ettools.collate`, …): it knows a graph only through
the few members in :class:`GraphArrays`, which :class:`ettools.graph.RankGraph` has.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class GraphArrays(Protocol):
    """What these algorithms read of a :class:`ettools.graph.RankGraph`."""

    columns: dict[str, np.ndarray]
    dep_ptr: np.ndarray
    dep_id: np.ndarray
    dep_kind: np.ndarray

    def __len__(self) -> int: ...

    def edge_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def structure_key(g: GraphArrays) -> tuple[int, ...]:
    """Identity of the arrays a graph's node ids and dependencies live in.

    Ranks stamped out from one graph (:meth:`RankGraph.with_rank`, shared columns) have equal keys,
    so rank-independent results (cycles, dangling edges, topological order) are computed once per
    key. Valid while the graphs are alive (it is built from ``id()`` of their arrays).
    """
    return (id(g.columns["id"]), id(g.dep_ptr), id(g.dep_id), id(g.dep_kind))


_WIDE = 64  # frontier size below which Kahn's algorithm continues node by node in Python


def _successors(g: GraphArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(succ_ptr, succ, indeg)``: successors of each row as CSR, and in-degrees (dangling edges ignored)."""
    n = len(g)
    src, dst, _ = g.edge_rows()
    ok = src >= 0
    src, dst = src[ok], dst[ok]
    order = np.argsort(src, kind="stable")
    succ_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
    return succ_ptr, dst[order], np.bincount(dst, minlength=n).astype(np.int64)


def topological_sort(g: GraphArrays, dur: np.ndarray | None = None, start: np.ndarray | None = None,
                     origin: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Kahn's algorithm: ``(order, cyclic, asap)``.

    ``order`` lists the rows every one of whose dependencies comes earlier; ``cyclic`` marks the
    rows it cannot place (on or after a dependency cycle) — all False iff ``g`` is acyclic.
    Dangling edges are ignored. Given ``dur`` (NaN = 0), ``asap`` is an ASAP schedule computed in
    the same pass: each row in ``order`` starts at ``start`` when that is given and not NaN, else
    when its last dependency ends, and not before ``origin``; rows in ``cyclic`` get NaN.

    O(nodes + edges): whole waves of ready nodes are processed with numpy while they are wide;
    narrow stretches (long chains such as a stream's ORDER edges) continue node by node in Python,
    where a numpy call per wave would cost more than the wave's work.
    """
    n = len(g)
    succ_ptr, succ, indeg = _successors(g)
    sched = dur is not None
    if sched:
        d = np.maximum(np.nan_to_num(np.asarray(dur, np.float64), nan=0.0), 0.0)
        given = np.full(n, np.nan) if start is None else np.asarray(start, np.float64)
        ready = np.full(n, float(origin))
        asap = np.full(n, np.nan)
    out: list[np.ndarray] = []
    frontier = np.flatnonzero(indeg == 0)
    while len(frontier) >= _WIDE:
        out.append(frontier)
        if sched:
            gv = given[frontier]
            asap[frontier] = np.where(np.isnan(gv), ready[frontier], gv)
        starts, ends = succ_ptr[frontier], succ_ptr[frontier + 1]
        lens = ends - starts
        total = int(lens.sum())
        if total == 0:
            frontier = frontier[:0]
            break
        offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(total)
        targets = succ[offs]
        if sched:
            np.maximum.at(ready, targets, np.repeat(asap[frontier] + d[frontier], lens))
        np.subtract.at(indeg, targets, 1)
        cand = np.unique(targets)
        frontier = cand[indeg[cand] == 0]
    if len(frontier):
        # narrow: finish node by node (a FIFO queue keeps the order close to the waves')
        from collections import deque

        ptr_l, succ_l, indeg_l = succ_ptr.tolist(), succ.tolist(), indeg.tolist()
        queue = deque(frontier.tolist())
        rest: list[int] = []
        if sched:
            ready_l, d_l, given_l = ready.tolist(), d.tolist(), given.tolist()
            asap_l = asap.tolist()
        while queue:
            u = queue.popleft()
            rest.append(u)
            if sched:
                gu = given_l[u]
                su = ready_l[u] if gu != gu else gu  # NaN check
                asap_l[u] = su
                eu = su + d_l[u]
            for k in range(ptr_l[u], ptr_l[u + 1]):
                v = succ_l[k]
                if sched and eu > ready_l[v]:
                    ready_l[v] = eu
                indeg_l[v] -= 1
                if indeg_l[v] == 0:
                    queue.append(v)
        out.append(np.asarray(rest, np.int64))
        if sched:
            asap = np.asarray(asap_l, np.float64)
    order = np.concatenate(out) if out else np.zeros(0, np.int64)
    cyclic = np.ones(n, bool)
    cyclic[order] = False
    return order, cyclic, (asap if sched else None)


class _Edges:
    """A graph given by its edges alone (rows ``0..n-1``), for :func:`topological_sort`."""

    def __init__(self, n: int, src: np.ndarray, dst: np.ndarray) -> None:
        self._n, self._src, self._dst = n, src, dst

    def __len__(self) -> int:
        return self._n

    def edge_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._src, self._dst, np.zeros(len(self._src), np.uint8)


def is_acyclic(g: GraphArrays) -> bool:
    """Whether ``g``'s dependencies (dangling edges ignored) form no cycle — what
    ``not topological_sort(g)[1].any()`` says, without sorting the whole graph.

    A cycle steps down in row order somewhere, and between its lowest and highest row it crosses
    every row downward, each time on a *backward* edge ``u -> v`` (``v <= u``: it covers rows
    ``v..u``). So every cycle lies inside one stretch of rows that overlapping backward edges cover,
    with all its edges inside it; only those stretches are sorted. Graphs whose rows follow their
    dependencies but for a few local back references (as synthesized and converted graphs do) cost
    a pass over the edges.
    """
    src, dst, _ = g.edge_rows()
    ok = src >= 0
    src, dst = src[ok], dst[ok]
    back = src >= dst
    if not back.any():
        return True
    lo, hi = dst[back], src[back]
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], hi[o]
    reach = np.maximum.accumulate(hi)
    first = np.ones(len(lo), bool)
    first[1:] = lo[1:] > reach[:-1]  # a stretch starts where no earlier backward edge reaches
    heads = np.flatnonzero(first)
    starts, ends = lo[heads], np.maximum.reduceat(hi, heads)
    sizes = ends - starts + 1
    offset = np.concatenate(([0], np.cumsum(sizes)[:-1]))

    def stretch(rows: np.ndarray) -> np.ndarray:
        """The stretch holding each row, -1 outside every stretch."""
        k = np.searchsorted(starts, rows, "right") - 1
        inside = (k >= 0) & (rows <= ends[np.maximum(k, 0)])
        return np.where(inside, k, -1)

    ks, kd = stretch(src), stretch(dst)
    keep = (ks >= 0) & (ks == kd)
    local = _Edges(int(sizes.sum()), src[keep] - starts[ks[keep]] + offset[ks[keep]],
                   dst[keep] - starts[kd[keep]] + offset[kd[keep]])
    return not topological_sort(local)[1].any()
