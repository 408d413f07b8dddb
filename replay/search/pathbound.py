"""A lower bound on a synthesized plan's replayed step time from its dependencies (``path_bound``):
tighter than the stage bound (:func:`.evaluate.stage_bound`, compute only) where transfers sit on
the dependency chains (tensor-parallel collectives between a layer's GEMMs, ZeRO-3 gathers before
them) or stages wait for each other (the pipeline's fill and drain).

It is an earliest-time propagation over every representative rank's graph at once, each quantity
a lower bound on the replay's (:mod:`ettools.replay.engine`), in which a node starts once every
node it depends on has ended (more waits, never fewer: lanes, contention, the launch queue):

* a compute node runs at least the compute model's time (the stage bound's own figure:
  :func:`.evaluate.compute_us`; contention only slows it);
* a collective (replayed on its own when members are absent, or as an instance all members start)
  ends at least its network time after it starts (:func:`ettools.replay.program.comm_times`, the
  replay's own closed form); a send likewise (sends are eager); a receive ends no earlier than its
  matching send (same ranks and tag), at any time after it started (weight 0);
* one device lane runs a rank's compute nodes one at a time, so within an instance of a program
  (:attr:`ettools.converters.symbolic.stage.StageGraph.instances`) the compute nodes that depend
  on its first row and that its last row depends on (through the program's own edges) all run
  between the first row's start and the last row's start: the last row starts at least their
  compute time (the last row's own left out) after the first row's earliest start. This is an
  extra node per instance, depending on what the first row depends on, that the last row waits for;
  and over a whole rank, the compute nodes that cannot start before a time ``t`` end at least their
  summed compute time after ``t`` (every ``t``: the earliest starts the propagation found).

Every rank of a synthesized plan is released at time 0 and its replayed step is its span (no
measured steps), so the latest end over all nodes is a lower bound on the step time. None of this
applies under a congestion-aware network (transfer times are not closed forms: weight 0 then) or
an ASTRA-sim system file (no bound at all, as for the stage bound). ``SearchResult.bound_violations``
counts any replay that beats it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .context import Context, compute_us, timing_model


class _Prep:  # what comm_times reads of a prepared rank
    def __init__(self, graph: Any) -> None:
        self.graph = graph


def path_bound(result: Any, reps: list[int], ctx: Context) -> float:
    """Lower bound (µs) on the replayed step time of the synthesized ``result`` (its ranks ``reps``
    in its trace); 0 where it claims nothing (see the module docstring)."""
    from ettools.graph import NodeType
    from ettools.replay import compute as cm
    from ettools.replay.network import load_network, load_system
    from ettools.replay.program import comm_times

    model = timing_model(ctx)
    if model is None or not reps:
        return 0.0
    trace = cm.without_estimates(result.trace)  # as the replay: synthesized durations re-timed
    graphs = [trace.graphs[r] for r in reps]
    if any(np.isfinite(g.start).any() for g in graphs):
        return 0.0  # measured starts: ranks released at their own times (not a synthesized plan)
    hw = cm.load_hardware(ctx.system if ctx.system is not None else cm.hardware_from_trace(trace),
                          trace.meta.world_size)
    net = load_network(ctx.network, load_system(ctx.collectives))
    timed = not (net is not None and net.congestion)
    ctimes = comm_times(trace, {r: _Prep(g) for r, g in zip(reps, graphs)}, net, hw) if timed else {}
    present = set(trace.graphs)
    offsets = np.zeros(len(reps) + 1, np.int64)
    np.cumsum([len(g) for g in graphs], out=offsets[1:])
    n_real = int(offsets[-1])
    weight = np.zeros(n_real)
    lane_w = np.zeros(n_real)  # compute time on the device lane
    srcs, dsts, virt_w = [], [], []
    sends: dict[tuple[int, int, int], list[int]] = {}  # (from, to, tag) -> global rows
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for j, (r, g) in enumerate(zip(reps, graphs)):
        off = int(offsets[j])
        wc = compute_us(g, model)
        w = wc.copy()
        ct = np.nan_to_num(ctimes[r], nan=0.0) if timed else np.zeros(len(g))
        coll = g.type == NodeType.COMM_COLL_NODE
        send = g.type == NodeType.COMM_SEND_NODE
        recv = g.type == NodeType.COMM_RECV_NODE
        w[coll] = ct[coll]
        w[send] = ct[send]  # lowered below to its receive's where the pair's time is the receive's
        w[recv] = 0.0
        weight[off:off + len(g)] = w
        lane_w[off:off + len(g)] = wc
        src, dst, _ = g.edge_rows()
        ok = src >= 0
        srcs.append(src[ok] + off)
        dsts.append(dst[ok] + off)
        for row in np.flatnonzero(send | recv).tolist():
            peer, tag = int(g.comm_peer[row]), int(g.comm_tag[row])
            if send[row]:
                sends.setdefault((r, peer, tag), []).append(off + row)
            else:
                recvs.setdefault((peer, r, tag), []).append(off + row)
        inst = result.stages[result.stamper.stage_of(r)].instances
        if inst is not None:
            _interval_nodes(inst, wc, src[ok], dst[ok], off, n_real + len(virt_w), srcs, dsts, virt_w)
    # transfers between the representatives: a receive ends no earlier than its send (one pair per
    # channel and tag: several would be matched in issue order, so those get no edge)
    for key, rows in sends.items():
        other = recvs.get(key)
        if key[1] not in present:
            continue  # replayed on its own for its network time: its weight stands
        if other is None:
            weight[rows] = 0.0  # a peer that is there but never receives: nothing claimed
            continue
        t = min(weight[other + rows])  # (both sides time the same transfer; the smaller is safe)
        weight[rows] = np.minimum(weight[rows], t)
        if len(rows) == 1 and len(other) == 1:
            srcs.append(np.asarray(rows, np.int64))
            dsts.append(np.asarray(other, np.int64))
    n = n_real + len(virt_w)
    dur = np.concatenate([weight, np.asarray(virt_w, np.float64)])
    asap = _earliest_starts(n, np.concatenate(srcs), np.concatenate(dsts), dur)
    if asap is None:
        return 0.0  # a cycle: the replay reports it
    best = float((asap + dur).max()) if n else 0.0
    for j in range(len(reps)):
        # the device lane once more, over the whole rank: the compute nodes that cannot start
        # before t run one at a time after t
        a, z = int(offsets[j]), int(offsets[j + 1])
        comp = np.flatnonzero(lane_w[a:z] > 0) + a
        if len(comp):
            o = np.argsort(asap[comp], kind="stable")
            after = np.cumsum(lane_w[comp][o][::-1])[::-1]
            best = max(best, float((asap[comp][o] + after).max()))
    return best


def _interval_nodes(inst: tuple, wc: np.ndarray, src: np.ndarray, dst: np.ndarray, off: int, first_virtual: int,
                    srcs: list, dsts: list, virt_w: list) -> None:
    """The per-instance lane constraint of the module docstring, as virtual nodes ``first_virtual``
    onwards: each depends on what its instance's first row depends on, weighs the compute of the
    instance rows between its first and last row (through program edges), and its last row waits for it."""
    base, pid, edges = inst
    sizes = np.diff(base)
    order = np.argsort(dst, kind="stable")
    dst_sorted, src_by_dst = dst[order], src[order]
    firsts, lasts, ws = [], [], []
    for j, (e_src, e_dst) in enumerate(edges):
        which = np.flatnonzero((pid == j) & (sizes >= 2))
        if not len(which):
            continue
        size = int(sizes[which[0]])
        rel = _between(size, e_src, e_dst)
        if rel is None:
            continue
        a = base[which]  # first rows of the instances
        c = wc[a[:, None] + rel[None, :]].sum(axis=1) - wc[a + size - 1]
        keep = c > 0
        firsts.append(a[keep])
        lasts.append(a[keep] + size - 1)
        ws.append(c[keep])
    if not firsts:
        return
    f = np.concatenate(firsts)
    last = np.concatenate(lasts)
    virt = first_virtual + np.arange(len(f))
    # the virtual node of instance k depends on every dependency of its first row f[k]
    lo = np.searchsorted(dst_sorted, f, "left")
    hi = np.searchsorted(dst_sorted, f, "right")
    cnt = hi - lo
    idx = np.repeat(lo - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt) + np.arange(int(cnt.sum()))
    srcs.append(src_by_dst[idx] + off)
    dsts.append(np.repeat(virt, cnt))
    srcs.append(virt)
    dsts.append(last + off)
    virt_w.extend(np.concatenate(ws).tolist())


def _between(size: int, e_src: np.ndarray, e_dst: np.ndarray) -> np.ndarray | None:
    """Rows of a program (of ``size`` rows, internal edges ``e_src -> e_dst``) that depend on its
    first row and that its last row depends on (both included); None when the last does not
    depend on the first."""
    succ: dict[int, list[int]] = {}
    pred: dict[int, list[int]] = {}
    for s, d in zip(e_src.tolist(), e_dst.tolist()):
        succ.setdefault(s, []).append(d)
        pred.setdefault(d, []).append(s)

    def reach(start: int, nxt: dict[int, list[int]]) -> set[int]:
        seen = {start}
        stack = [start]
        while stack:
            for v in nxt.get(stack.pop(), ()):
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return seen

    down = reach(0, succ)
    if size - 1 not in down:
        return None
    return np.asarray(sorted(down & reach(size - 1, pred)), np.int64)


def _earliest_starts(n: int, src: np.ndarray, dst: np.ndarray, dur: np.ndarray) -> np.ndarray | None:
    """Each node's earliest start when it starts once every node it depends on (edges ``src ->
    dst``) has run ``dur``, sources at 0 — Kahn's algorithm (what
    :func:`ettools.graph_algorithms.topological_sort` computes as its ``asap``, in one tight loop:
    the graphs here are long chains, processed node by node anyway); None when they form a cycle."""
    order = np.argsort(src, kind="stable")
    succ = dst[order].tolist()
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    ptr_l = ptr.tolist()
    indeg = np.bincount(dst, minlength=n).tolist()
    d = dur.tolist()
    start = [0.0] * n
    stack = np.flatnonzero(np.bincount(dst, minlength=n) == 0).tolist()
    pop, push = stack.pop, stack.append
    done = 0
    while stack:
        u = pop()
        done += 1
        e = start[u] + d[u]
        for v in succ[ptr_l[u]:ptr_l[u + 1]]:
            if e > start[v]:
                start[v] = e
            indeg[v] -= 1
            if not indeg[v]:
                push(v)
    return np.asarray(start) if done == n else None
