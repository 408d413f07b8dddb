"""The forms a trace is written in so ASTRA-sim runs it as ettools replays it: one host chain per
rank (:func:`one_host_chain`), rank skew as a leading release node, a trailing end node where
ASTRA-sim's end-of-rank statistics could abort the run, collectives it does not simulate lowered
to the family ettools times them as; and what keeps a written set from running there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.graph import (
    COMM_NODE_TYPES,
    NODE_COLUMNS,
    CollectiveType,
    EdgeKind,
    NodeType,
    RankGraph,
    Trace,
    structure_identity,
)

from .metadata import LAUNCH_TYPICAL_META
from .paths import format_rank_list
from .times import _time_us

# ---- ASTRA-sim's host model: one CPU node at a time per rank ------------------------------------
HOST_CHAIN_META = "astrasim_host_chain"  # RankGraph.meta: set on graphs already made one host chain


def one_host_chain(g: RankGraph) -> RankGraph:
    """The rank with the host work ASTRA-sim can run as ettools replays it.

    ASTRA-sim runs one CPU node of a rank at a time, whatever thread it came from, and rejects
    communication nodes marked as CPU ops. So: comm nodes get ``is_cpu_op = 0`` (their host thread
    still waits for them through its own dependencies); and when CPU nodes come from several
    threads, they are merged into one chain in end order made consistent with every dependency
    (:func:`_dependency_order`; each depends on the one before it,
    an ORDER edge written as a ctrl dependency). An idle ``host_gap`` node of one thread that
    other threads' work covered keeps only the part of its interval no earlier chain node
    covered (in a single chain, the other threads' work already fills it). The replay of the
    result (one lane's worth of host work) and ASTRA-sim's then run the same host timeline.
    Returns ``g`` itself when nothing changes.
    """
    if g.meta.get(HOST_CHAIN_META):
        return g
    c = g.columns
    t = c["type"]
    cpu = c["is_cpu_op"] == 1
    comm_cpu = cpu & np.isin(t, [int(x) for x in COMM_NODE_TYPES])
    host = cpu & ~comm_cpu & (t != NodeType.METADATA_NODE) & (t != NodeType.INVALID_NODE)
    rows = np.flatnonzero(host)
    threads = np.unique(c["resource"][rows]) if len(rows) else rows
    # A rank with device work keeps its threads: their concurrency feeds the device streams, and a
    # conversion must replay like its source (the chain would serialize real overlap). Host-only
    # ranks (CPU/gloo captures) become one chain.
    device = (~cpu & (t == NodeType.COMP_NODE)).any()
    if device:
        threads = threads[:1]
    if not comm_cpu.any() and len(threads) <= 1:
        return g
    cols: dict[str, np.ndarray] = {}
    if comm_cpu.any():
        cols["is_cpu_op"] = np.where(comm_cpu, 0, c["is_cpu_op"]).astype(c["is_cpu_op"].dtype)
    out = g.replace(**cols)
    if len(threads) > 1:
        start = c["start"][rows]
        dur = np.nan_to_num(c["dur"][rows], nan=0.0)
        key = _dependency_order(g)
        if key is None:  # the graph has a cycle already: leave the threads as they are
            out.meta[HOST_CHAIN_META] = True
            return out
        o = np.argsort(key[rows], kind="stable")
        chain = rows[o]
        s, d = start[o], dur[o]
        end = s + d
        frontier = np.maximum.accumulate(np.concatenate(([-np.inf], end[:-1])))
        gap_sid = g.strings.lookup("host_gap")
        if gap_sid >= 0:
            is_gap = c["name"][chain] == gap_sid
            if is_gap.any():
                covered = np.maximum(end - np.maximum(s, frontier), 0.0)
                new_dur = c["dur"].copy()
                new_dur[chain[is_gap]] = np.where(np.isfinite(s[is_gap]), covered[is_gap], new_dur[chain[is_gap]])
                out.columns["dur"] = new_dur
        # chain edges: chain[i] after chain[i-1]
        n = len(g)
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
        add_owner = chain[1:]
        add_id = c["id"][chain[:-1]].astype(np.uint64)
        all_owner = np.concatenate((owner, add_owner))
        so = np.argsort(all_owner, kind="stable")
        out.dep_id = np.concatenate((g.dep_id, add_id))[so]
        out.dep_kind = np.concatenate((g.dep_kind, np.full(len(add_id), int(EdgeKind.ORDER), np.uint8)))[so]
        out.dep_ptr = np.concatenate(([0], np.cumsum(np.bincount(all_owner, minlength=n)))).astype(np.int64)
    out.meta[HOST_CHAIN_META] = True
    return out


def _dependency_order(g: RankGraph, max_rounds: int = 10000) -> np.ndarray | None:
    """A sort key of every node that respects every dependency and otherwise follows the end times
    (then start, then id): a node ends after what it depends on, so end order is nearly right; the
    few edges it contradicts (a guessed wait whose idle gap ended before its target) are fixed by
    moving the dependent after its dependency, repeated until none is left. None on a cycle."""
    c = g.columns
    start = np.where(np.isfinite(c["start"]), c["start"], np.inf)
    fin = start + np.nan_to_num(c["dur"], nan=0.0)
    key = np.empty(len(g))
    key[np.lexsort((c["id"], start, fin))] = np.arange(len(g), dtype=np.float64)
    src, dst, _ = g.edge_rows()
    ok = src >= 0
    src, dst = src[ok], dst[ok]
    for _ in range(max_rounds):
        viol = key[src] >= key[dst]
        if not viol.any():
            return key
        np.maximum.at(key, dst[viol], key[src[viol]] + 0.5)
    return None


ASTRASIM_UNSUPPORTED = (CollectiveType.REDUCE, CollectiveType.GATHER, CollectiveType.SCATTER,
                        CollectiveType.REDUCE_SCATTER_BLOCK, CollectiveType.BARRIER)


def astrasim_world(trace: Trace, selected: list[int]) -> dict[str, Any]:
    """Whether the written set is one ASTRA-sim can run as a whole world (``ettools convert --json``):
    ``{"world", "ranks_written", "missing", "runnable", "warning"}`` (``warning`` None when runnable)."""
    world = max(int(trace.meta.world_size or 0), max(selected, default=-1) + 1)
    missing = sorted(set(range(world)) - set(selected))
    lines = [w for w in astrasim_warnings(trace, selected) if w.startswith("ASTRA-sim needs")]
    return {"world": world, "ranks_written": len(selected), "missing": format_rank_list(missing) if missing else "",
            "runnable": not lines, "warning": lines[0] if lines else None}


def astrasim_warnings(trace: Trace, selected: list[int]) -> list[str]:
    """What keeps ASTRA-sim from running the written set: ranks missing from the world (it needs a
    file for every rank and at least 2 NPUs) and collective types it does not simulate."""
    out: list[str] = []
    world = max(int(trace.meta.world_size or 0), max(selected, default=-1) + 1)
    if world < 2:
        out.append("ASTRA-sim needs at least 2 NPUs: this set has 1 rank")
    elif len(selected) < world:
        out.append(f"ASTRA-sim needs every rank: {len(selected)} of {world} ranks written "
                   f"(missing {format_rank_list(sorted(set(range(world)) - set(selected)))})")
    bad = np.asarray([int(t) for t in ASTRASIM_UNSUPPORTED])
    counts: dict[str, int] = {}
    seen: set[int] = set()
    for r in selected:
        g = trace.graphs[r]
        if id(g.columns["comm_type"]) in seen:
            continue
        seen.add(id(g.columns["comm_type"]))
        sel = (g.type == NodeType.COMM_COLL_NODE) & np.isin(g.comm_type, bad)
        for ct in g.comm_type[sel].tolist():
            counts[CollectiveType(ct).name] = counts.get(CollectiveType(ct).name, 0) + 1
    if counts:
        out.append("ASTRA-sim does not simulate " + ", ".join(f"{k} ({v} node(s))" for k, v in sorted(counts.items())))
    return out


# Collective types ASTRA-sim does not simulate, written as the family ettools' network times them
# as (replay/network.py coll_kind), so both run the same collective: a reduce or scatter moves what a
# reduce-scatter does on every link of a ring, a gather what an all-gather does, a barrier is an
# all-reduce of (almost) nothing.
ASTRASIM_LOWERING = {
    int(CollectiveType.REDUCE): int(CollectiveType.REDUCE_SCATTER),
    int(CollectiveType.SCATTER): int(CollectiveType.REDUCE_SCATTER),
    int(CollectiveType.REDUCE_SCATTER_BLOCK): int(CollectiveType.REDUCE_SCATTER),
    int(CollectiveType.GATHER): int(CollectiveType.ALL_GATHER),
    int(CollectiveType.BARRIER): int(CollectiveType.ALL_REDUCE),
}


def astrasim_min_bytes(world: int) -> int:
    """Smallest collective ASTRA-sim runs safely: its system layer splits a collective into
    ``preferred-dataset-splits`` chunks and those over the NPUs; an all-gather whose chunks fall
    below a byte per NPU loops forever (3 B on 8 NPUs) or finishes no rank (0 B). 4 KiB, or 16 B per
    rank beyond 256 ranks, covers up to 16 splits (80 ns at 50 GB/s)."""
    return max(4096, 16 * int(world))


def astrasim_collective_form(trace: Trace, ranks: list[int]) -> tuple[Trace, dict[str, int]]:
    """Collectives written so ASTRA-sim simulates them: unsupported types lowered
    (:data:`ASTRASIM_LOWERING`), all-gathers and lowered barriers floored to
    :func:`astrasim_min_bytes`. Returns the trace and ``{type name: nodes lowered}``."""
    world = max(int(trace.meta.world_size or 0), max(ranks, default=-1) + 1)
    floor = astrasim_min_bytes(world)
    src = np.asarray(list(ASTRASIM_LOWERING), np.int64)
    lut = np.arange(256, dtype=np.int64)
    lut[src] = list(ASTRASIM_LOWERING.values())
    lowered: dict[int, dict[str, int]] = {}  # per result graph: nodes lowered, by type

    def form(g: RankGraph) -> RankGraph:
        coll = g.type == NodeType.COMM_COLL_NODE
        ct = g.comm_type.astype(np.int64)
        low = coll & np.isin(ct, src)
        small = coll & (np.isin(ct, [int(CollectiveType.ALL_GATHER), int(CollectiveType.GATHER),
                                      int(CollectiveType.BARRIER)])) & (g.comm_bytes < floor)
        if not (low.any() or small.any()):
            return g
        new_ct = np.where(low, lut[np.clip(ct, 0, 255)], ct).astype(g.comm_type.dtype)
        new_b = np.where(small, floor, g.comm_bytes).astype(g.comm_bytes.dtype)
        h = g.replace(comm_type=new_ct, comm_bytes=new_b)
        names, n = np.unique(ct[low], return_counts=True)
        lowered[id(h.comm_type)] = {CollectiveType(int(t)).name: int(c) for t, c in zip(names, n)}
        return h

    graphs = _per_structure(trace, ranks, form)
    counts: dict[str, int] = {}
    for h in graphs.values():  # every written rank's lowered nodes
        for name, c in lowered.get(id(h.comm_type), {}).items():
            counts[name] = counts.get(name, 0) + c
    if all(graphs[r] is trace.graphs[r] for r in ranks):
        return trace, counts
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings), counts


RANK_RELEASE_NAME = "rank_release"


def _host_node_columns(g: RankGraph, name: str, start: float, dur: float) -> tuple[dict[str, np.ndarray], int]:
    """``g``'s node columns with one host compute node appended (the last row), and its id."""
    n = len(g)
    c = g.columns
    nid = int(c["id"].max()) + 1 if n else 0
    cols = {k: np.concatenate((v, np.asarray([NODE_COLUMNS[k][1]], v.dtype))) for k, v in c.items()}
    cols["id"][n] = nid
    cols["name"][n] = g.strings.intern(name)
    cols["type"][n] = int(NodeType.COMP_NODE)
    cols["is_cpu_op"][n] = 1
    cols["start"][n] = start
    cols["dur"][n] = dur
    return cols, nid


def _with_columns(g: RankGraph, cols: dict[str, np.ndarray], dep_ptr: np.ndarray, dep_id: np.ndarray,
                  dep_kind: np.ndarray) -> RankGraph:
    """``g`` with one node appended: its columns and dependencies (the tensor lists get an empty row)."""
    n = len(g)
    ptr1 = np.concatenate((g.in_ptr, g.in_ptr[-1:])) if len(g.in_ptr) == n + 1 else None
    ptr2 = np.concatenate((g.out_ptr, g.out_ptr[-1:])) if len(g.out_ptr) == n + 1 else None
    return RankGraph(g.rank, g.strings, cols, dep_ptr, dep_id, dep_kind, dict(g.attrs), g.tensors,
                     ptr1, g.in_tensor, ptr2, g.out_tensor, dict(g.meta))


def _written(g: RankGraph) -> np.ndarray:
    """The nodes a Chakra file holds (not metadata or invalid ones)."""
    t = g.columns["type"]
    return (t != NodeType.METADATA_NODE) & (t != NodeType.INVALID_NODE)


def _with_release_node(g: RankGraph, release_us: float, t0: float) -> RankGraph:
    """``g`` with a leading host node of ``release_us`` (start ``t0``) that every source depends on."""
    n = len(g)
    src = np.flatnonzero(_written(g) & (np.diff(g.dep_ptr) == 0))
    cols, rid = _host_node_columns(g, RANK_RELEASE_NAME, t0, release_us)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
    all_owner = np.concatenate((owner, src))
    so = np.argsort(all_owner, kind="stable")
    dep_id = np.concatenate((g.dep_id, np.full(len(src), rid, np.uint64)))[so]
    dep_kind = np.concatenate((g.dep_kind, np.full(len(src), int(EdgeKind.ORDER), np.uint8)))[so]
    dep_ptr = np.concatenate(([0], np.cumsum(np.bincount(all_owner, minlength=n + 1)))).astype(np.int64)
    return _with_columns(g, cols, dep_ptr, dep_id, dep_kind)


def astrasim_release_form(trace: Trace, ranks: list[int]) -> Trace:
    """Rank skew written so ASTRA-sim runs it: ASTRA-sim starts every rank at time 0, while ettools
    replays a measured set's ranks from their first event on the job's clock (a rank that entered
    the step late holds its peers in collectives). A rank whose first written event is ``d`` µs
    after the earliest rank's gets a leading host node ``rank_release`` of ``d`` µs that every
    source depends on, starting where the earliest rank starts — read back, every rank starts
    together and that node replays the skew, in ettools and in ASTRA-sim alike. Only ranks whose
    start times are on one clock (``rank_clock`` written) and all known qualify."""
    firsts: dict[int, float] = {}
    for r in ranks:
        g = trace.graphs[r]
        if not (isinstance(g.meta.get(LAUNCH_TYPICAL_META), dict) and g.meta.get("rank_clock")):
            continue
        c = g.columns
        written = _written(g)
        st = c["start"][written]
        if not len(st) or not np.isfinite(st).all():
            continue
        firsts[r] = float(_time_us(st).min())  # the whole-µs start the file will say
    if len(firsts) < 2:
        return trace
    t0 = min(firsts.values())
    graphs = {r: _with_release_node(trace.graphs[r], f - t0, t0) for r, f in firsts.items() if f - t0 >= 1}
    if not graphs:
        return trace
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings)


RANK_END_NAME = "rank_end"


def _with_end_node(g: RankGraph) -> RankGraph:
    """``g`` with a trailing host node of no duration, on the host chain's thread, that depends on
    every sink of the rank."""
    c = g.columns
    written = _written(g)
    ids = c["id"][written & ~np.isin(c["id"], g.dep_id)].astype(np.uint64)
    host = np.flatnonzero(written & (c["is_cpu_op"] == 1) & (c["type"] == NodeType.COMP_NODE))
    ends = (c["start"] + np.nan_to_num(c["dur"]))[written]
    ends = ends[np.isfinite(ends)]
    cols, _ = _host_node_columns(g, RANK_END_NAME, float(ends.max()) if len(ends) else np.nan, 0.0)
    cols["resource"][len(g)] = c["resource"][host[0]]
    dep_ptr = np.concatenate((g.dep_ptr, [g.dep_ptr[-1] + len(ids)])).astype(np.int64)
    dep_kind = np.concatenate((g.dep_kind, np.full(len(ids), int(EdgeKind.ORDER), np.uint8)))
    return _with_columns(g, cols, dep_ptr, np.concatenate((g.dep_id, ids)), dep_kind)


def _needs_end_node(g: RankGraph) -> bool:
    """Whether ASTRA-sim could abort when this rank ends: its end-of-rank statistics throw on host
    (CPU) compute nodes ("Only GPU and COMM types are supported for overlap extraction"); a throw
    while a compute event completes is caught and logged, one while a send, recv or collective
    completes (the network's callback) aborts the whole run, unfinished ranks included."""
    c = g.columns
    t = c["type"]
    host = ((t == NodeType.COMP_NODE) & (c["is_cpu_op"] == 1)).any()
    comm = np.isin(t, [int(x) for x in COMM_NODE_TYPES]).any()
    if not (host and comm):
        return False
    sink = ~np.isin(c["id"], g.dep_id)
    names = c["name"][sink & (t != NodeType.METADATA_NODE)]
    return not (len(names) == 1 and g.strings.lookup(RANK_END_NAME) == int(names[0]))


def astrasim_end_form(trace: Trace, ranks: list[int]) -> Trace:
    """Each rank that ASTRA-sim could abort on (:func:`_needs_end_node`) ends on a host node
    ``rank_end`` of no duration after every other node, so its last completion is a compute event
    (ASTRA-sim gives it 1 ns); ettools replays it as nothing. A rank already ending so is kept."""
    graphs = _per_structure(trace, ranks, lambda g: _with_end_node(g) if _needs_end_node(g) else g)
    if all(graphs[r] is trace.graphs[r] for r in ranks):
        return trace
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings)


def _per_structure(trace: Trace, ranks: list[int], form: Any) -> dict[int, RankGraph]:
    """``form(g)`` of every rank, computed once per structure: ranks that differ only in their
    group and peer columns (stamped out from one graph: data-parallel replicas, tensor-parallel
    peers) share it, since neither ASTRA-sim form reads those columns. A rank sharing another's
    result gets it with its own groups, peers, rank and metadata put back (the result's arrays
    stay shared, so the ranks still encode once)."""
    memo: dict[tuple, tuple[RankGraph, RankGraph]] = {}
    graphs: dict[int, RankGraph] = {}
    for r in ranks:
        g = trace.graphs[r]
        k = structure_identity(g) + tuple((a, id(v)) for a, v in sorted(g.attrs.items()))
        hit = memo.get(k)
        if hit is None:
            hit = memo[k] = (g, form(g))
        src, h = hit
        if h is src or g is src:
            graphs[r] = g if h is src else h
            continue
        if g.comm_group is src.comm_group and g.comm_peer is src.comm_peer:
            out = h
        else:  # nodes the form appended (an end node) keep the form's values
            n = len(src)
            out = h.replace(comm_group=np.concatenate((g.comm_group, h.comm_group[n:])),
                            comm_peer=np.concatenate((g.comm_peer, h.comm_peer[n:])))
        out = out.with_rank(r)
        # the rank's own metadata, plus what the form added or changed
        out.meta = {**g.meta, **{m: v for m, v in h.meta.items() if src.meta.get(m) is not v}}
        graphs[r] = out
    return graphs


def astrasim_host_form(trace: Trace, ranks: list[int] | None = None) -> Trace:
    """:func:`one_host_chain` of every rank (once per structure, :func:`_per_structure`)."""
    graphs = _per_structure(trace, trace.ranks if ranks is None else ranks, one_host_chain)
    if all(h is trace.graphs[r] for r, h in graphs.items()):
        return trace
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings)
