"""Completion-semantics graphs: what Chakra / ASTRA-sim replay (a node starts when all its
dependencies are done, then runs for ``dur``).

A graph read from Kineto describes nesting (a host op contains the ops it called) and stream/thread
order; that is not a replayable dependency graph: a parent cannot "start after" its children. This
pass rewrites each host thread as a **chain of slices** that partition the thread's timeline:

* The thread's time from the rank's first event to its last top-level op is cut at the start and end
  of every top-level op and of every *anchor*: a host op with an edge to or from something outside
  the thread (a runtime call that launched a device op, a blocking call waiting for one, a
  ``c10d`` op issuing a gloo transfer, a backward op linked to its forward op, an op that waited for
  a transfer). Launch calls are also cut at their launch point, ``start + min(L, dur)`` with ``L`` the
  rank's unblocked launch latency (``meta["launch_latency_us"]``), so a kernel launched onto an idle
  stream starts where the trace says it does, not when the call returns; an op issuing a gloo
  transfer is cut where the transfer started (clipped to the op), the work before it being the
  host-side preparation.
* Each piece becomes one node, chained in time order (ORDER edges), ``dur`` = its measured length.
  A piece equal to an anchor keeps the anchor's id and name; other pieces are new nodes named after
  the innermost op containing them, with attribute ``orig`` (that op's id) and ``cat`` copied;
  pieces outside every op are **host idle gaps**: nodes named ``host_gap`` (``cat`` ``host_gap``),
  kept explicitly because idle time on a host thread is real host work (Python, allocator,
  dataloader) the trace does not show.
* Edges are re-pointed: a dependency *on* a host op becomes a dependency on the piece ending where
  that op ends (for a launch: at its launch point); a host op's own dependencies move to the piece
  starting where it starts. A wait (SYNC/SYNC_GUESSED on a host op) moves to the piece in which the
  thread actually waited — the blocking call's body, or the idle gap before an op that resumed after
  a gloo transfer — and that piece's ``dur`` shrinks to what was left after its target finished:
  ``end − max(start, target end)`` (its return latency). A blocking copy call waits for its own copy.
* Device ops and communication nodes are kept as they are (ids, columns, attributes, stream ORDER,
  device-to-device SYNC edges), except that a device op's ``dur`` includes the rank's median gap
  between back-to-back ops of a stream (``meta["stream_gap_us"]``, about 1 µs: the device's own
  per-op overhead; leaving it out drifts GPU-bound replays by about −1 %). The amount added is
  ``meta["replayable"]["stream_gap_us"]``. Host ops nested in a communication node (work done by a gloo
  runloop thread during the transfer) are dropped: the comm node's span covers them. gloo comm
  nodes on one runloop thread are chained in order.
* A device op the reader found held back by something the trace does not record (attribute
  ``device_hold_us``, see :func:`ettools.converters.kineto_sync.device_holds`) is preceded by a
  ``device_hold`` node on its stream (``is_cpu_op`` 0, ``dur`` the measured hold) that takes the
  op's dependencies: the hold is replayed as measured, after whatever made the op ready.

No NEST edges remain; every dependency names a node of the graph; the result is acyclic when the
input's times are consistent (checked by the tests on every real trace). Replaying it with
:func:`asap_schedule` (start = latest end of the dependencies) reproduces the measured span: that is
the self-replay check; what-if studies change ``dur`` of device ops or gaps and replay again.
Launches blocked by a full launch queue (``launch_blocked``) keep their measured duration here; a
replay engine that models the queue can shorten them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ettools.graph import (
    COMM_NODE_TYPES,
    NODE_COLUMNS,
    AttrColumn,
    EdgeKind,
    NodeType,
    RankGraph,
    Trace,
    content_identity,
    structure_identity,
)
from ettools.intervals import prev_ge
from ettools.replayable_check import asap_schedule, measured_rows  # noqa: F401  (re-exported)
from ettools.replayable_untimed import collapse_untimed

_HOST_GAP = "host_gap"
_DISPATCH = "comm_dispatch"
DEVICE_HOLD = "device_hold"  # a measured delay before a device op that the trace does not explain


def _host_chain_mask(g: RankGraph) -> np.ndarray:
    """Host nodes that live on a thread chain (not comm nodes, not gloo p2p spans)."""
    ids = np.unique(g.resource)
    threads = [i for i in ids.tolist() if i >= 0 and g.strings[i].startswith("thread ")
               and not g.strings[i].endswith(" p2p")]
    on_thread = np.isin(g.resource, threads)
    is_comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    return (g.is_cpu_op == 1) & on_thread & ~is_comm


def to_replayable(graph: RankGraph) -> RankGraph:
    """A graph with completion semantics built from a Kineto-style graph (see the module docstring).

    A graph without measured times (PyTorch ET alone) cannot be sliced by time: it is collapsed
    to its outermost ops instead (:func:`collapse_untimed`).
    """
    g = graph
    if len(g) and not np.isfinite(g.start).any():
        return collapse_untimed(g)
    n = len(g)
    src, dst, kind = g.edge_rows()
    ok = src >= 0
    src, dst, kind = src[ok], dst[ok], kind[ok]
    start, dur = g.start, g.dur
    end = start + dur
    is_comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    chain = _host_chain_mask(g)

    parent = np.full(n, -1, np.int64)
    nest = kind == EdgeKind.NEST
    parent[dst[nest]] = src[nest]
    # host ops nested (at any depth) in a comm node are dropped; they map to that comm node
    owner = np.arange(n, dtype=np.int64)
    anc = parent.copy()
    dropped = np.zeros(n, bool)
    for _ in range(64):
        live = anc >= 0
        if not live.any():
            break
        hit = live & is_comm[np.maximum(anc, 0)] & ~dropped
        owner[hit] = anc[hit]
        dropped |= hit
        anc = np.where(live, parent[np.maximum(anc, 0)], -1)
    chain &= ~dropped
    # edges between distinct "worlds": everything except NEST/ORDER (recomputed below)
    cross = ~np.isin(kind, [EdgeKind.NEST, EdgeKind.ORDER])
    c_src, c_dst, c_kind = owner[src[cross]], owner[dst[cross]], kind[cross]
    # anchors: chain nodes at either end of a cross edge; launch sources; blocking calls
    anchor = np.zeros(n, bool)
    anchor[c_src[chain[c_src]]] = True
    anchor[c_dst[chain[c_dst]]] = True
    launch = c_kind == EdgeKind.LAUNCH
    launch_src = np.zeros(n, bool)
    launch_src[c_src[launch & chain[c_src]]] = True
    lat = g.meta.get("launch_latency_us")
    L = float(lat) if lat is not None and np.isfinite(lat) else np.inf
    blocking = np.zeros(n, bool)
    bcol = g.attrs.get("blocking")
    if bcol is not None:
        blocking[bcol.rows[np.asarray(bcol.values, bool)]] = True
    blocking &= chain & launch_src & (dur > 0)
    # a blocking call launches, then waits: keep its launch point strictly inside it
    launch_len = np.where(blocking, np.minimum(L, 0.5 * dur), np.minimum(L, dur))
    launch_pt = np.where(launch_src, start + launch_len, np.nan)
    # an op issuing a host-side transfer (gloo) issues it where the transfer starts (within the op)
    hc = launch & chain[c_src] & is_comm[c_dst] & (g.is_cpu_op[c_dst] == 1)
    if hc.any():
        issue = np.full(n, np.inf)
        np.minimum.at(issue, c_src[hc], start[c_dst[hc]])
        ops = np.unique(c_src[hc])
        launch_pt[ops] = np.clip(issue[ops], start[ops], end[ops])

    origin = float(start.min()) if n else 0.0
    thread_of = np.where(chain, g.resource, -1)
    threads = np.unique(thread_of[chain])

    # per-thread cut times, slices, and node → slice maps
    slice_start_of = np.full(n, -1, np.int64)  # slice starting where a chain node starts
    slice_end_of = np.full(n, -1, np.int64)  # slice ending where it ends
    slice_gap_before = np.full(n, -1, np.int64)  # slice ending where it starts
    slice_launch_of = np.full(n, -1, np.int64)  # slice ending at its launch point
    s_t0, s_t1, s_res, s_name_row = [], [], [], []
    offset = 0
    for t in threads.tolist():
        rows = np.flatnonzero(thread_of == t)  # start order (graph rows are time sorted)
        rows = rows[np.lexsort((rows, -dur[rows], start[rows]))]
        top = rows[parent[rows] < 0]
        anc_rows = rows[anchor[rows]]
        lp = launch_pt[anc_rows]
        cuts = np.unique(np.concatenate((
            [origin], start[top], end[top], start[anc_rows], end[anc_rows], lp[~np.isnan(lp)],
        )))
        m = len(cuts) - 1
        if m <= 0:
            continue
        t0, t1 = cuts[:-1], cuts[1:]
        # innermost chain op containing each slice (or -1: an idle gap)
        pos = np.searchsorted(start[rows], t0, side="right") - 1
        inner = prev_ge(end[rows], t1, pos)
        name_row = np.where(inner >= 0, rows[np.maximum(inner, 0)], -1)
        s_t0.append(t0)
        s_t1.append(t1)
        s_res.append(np.full(m, t, np.int64))
        s_name_row.append(name_row)
        k_start = np.searchsorted(cuts, start[rows])
        slice_start_of[rows] = offset + np.minimum(k_start, m - 1)
        k_end = np.searchsorted(cuts, end[rows]) - 1
        slice_end_of[rows] = offset + np.maximum(k_end, 0)
        k_gap = np.searchsorted(cuts, start[rows]) - 1
        slice_gap_before[rows] = np.where(k_gap >= 0, offset + k_gap, -1)
        if len(anc_rows):
            has_lp = ~np.isnan(lp)
            k_lp = np.searchsorted(cuts, lp[has_lp]) - 1
            slice_launch_of[anc_rows[has_lp]] = offset + np.maximum(k_lp, 0)
        offset += m
    ns = offset
    t0 = np.concatenate(s_t0) if s_t0 else np.zeros(0)
    t1 = np.concatenate(s_t1) if s_t1 else np.zeros(0)
    s_res_a = np.concatenate(s_res) if s_res else np.zeros(0, np.int64)
    s_name = np.concatenate(s_name_row) if s_name_row else np.zeros(0, np.int64)
    s_dur = t1 - t0

    # kept non-chain nodes: device ops, comm nodes, host nodes off the chains (not dropped)
    keep = ~chain & ~dropped
    kept = np.flatnonzero(keep)
    nk = len(kept)
    new_of_kept = np.full(n, -1, np.int64)
    new_of_kept[kept] = np.arange(nk)
    # node index space of the result: [kept nodes | slices]
    total = nk + ns

    # an anchor whose [start, end] (or [start, launch point]) is exactly one slice keeps its identity
    exact_slice = np.full(ns, -1, np.int64)
    anc_all = np.flatnonzero(anchor & chain)
    if len(anc_all):
        k = slice_start_of[anc_all]
        stop = np.where(launch_src[anc_all], launch_pt[anc_all], end[anc_all])
        same = (t0[k] == start[anc_all]) & (t1[k] == stop)
        exact_slice[k[same]] = anc_all[same]

    def host_dep(rows: np.ndarray, at_launch: np.ndarray) -> np.ndarray:
        """Result index of the piece a dependency on host ``rows`` points to."""
        s = np.where(at_launch & (slice_launch_of[rows] >= 0), slice_launch_of[rows], slice_end_of[rows])
        return nk + s

    e_dst, e_src, e_kind = [], [], []
    wait_slice, wait_tgt = [], []
    # cross edges
    sc, dc = chain[c_src], chain[c_dst]
    ok = (keep[c_src] | sc) & (keep[c_dst] | dc) & (c_src != c_dst)
    c_src, c_dst, c_kind, sc, dc = c_src[ok], c_dst[ok], c_kind[ok], sc[ok], dc[ok]
    new_src = np.where(sc, host_dep(c_src, c_kind == EdgeKind.LAUNCH), new_of_kept[c_src])
    # host-side transfers (gloo) start some time after they are issued (runloop wake-up): a
    # ``comm_dispatch`` node on the transfer's thread holds that delay, beyond waiting for the
    # previous transfer of the same thread
    hsel = np.flatnonzero((c_kind == EdgeKind.LAUNCH) & sc & is_comm[c_dst] & (g.is_cpu_op[c_dst] == 1))
    if len(hsel):
        comm_rows = c_dst[hsel]
        issue_at = launch_pt[c_src[hsel]]
        issue_at = np.where(np.isnan(issue_at), end[c_src[hsel]], issue_at)
        prev_end = np.full(n, -np.inf)
        hc_all = np.flatnonzero(is_comm & (g.is_cpu_op == 1) & keep)
        hc_all = hc_all[np.lexsort((start[hc_all], g.resource[hc_all]))]
        if len(hc_all) > 1:
            same_res = g.resource[hc_all[1:]] == g.resource[hc_all[:-1]]
            chained = same_res & (end[hc_all[:-1]] <= start[hc_all[1:]] + 1.0)
            prev_end[hc_all[1:][chained]] = end[hc_all[:-1][chained]]
        d_t0 = issue_at
        d_t1 = np.maximum(start[comm_rows], issue_at)
        d_dur = np.maximum(0.0, start[comm_rows] - np.maximum(issue_at, prev_end[comm_rows]))
        nd = len(hsel)
        d_idx = nk + ns + np.arange(nd)
        e_dst.append(d_idx)
        e_src.append(new_src[hsel])
        e_kind.append(np.full(nd, EdgeKind.LAUNCH, np.uint8))
        new_src[hsel] = d_idx
        c_kind = c_kind.copy()
        c_kind[hsel] = EdgeKind.ORDER
        t0 = np.concatenate((t0, d_t0))
        t1 = np.concatenate((t1, d_t1))
        s_dur = np.concatenate((s_dur, d_dur))
        s_res_a = np.concatenate((s_res_a, g.resource[comm_rows].astype(np.int64)))
        s_name = np.concatenate((s_name, np.full(nd, -2, np.int64)))
        dispatch_of = comm_rows
        exact_slice = np.concatenate((exact_slice, np.full(nd, -1, np.int64)))
    else:
        nd = 0
        dispatch_of = np.zeros(0, np.int64)
    ns_chain = ns
    ns += nd
    total += nd
    # device ops held by something the trace does not show keep the hold: a ``device_hold`` node
    # on the op's stream, between what made the op ready and the op
    hold_of = np.zeros(0, np.int64)
    hcol = g.attrs.get("device_hold_us")
    if hcol is not None and len(hcol.rows):
        hv = np.asarray(hcol.values, np.float64)
        hsel = keep[hcol.rows] & (g.is_cpu_op[hcol.rows] == 0) & np.isfinite(hv) & (hv > 0)
        hold_of, hv = hcol.rows[hsel], hv[hsel]
        nh = len(hold_of)
        t0 = np.concatenate((t0, start[hold_of] - hv))
        t1 = np.concatenate((t1, start[hold_of]))
        s_dur = np.concatenate((s_dur, hv))
        s_res_a = np.concatenate((s_res_a, g.resource[hold_of].astype(np.int64)))
        s_name = np.concatenate((s_name, np.full(nh, -3, np.int64)))
        exact_slice = np.concatenate((exact_slice, np.full(nh, -1, np.int64)))
        ns += nh
        total += nh
    waits = np.isin(c_kind, [EdgeKind.SYNC, EdgeKind.SYNC_GUESSED]) & dc
    rt_call = np.zeros(n, bool)
    cat = g.attrs.get("cat")
    if cat is not None:
        kinds = {c: isinstance(c, str) and c.endswith(("_runtime", "_driver")) for c in set(cat.values)}
        is_rt = np.fromiter(map(kinds.__getitem__, cat.values), bool, len(cat.values))
        rt_call[cat.rows[is_rt]] = True
    in_call = rt_call[c_dst]
    wait_piece = np.where(in_call, slice_end_of[c_dst], np.where(slice_gap_before[c_dst] >= 0,
                                                                  slice_gap_before[c_dst], slice_start_of[c_dst]))
    new_dst = np.where(dc, nk + np.where(waits, wait_piece, slice_start_of[c_dst]), new_of_kept[c_dst])
    e_dst.append(new_dst)
    e_src.append(new_src)
    e_kind.append(c_kind)
    wait_slice.append(wait_piece[waits])
    wait_tgt.append(end[c_src[waits]])
    # blocking calls wait for the copy they launched
    if blocking.any():
        lsel = (c_kind == EdgeKind.LAUNCH) & blocking[c_src] & ~dc
        b_call, b_op = c_src[lsel], c_dst[lsel]
        piece = slice_end_of[b_call]
        e_dst.append(nk + piece)
        e_src.append(new_of_kept[b_op])
        e_kind.append(np.full(len(piece), EdgeKind.SYNC, np.uint8))
        wait_slice.append(piece)
        wait_tgt.append(end[b_op])
    # ORDER among kept nodes (streams) from the input; chain ORDER between consecutive slices
    o_sel = (kind == EdgeKind.ORDER) & keep[src] & keep[dst] & ~is_comm[src] & ~is_comm[dst]
    o_sel |= (kind == EdgeKind.ORDER) & keep[src] & keep[dst] & (g.is_cpu_op[src] == 0) & (g.is_cpu_op[dst] == 0)
    e_dst.append(new_of_kept[dst[o_sel]])
    e_src.append(new_of_kept[src[o_sel]])
    e_kind.append(kind[o_sel])
    if ns_chain > 1:
        same = s_res_a[1:ns_chain] == s_res_a[: ns_chain - 1]
        nxt = np.flatnonzero(same) + 1
        e_dst.append(nk + nxt)
        e_src.append(nk + nxt - 1)
        e_kind.append(np.full(len(nxt), EdgeKind.ORDER, np.uint8))
    # host-resident comm nodes (gloo) run one at a time per runloop thread
    hc = kept[is_comm[kept] & (g.is_cpu_op[kept] == 1)]
    if len(hc) > 1:
        hc = hc[np.lexsort((start[hc], g.resource[hc]))]
        same = (g.resource[hc[1:]] == g.resource[hc[:-1]]) & (end[hc[:-1]] <= start[hc[1:]] + 1.0)
        e_dst.append(new_of_kept[hc[1:][same]])
        e_src.append(new_of_kept[hc[:-1][same]])
        e_kind.append(np.full(int(same.sum()), EdgeKind.ORDER, np.uint8))

    # waits shrink their piece to what was left after the target finished
    ws = np.concatenate(wait_slice) if wait_slice else np.zeros(0, np.int64)
    wt = np.concatenate(wait_tgt) if wait_tgt else np.zeros(0)
    if len(ws):
        tmax = np.full(ns, -np.inf)
        np.maximum.at(tmax, ws, wt)
        w = np.flatnonzero(np.isfinite(tmax))
        s_dur[w] = np.clip(t1[w] - np.maximum(t0[w], tmax[w]), 0.0, t1[w] - t0[w])

    dst_all = np.concatenate(e_dst).astype(np.int64)
    src_all = np.concatenate(e_src).astype(np.int64)
    kind_all = np.concatenate(e_kind).astype(np.uint8)
    if len(hold_of):
        # the hold node takes the op's dependencies (as ORDER: it is neither a launch nor a wait),
        # the op depends on its hold node
        h_new = np.full(total, -1, np.int64)
        h_new[new_of_kept[hold_of]] = total - len(hold_of) + np.arange(len(hold_of))
        into = (dst_all >= 0) & (dst_all < total)
        into[into] = h_new[dst_all[into]] >= 0
        dst_all = np.concatenate((dst_all, h_new[dst_all[into]], new_of_kept[hold_of]))
        src_all = np.concatenate((src_all, src_all[into], total - len(hold_of) + np.arange(len(hold_of))))
        kind_all = np.concatenate((kind_all, np.full(int(into.sum()), EdgeKind.ORDER, np.uint8),
                                   np.full(len(hold_of), EdgeKind.ORDER, np.uint8)))
    good = (dst_all >= 0) & (src_all >= 0) & (dst_all != src_all) & (dst_all < total) & (src_all < total)
    dst_all, src_all, kind_all = dst_all[good], src_all[good], kind_all[good]
    # one edge per (dst, src): the lowest kind number wins (ORDER < LAUNCH < SYNC ...)
    key = (dst_all * total + src_all) * 8 + kind_all
    key = np.unique(key)
    pair = key // 8
    first = np.ones(len(pair), bool)
    first[1:] = pair[1:] != pair[:-1]
    key = key[first]
    kind_all = (key % 8).astype(np.uint8)
    pair = key // 8
    dst_all, src_all = pair // total, pair % total

    # columns
    ids = np.empty(total, np.uint64)
    ids[:nk] = g.id[kept]
    keep_id = exact_slice >= 0
    next_id = int(g.id.max()) + 1 if n else 0
    sid = np.empty(ns, np.uint64)
    sid[keep_id] = g.id[exact_slice[keep_id]]
    sid[~keep_id] = np.arange(next_id, next_id + int((~keep_id).sum()), dtype=np.uint64)
    ids[nk:] = sid
    gap_name = g.strings.intern(_HOST_GAP)
    name_row = np.where(keep_id, exact_slice, s_name)
    s_names = np.where(name_row >= 0, g.name[np.maximum(name_row, 0)], gap_name).astype(np.int32)
    s_names[name_row == -2] = g.strings.intern(_DISPATCH)
    s_names[name_row == -3] = g.strings.intern(DEVICE_HOLD)
    sg = g.meta.get("stream_gap_us")
    gap_us = float(sg) if sg is not None and np.isfinite(sg) and sg > 0 else 0.0
    cols = {}
    for col, arr in g.columns.items():
        out = np.empty(total, arr.dtype)
        out[:nk] = arr[kept]
        if col == "id":
            out[nk:] = sid
        elif col == "name":
            out[nk:] = s_names
        elif col == "start":
            out[nk:] = t0
        elif col == "dur":
            out[nk:] = s_dur
            if gap_us:
                dev = g.is_cpu_op[kept] == 0
                out[:nk][dev] += gap_us
        elif col == "resource":
            out[nk:] = s_res_a
        elif col == "is_cpu_op":
            out[nk:] = np.where(s_name == -3, 0, 1)
        elif col == "type":
            out[nk:] = int(NodeType.COMP_NODE)
        else:
            out[nk:] = np.where(keep_id, arr[np.maximum(exact_slice, 0)], NODE_COLUMNS[col][1])
        cols[col] = out
    # attributes: kept nodes and identity slices keep theirs; pieces get orig + cat
    old_to_new = np.full(n, -1, np.int64)
    old_to_new[kept] = np.arange(nk)
    old_to_new[exact_slice[keep_id]] = nk + np.flatnonzero(keep_id)
    attrs: dict[str, AttrColumn] = {}
    for name, col in g.attrs.items():
        new_rows = old_to_new[col.rows]
        m = new_rows >= 0
        if not m.any():
            continue
        vals = _objects(col.values)[m]
        nr = new_rows[m]
        o = np.argsort(nr, kind="stable")
        attrs[name] = AttrColumn(col.kind, nr[o], vals[o].tolist())
    piece = np.flatnonzero(~keep_id)
    if len(piece):
        orig_rows = s_name[piece].copy()
        is_disp = orig_rows == -2
        orig_rows[is_disp] = dispatch_of  # a dispatch node's orig is its transfer
        has = orig_rows >= 0
        _merge_attr(attrs, "orig", "int64_val", nk + piece[has], g.id[orig_rows[has]].astype(np.int64).tolist())
        cat_full = np.full(n + 1, "", object)
        if cat is not None:
            cat_full[cat.rows] = _objects(cat.values)
        cvals = cat_full[orig_rows]  # -1 reads the trailing "" (a gap)
        cvals[orig_rows < 0] = _HOST_GAP
        cvals[is_disp] = _DISPATCH
        cvals[orig_rows == -3] = DEVICE_HOLD
        cvals = cvals.tolist()
        _merge_attr(attrs, "cat", "string_val", nk + piece, cvals)
    o = np.argsort(dst_all, kind="stable")
    dep_ptr = np.zeros(total + 1, np.int64)
    np.cumsum(np.bincount(dst_all, minlength=total), out=dep_ptr[1:])
    meta = dict(g.meta)
    meta["replayable"] = {
        "slices": int(ns_chain),
        "gaps": int((s_name == -1).sum()),
        "comm_dispatch": int(nd),
        "device_holds": int(len(hold_of)),
        "waits": int(len(np.unique(ws))) if len(ws) else 0,
        "dropped": int(dropped.sum()),
        "launch_latency_us": None if not np.isfinite(L) else L,
        "stream_gap_us": gap_us,
    }
    out = RankGraph(g.rank, g.strings, cols, dep_ptr, ids[src_all[o]], kind_all[o], attrs, meta=meta)
    return out


def replayable_trace(trace: Trace, convert: Callable[[RankGraph], RankGraph] | None = None,
                     needs: Callable[[RankGraph], bool] | None = None) -> Trace:
    """:func:`to_replayable` applied to every rank of ``trace`` that records nesting.

    Work is done once per distinct graph: ranks sharing every array (replicas stamped out by a
    rewrite) share the result, and ranks differing only in their group/peer columns get the
    converted graph of the first with their own columns patched in. A trace without NEST edges is
    returned as it is.

    ``convert``: the per-graph pass instead of :func:`to_replayable`; ``needs``: which ranks it
    applies to (the others are kept as they are; default: every rank once any records nesting).
    """
    def nested(g: RankGraph) -> bool:
        return bool((g.dep_kind == EdgeKind.NEST).any())

    if not any((needs or nested)(g) for g in trace):
        return trace
    convert = convert or to_replayable
    by_struct: dict[tuple, tuple[RankGraph, RankGraph]] = {}
    by_content: dict[tuple, RankGraph] = {}
    graphs: dict[int, RankGraph] = {}
    for r in trace.ranks:
        g = trace.graphs[r]
        if needs is not None and not needs(g):
            graphs[r] = g
            continue
        ck = content_identity(g)
        hit = by_content.get(ck)
        if hit is not None:
            graphs[r] = hit.with_rank(r)
            continue
        sk = structure_identity(g)
        base = by_struct.get(sk)
        if base is None:
            out = convert(g)
            by_struct[sk] = (g, out)
        else:
            out = _patch_comm(base[1], base[0], g)
        out.rank = r
        by_content[ck] = out
        graphs[r] = out
    return Trace(trace.meta, graphs, trace.strings)


def _patch_comm(conv: RankGraph, src: RankGraph, g: RankGraph) -> RankGraph:
    """``conv`` (the replayable form of ``src``) with the group/peer columns of ``g`` (``src``'s structure)."""
    rows_g = np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES]))
    rows_c = conv.rows_of(g.id[rows_g])
    ok = rows_c >= 0
    cg, cp = conv.comm_group, conv.comm_peer
    if g.comm_group is not src.comm_group:
        cg = cg.copy()
        cg[rows_c[ok]] = g.comm_group[rows_g[ok]]
    if g.comm_peer is not src.comm_peer:
        cp = cp.copy()
        cp[rows_c[ok]] = g.comm_peer[rows_g[ok]]
    return conv.replace(comm_group=cg, comm_peer=cp)


def _objects(values: list) -> np.ndarray:
    """A 1-d object array of ``values`` (tuples and lists stay single elements)."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


def _merge_attr(attrs: dict[str, AttrColumn], name: str, kind: str, rows: np.ndarray, values: list) -> None:
    old = attrs.get(name)
    if old is not None:
        rows = np.concatenate((old.rows, rows))
        values = list(old.values) + list(values)
    if len(rows) == 0:
        return
    o = np.argsort(rows, kind="stable")
    attrs[name] = AttrColumn(kind, rows[o], [values[i] for i in o.tolist()])
