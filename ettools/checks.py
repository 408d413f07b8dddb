"""Structural checks of a trace, as plain functions returning lists of :class:`Problem`.

Per rank graph: :func:`check_unique_ids`, :func:`check_acyclic`, :func:`check_no_dangling`,
:func:`check_comm_attrs`, :func:`check_memory`. Across ranks (through :mod:`ettools.collate`):
:func:`check_collectives`, :func:`check_p2p`. :func:`verify` runs them all; :func:`assert_valid`
raises :class:`StructuralError` naming the first problem — what a rewriting pass calls after
itself ("structural proof").

Each check is O(nodes + edges) over the graph's arrays (cycle reporting walks only the nodes
left over by Kahn's algorithm). Unverifiable cross-rank items (a collective whose group has
members the trace does not carry) are not problems.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ettools.collate import match_collectives, match_p2p
from ettools.graph import CollectiveType, EdgeKind, NodeType, RankGraph, Trace, TraceMeta
from ettools.graph_algorithms import is_acyclic, structure_key, topological_sort
from ettools.lifetimes import live_bytes


@dataclass(frozen=True)
class Problem:
    """One structural defect: which check found it, on which rank and node, and what is wrong."""

    check: str
    rank: int | None
    node_id: int | None
    name: str
    message: str

    def __str__(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "trace"
        if self.node_id is not None:
            where += f" node {self.node_id}"
            if self.name:
                where += f" ({self.name})"
        return f"{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable dict."""
        return {"check": self.check, "rank": self.rank, "node_id": self.node_id, "name": self.name,
                "message": self.message}


class StructuralError(ValueError):
    """A trace failed the structural proof; ``problems`` lists every defect, the message names the first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}")


def _problem(check: str, g: RankGraph, row: int, message: str) -> Problem:
    return Problem(check, g.rank, int(g.id[row]), g.name_of(row), message)


# ---- graph order ---------------------------------------------------------------------------------

def execution_order(g: RankGraph) -> np.ndarray:
    """Rows in the order the rank ran them: by start time when every node has one, else topological.

    Ties by id; a cyclic graph's unplaceable nodes come last, in id order.
    """
    start = g.start
    if len(g) and np.isfinite(start).all():
        return np.lexsort((g.id, start))
    order, cyclic, _ = topological_sort(g)
    rest = np.flatnonzero(cyclic)
    rest = rest[np.argsort(g.id[rest], kind="stable")]
    return np.concatenate([order, rest])


# ---- per-rank checks -----------------------------------------------------------------------------

def check_unique_ids(g: RankGraph) -> list[Problem]:
    """Every node id appears once in its rank (lookups by id depend on it)."""
    ids = g.id
    o = np.argsort(ids, kind="stable")
    s = ids[o]
    dup = np.flatnonzero(s[1:] == s[:-1]) + 1
    out = []
    for j in dup.tolist():
        r = int(o[j])
        out.append(_problem("unique_ids", g, r, f"node id {int(ids[r])} is used by more than one node"))
    return out


def check_acyclic(g: RankGraph) -> list[Problem]:
    """Dependency cycles: one problem per strongly connected component that holds a cycle.

    Each names the smallest-id node of one cycle inside the component and lists the ids around
    that cycle, and says how many nodes the component has. Components come from scipy's
    strongly connected components (compiled, O(nodes + edges)).
    """
    src, dst, _ = g.edge_rows()
    ok = src >= 0
    n = len(g)
    if not n or not ok.any():
        return []
    if is_acyclic(g):
        return []  # no cycle (no scipy import)
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    m = csr_matrix((np.ones(int(ok.sum()), np.int8), (src[ok], dst[ok])), shape=(n, n))
    _, label = connected_components(m, directed=True, connection="strong")
    size = np.bincount(label, minlength=int(label.max()) + 1)
    self_loop = np.zeros(n, bool)
    self_loop[src[ok & (src == dst)]] = True
    cyclic = (size[label] > 1) | self_loop
    if not cyclic.any():
        return []
    ptr = g.dep_ptr
    ids = g.id
    problems: list[Problem] = []
    seen_comp: set[int] = set()
    for start in np.flatnonzero(cyclic).tolist():
        comp = int(label[start])
        if comp in seen_comp:
            continue
        seen_comp.add(comp)
        # walk predecessors inside the component until a node repeats: that closes a cycle
        where: dict[int, int] = {}
        path: list[int] = []
        u = start
        while u not in where:
            where[u] = len(path)
            path.append(u)
            preds = src[ptr[u]:ptr[u + 1]]
            preds = preds[preds >= 0]
            u = int(preds[label[preds] == comp][0])
        cyc = path[where[u]:][::-1]  # walked backwards; list in dependency order
        first = min(cyc, key=lambda r: int(ids[r]))
        k = cyc.index(first)
        cyc = cyc[k:] + cyc[:k]
        shown = " -> ".join(str(int(ids[r])) for r in cyc[:12])
        tail = " -> …" if len(cyc) > 12 else f" -> {int(ids[first])}"
        extra = f" (in a strongly connected set of {int(size[comp])} nodes)" if size[comp] > len(cyc) else ""
        problems.append(_problem("acyclic", g, first,
                                 f"dependency cycle of {len(cyc)} nodes: {shown}{tail}{extra}"))
    return problems


def check_no_dangling(g: RankGraph) -> list[Problem]:
    """Dependencies naming a node id absent from the rank: one problem per such edge."""
    src, dst, kind = g.edge_rows()
    bad = np.flatnonzero(src < 0)
    out = []
    for e in bad.tolist():
        r = int(dst[e])
        out.append(_problem("dangling", g, r, f"depends on node id {int(g.dep_id[e])}, which is not in "
                            f"this rank ({EdgeKind(int(kind[e])).name} edge)"))
    return out


def check_comm_attrs(g: RankGraph, meta: TraceMeta) -> list[Problem]:
    """Communication nodes carry what a simulator needs.

    COMM_COLL: a valid ``comm_type``, ``comm_bytes`` ≥ 0, a process group declared in ``meta``
    with this rank among its members. SEND/RECV: a peer rank in the world (not this rank), a tag
    (≥ 0), ``comm_bytes`` ≥ 0. One problem per node, listing everything it lacks.
    """
    t = g.type
    out: list[Problem] = []
    coll = np.flatnonzero(t == NodeType.COMM_COLL_NODE)
    if len(coll):
        ctype = g.comm_type[coll].astype(np.int64)
        cbytes = g.comm_bytes[coll]
        gid = g.comm_group[coll]
        bad_type = (ctype < 0) | (ctype >= len(CollectiveType))
        bad_bytes = cbytes < 0
        # group validity per distinct group id
        ugid, inv = np.unique(gid, return_inverse=True)
        gmsg = []
        for gi in ugid.tolist():
            if gi < 0:
                gmsg.append("no process group (pg_name)")
                continue
            name = g.strings[gi]
            pg = meta.process_groups.get(name)
            if pg is None:
                gmsg.append("" if name in ("", "0") else f"process group {name!r} is not declared")
            elif g.rank not in pg.ranks:
                gmsg.append(f"rank {g.rank} is not a member of process group {name!r}")
            else:
                gmsg.append("")
        gbad = np.array([bool(m) for m in gmsg], bool)[inv]
        for j in np.flatnonzero(bad_type | bad_bytes | gbad).tolist():
            msgs = []
            if bad_type[j]:
                msgs.append("no comm_type" if ctype[j] < 0 else f"invalid comm_type {int(ctype[j])}")
            if bad_bytes[j]:
                msgs.append("no comm_size")
            if gbad[j]:
                msgs.append(gmsg[int(inv[j])])
            out.append(_problem("comm_attrs", g, int(coll[j]), "COMM_COLL node: " + "; ".join(msgs)))
    p2p = np.flatnonzero((t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE))
    if len(p2p):
        peer = g.comm_peer[p2p].astype(np.int64)
        tag = g.comm_tag[p2p]
        nbytes = g.comm_bytes[p2p]
        world = max(meta.world_size, g.rank + 1)
        bad_peer = (peer < 0) | (peer >= world) | (peer == g.rank)
        bad = bad_peer | (tag < 0) | (nbytes < 0)
        for j in np.flatnonzero(bad).tolist():
            r = int(p2p[j])
            kind = "SEND" if t[r] == NodeType.COMM_SEND_NODE else "RECV"
            msgs = []
            if peer[j] < 0:
                msgs.append("no peer rank")
            elif bad_peer[j]:
                msgs.append(f"peer rank {int(peer[j])} is " + ("this rank" if peer[j] == g.rank
                                                                else f"outside the world of {world}"))
            if tag[j] < 0:
                msgs.append("no tag")
            if nbytes[j] < 0:
                msgs.append("no comm_size")
            out.append(_problem("comm_attrs", g, r, f"COMM_{kind} node: " + "; ".join(msgs)))
    return out


# ---- memory --------------------------------------------------------------------------------------

def peak_memory(g: RankGraph) -> tuple[int, int]:
    """``(peak live bytes, row at which the peak is reached)`` from the graph's tensor lifetimes.

    Nodes run one at a time in :func:`execution_order`; lifetimes as :mod:`ettools.lifetimes`
    defines them (resident storages — first use a read — live throughout; the device's tensors
    only). A graph without tensors gives ``(0, -1)``.
    """
    n = len(g)
    pos = np.empty(n, np.int64)
    pos[execution_order(g)] = np.arange(n)
    lb = live_bytes(g, pos)
    if lb is None:
        return 0, -1
    return lb.peak_bytes, lb.peak_row


def check_memory(g: RankGraph, device_bytes: int) -> list[Problem]:
    """Peak live tensor bytes (:func:`peak_memory`) must not exceed ``device_bytes``."""
    peak, row = peak_memory(g)
    if peak <= device_bytes:
        return []
    return [_problem("memory", g, row, f"peak live tensor memory {peak:,} B exceeds the device's "
                     f"{device_bytes:,} B")]


# ---- cross-rank ----------------------------------------------------------------------------------

def _from_report(check: str, trace: Trace, rep: Any) -> list[Problem]:
    return [Problem(check, u.rank, u.node_id, u.name, u.reason) for u in rep.unmatched]


def check_collectives(trace: Trace) -> list[Problem]:
    """Every collective present on every present member of its group, same order, type and bytes."""
    return _from_report("collectives", trace, match_collectives(trace))


def check_p2p(trace: Trace) -> list[Problem]:
    """Every send paired with exactly one recv (peer, tag, order, bytes) and vice versa."""
    return _from_report("p2p", trace, match_p2p(trace))


def verify(trace: Trace, device_bytes: int | None = None) -> list[Problem]:
    """All checks over all ranks (memory only when ``device_bytes`` is given); [] means valid."""
    problems: list[Problem] = []
    done: dict[tuple, tuple[int, list[Problem]]] = {}
    for g in trace:
        # rank-independent checks once per shared structure, relabelled for the other ranks
        key = structure_key(g)
        if device_bytes is not None:
            key += (id(g.start), id(g.tensors), id(g.in_tensor), id(g.out_tensor))
        hit = done.get(key)
        if hit is None:
            found = check_unique_ids(g) + check_acyclic(g) + check_no_dangling(g)
            if device_bytes is not None:
                found += check_memory(g, device_bytes)
            done[key] = (g.rank, found)
        else:
            found = [replace(p, rank=g.rank) for p in hit[1]]
        problems += found
        problems += check_comm_attrs(g, trace.meta)
    problems += check_collectives(trace)
    problems += check_p2p(trace)
    return problems


def assert_valid(trace: Trace, device_bytes: int | None = None) -> None:
    """Raise :class:`StructuralError` (naming the first problem's rank and node) unless :func:`verify` is clean."""
    problems = verify(trace, device_bytes)
    if problems:
        raise StructuralError(problems)
