"""The form of a rank graph the engine runs: completion semantics, with the waits a trace implies.

A graph with nesting (Kineto, PyTorch ET + Kineto) is rewritten by
:func:`ettools.replayable.to_replayable` into completion semantics: host threads as chains of
slices with their idle gaps, launches cut at their launch point, syncs as waits. A graph that is
already a dependency graph (Chakra, ASTRA-sim JSON, synthesized) is used as it is (checked to be
acyclic). A nested graph the pass cannot handle (missing start times, an inconsistent linked graph)
falls back to its top-level host ops plus device and communication nodes, ``form = "fallback"``.

Waits the trace does not record: ``loss.backward()`` leaves the main thread idle while the
autograd thread runs the backward: a long idle stretch of one host thread, during which another
thread of the rank was busy and right after whose last op the idle thread resumed, becomes a wait
on that op (``SYNC_GUESSED``; see :func:`_cross_thread_waits`). Waits the measured times
contradict (a pageable copy flagged blocking that started after its call returned; a gloo span
"issued" by an op that started after it) are dropped (:func:`_drop_contradicted_waits`).
"""

from __future__ import annotations

import logging

import numpy as np

from ettools.checks import structure_key, topological_sort
from ettools.errors import TraceError
from ettools.graph import COMM_NODE_TYPES, EdgeKind, RankGraph
from ettools.graph_algorithms import is_acyclic
from ettools.replayable import to_replayable

log = logging.getLogger(__name__)


def _is_nested(g: RankGraph) -> bool:
    # a measured host timeline without nesting (a device-only Kineto trace: runtime calls, no
    # framework ops) needs the same slicing: its idle gaps are host time
    return bool(g.meta.get("host_timeline")) or bool((g.dep_kind == EdgeKind.NEST).any())


def _fallback(g: RankGraph) -> RankGraph:
    """Top-level host ops, device ops and comm nodes of a nested graph, NEST edges dropped."""
    src, dst, kind = g.edge_rows()
    nested = np.zeros(len(g), bool)
    nested[dst[(kind == EdgeKind.NEST) & (src >= 0)]] = True
    comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    keep = ~nested | comm | (g.is_cpu_op == 0)
    out = g.select(keep)
    if (out.dep_kind == EdgeKind.NEST).any():
        sel = out.dep_kind != EdgeKind.NEST
        counts = np.diff(out.dep_ptr)
        owner = np.repeat(np.arange(len(out)), counts)[sel]
        ptr = np.zeros(len(out) + 1, np.int64)
        np.cumsum(np.bincount(owner, minlength=len(out)), out=ptr[1:])
        out = RankGraph(out.rank, out.strings, out.columns, ptr, out.dep_id[sel], out.dep_kind[sel],
                        out.attrs, out.tensors, out.in_ptr, out.in_tensor, out.out_ptr, out.out_tensor, out.meta)
    return out


def _slice_ends(rg: RankGraph) -> np.ndarray:
    """Measured end of every host slice: the start of the next slice on its thread (slices partition
    the thread's time; zero-length ones, such as ``comm_dispatch``, sort first); other nodes:
    start + duration."""
    host = np.flatnonzero(rg.is_cpu_op == 1)
    comm = np.isin(rg.type, [int(t) for t in COMM_NODE_TYPES])
    host = host[~comm[host]]
    dur = np.nan_to_num(rg.dur, nan=0.0)
    t1 = rg.start + dur
    host = host[np.lexsort((dur[host], rg.start[host], rg.resource[host]))]
    same = rg.resource[host[1:]] == rg.resource[host[:-1]]
    t1[host[:-1][same]] = np.maximum(rg.start[host[1:][same]], rg.start[host[:-1][same]])
    return t1


def _drop_contradicted_waits(rg: RankGraph) -> tuple[RankGraph, int]:
    """Remove waits of host slices on device ops that started only after the slice had ended.

    A copy from pageable memory is flagged blocking, but small host-to-device copies return
    once staged: the trace then shows the copy starting after the call returned, and replaying the
    wait would hold the host thread for nothing.
    """
    src, dst, kind = rg.edge_rows()
    wait = np.isin(kind, [EdgeKind.SYNC, EdgeKind.SYNC_GUESSED]) & (src >= 0)
    wait &= (rg.is_cpu_op[np.maximum(src, 0)] == 0) & (rg.is_cpu_op[dst] == 1)
    # a host transfer "issued" by an op that started after the transfer did (a mispaired gloo span)
    disp_id = rg.strings.lookup("comm_dispatch")
    bad_launch = np.zeros(len(src), bool)
    if disp_id >= 0:
        is_disp = rg.name == disp_id
        comm_start = np.full(len(rg), np.inf)
        nxt = is_disp[np.maximum(src, 0)] & (src >= 0) & np.isin(rg.type[dst], [int(t) for t in COMM_NODE_TYPES])
        np.minimum.at(comm_start, src[nxt], rg.start[dst[nxt]])
        bad_launch = (kind == EdgeKind.LAUNCH) & (src >= 0) & is_disp[dst]
        bad_launch &= rg.start[np.maximum(src, 0)] > comm_start[dst] + 1.0
    if not wait.any() and not bad_launch.any():
        return rg, 0
    # measured end of each host slice: the start of the next slice on its thread
    t1 = _slice_ends(rg)
    bad = (wait & (rg.start[np.maximum(src, 0)] >= t1[dst] + 1.0)) | bad_launch
    if not bad.any():
        return rg, 0
    keep = ~bad
    counts = np.diff(rg.dep_ptr)
    owner = np.repeat(np.arange(len(rg)), counts)[keep]
    ptr = np.zeros(len(rg) + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=len(rg)), out=ptr[1:])
    out = RankGraph(rg.rank, rg.strings, rg.columns, ptr, rg.dep_id[keep], rg.dep_kind[keep], rg.attrs,
                    rg.tensors, rg.in_ptr, rg.in_tensor, rg.out_ptr, rg.out_tensor, rg.meta)
    return out, int(bad.sum())


IDLE_WAIT_MIN_US = 1000.0  # an idle host slice this long may be a wait on another thread
IDLE_WAIT_BUSY = 0.5  # ... if another thread of the rank was busy this share of it
IDLE_WAIT_RESUME = (100.0, 0.02)  # ... and it resumed within max(100 µs, 2 %) of that thread's last op


def _cross_thread_waits(rg: RankGraph, g: RankGraph) -> tuple[RankGraph, int]:
    """Guess waits between host threads of a rank, which Kineto does not record.

    ``loss.backward()`` leaves the main thread idle while the autograd thread runs the backward;
    replaying that idle stretch with its measured length would keep the step as long whatever the
    backward costs. An idle host slice (a gap, or a stretch of an op outside its children) of at
    least ``IDLE_WAIT_MIN_US``, during which another host thread of the rank was busy at least
    ``IDLE_WAIT_BUSY`` of the time and which ended within ``max(100 µs, 2 %)`` of that thread's last
    slice, becomes a wait on that slice (a ``SYNC_GUESSED`` edge; its duration is what was left
    after the other thread's slice ended, like any wait).
    """
    host = np.flatnonzero(rg.is_cpu_op == 1)
    if not len(host):
        return rg, 0
    host = host[np.lexsort((rg.start[host], rg.resource[host]))]
    t0 = rg.start
    t1 = _slice_ends(rg)
    comm = np.isin(rg.type, [int(t) for t in COMM_NODE_TYPES])
    gap_id = rg.strings.lookup("host_gap")
    is_gap = rg.name == gap_id
    disp_id = rg.strings.lookup("comm_dispatch")
    is_disp = (rg.name == disp_id) if disp_id >= 0 else np.zeros(len(rg), bool)
    src, dst, kind = rg.edge_rows()
    has_wait = np.zeros(len(rg), bool)
    has_wait[dst[np.isin(kind, [EdgeKind.SYNC, EdgeKind.SYNC_GUESSED]) & (src >= 0)]] = True
    orig = rg.attrs.get("orig")
    piece = np.zeros(len(rg), bool)
    if orig is not None:
        piece[orig.rows] = True
    length = t1 - t0
    cand = host[(piece[host] | is_gap[host]) & ~has_wait[host] & ~comm[host] & ~is_disp[host]
                & (length[host] >= IDLE_WAIT_MIN_US)]
    if not len(cand):
        return rg, 0
    threads = {}
    for res in np.unique(rg.resource[host]).tolist():
        rows = host[(rg.resource[host] == res) & ~is_gap[host] & ~comm[host]]
        if len(rows):
            s, e = t0[rows], t1[rows]
            cum = np.concatenate(([0.0], np.cumsum(e - s)))
            threads[res] = (rows, s, e, cum)
    add_src, add_dst = [], []
    new_dur = rg.dur.copy()
    gh = np.flatnonzero(g.is_cpu_op == 1)
    op_starts = {res: np.sort(g.start[gh[g.resource[gh] == res]]) for res in np.unique(rg.resource[cand]).tolist()}
    for c in cand.tolist():
        a, b = t0[c], t1[c]
        ss = op_starts[int(rg.resource[c])]
        k = np.searchsorted(ss, a + 1e-6, side="right")
        resume = min(b, float(ss[k])) if k < len(ss) else b
        best = None
        for res, (rows, s, e, cum) in threads.items():
            if res == rg.resource[c]:
                continue
            # busy time of the other thread inside [a, b] (its slices do not overlap each other)
            i0 = np.searchsorted(e, a, side="right")
            i1 = np.searchsorted(s, b, side="left")
            if i1 <= i0:
                continue
            busy = cum[i1] - cum[i0] - max(0.0, a - s[i0]) - max(0.0, e[i1 - 1] - b)
            if busy < IDLE_WAIT_BUSY * (b - a):
                continue
            k = np.searchsorted(e, resume + 1.0, side="right") - 1  # its last slice ending by the resume
            if k < 0 or e[k] < a:
                continue
            if resume - e[k] > max(IDLE_WAIT_RESUME[0], IDLE_WAIT_RESUME[1] * (resume - a)):
                continue
            if best is None or e[k] > best[1]:
                best = (int(rows[k]), float(e[k]))
        if best is not None:
            add_src.append(best[0])
            add_dst.append(c)
            new_dur[c] = max(0.0, b - max(a, best[1]))
    if not add_src:
        return rg, 0
    add_src_a = np.asarray(add_src, np.int64)
    add_dst_a = np.asarray(add_dst, np.int64)
    while True:
        out = _with_edges(rg, add_src_a, add_dst_a, new_dur)
        _, cyclic, _ = topological_sort(out)
        if not cyclic.any() or not len(add_dst_a):
            break
        # a guess that closes a cycle contradicts the graph: drop the guesses into cyclic nodes
        bad = cyclic[add_dst_a]
        if not bad.any():
            break
        new_dur[add_dst_a[bad]] = rg.dur[add_dst_a[bad]]
        add_src_a, add_dst_a = add_src_a[~bad], add_dst_a[~bad]
    return out, len(add_src_a)


def _with_edges(rg: RankGraph, add_src: np.ndarray, add_dst: np.ndarray, dur: np.ndarray) -> RankGraph:
    """``rg`` with SYNC_GUESSED edges ``add_src -> add_dst`` (rows) and durations ``dur``."""
    counts = np.diff(rg.dep_ptr)
    owner = np.concatenate([np.repeat(np.arange(len(rg)), counts), add_dst])
    ids = np.concatenate([rg.dep_id, rg.id[add_src]])
    kinds = np.concatenate([rg.dep_kind, np.full(len(add_src), EdgeKind.SYNC_GUESSED, np.uint8)])
    o = np.argsort(owner, kind="stable")
    ptr = np.zeros(len(rg) + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=len(rg)), out=ptr[1:])
    cols = dict(rg.columns)
    cols["dur"] = dur
    return RankGraph(rg.rank, rg.strings, cols, ptr, ids[o], kinds[o], rg.attrs, rg.tensors, rg.in_ptr,
                     rg.in_tensor, rg.out_ptr, rg.out_tensor, rg.meta)


def _check_acyclic(g: RankGraph, cache: dict | None = None) -> None:
    """Raise TraceError naming some nodes of a dependency cycle (checked once per shared structure)."""
    key = ("acyclic", structure_key(g))
    if cache is not None and cache.get(key):
        return
    if is_acyclic(g):
        if cache is not None:
            cache[key] = True
        return
    _, cyclic, _ = topological_sort(g)  # the whole sort only to name the nodes
    if cyclic.any():
        rows = np.flatnonzero(cyclic)
        names = ", ".join(f"{int(g.id[r])} ({g.name_of(r)[:60]})" for r in rows[:5])
        raise TraceError(g.meta.get("source_file") or "<trace>",
                         f"rank {g.rank}: the dependencies form a cycle: {len(rows)} nodes lie on or after "
                         f"cycles (e.g. {names}); a graph must be acyclic to replay")
    if cache is not None:
        cache[key] = True


def replayable_form(g: RankGraph, cache: dict | None = None) -> tuple[RankGraph, str]:
    """The completion-semantics graph the engine runs, and which form it is (see module doc)."""
    if not _is_nested(g):
        _check_acyclic(g, cache)
        return g, "graph"
    if len(g) and np.isfinite(g.start).all() and np.isfinite(g.dur).all():
        try:
            rg = to_replayable(g)
            rg, dropped = _drop_contradicted_waits(rg)
            rg, guessed = _cross_thread_waits(rg, g)
            rg.meta["waits_contradicted"] = dropped
            rg.meta["cross_thread_waits"] = guessed
            if rg.topological_order() is not None:
                return rg, "kineto"
        except (ValueError, IndexError) as e:  # inconsistent times in a linked graph
            log.info("rank %d: replayable pass failed (%s); using the fallback form", g.rank, e)
    fb = _fallback(g)
    if fb.topological_order() is None:
        raise ValueError(f"rank {g.rank}: the graph has a dependency cycle")
    return fb, "fallback"
