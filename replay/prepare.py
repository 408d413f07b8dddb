"""From a :class:`~ettools.graph.Trace` to the engine's :class:`~.engine.Program`.

Per rank (:func:`prepare_rank`):

* **Form.** A graph with nesting (Kineto, PyTorch ET + Kineto) is rewritten by
  :func:`ettools.replayable.to_replayable` into completion semantics: host threads as chains of
  slices with their idle gaps, launches cut at their launch point, syncs as waits. A graph that is
  already a dependency graph (Chakra, ASTRA-sim JSON, synthesized) is used as it is. A nested graph
  the pass cannot handle (missing start times, an inconsistent linked graph) falls back to its
  top-level host ops plus device and communication nodes, ``form = "fallback"``.
* **Waits the trace does not record.** ``loss.backward()`` leaves the main thread idle while the
  autograd thread runs the backward: a long idle stretch of one host thread, during which another
  thread of the rank was busy and right after whose last op the idle thread resumed, becomes a wait
  on that op (``SYNC_GUESSED``; see :func:`_cross_thread_waits`). Waits the measured times
  contradict (a pageable copy flagged blocking that started after its call returned; a gloo span
  "issued" by an op that started after it) are dropped (:func:`_drop_contradicted_waits`).
* **Lanes.** A node's resource (``thread …``, ``stream …``) is its lane: one node at a time. Nodes
  without one go to the rank's ``host`` lane (``is_cpu_op`` 1) or ``device`` lane (compute on the
  device: one kernel at a time, as ASTRA-sim runs GPU compute nodes); communication nodes without a
  resource and host-side transfers (gloo spans) have no lane.
* **Sources.** Nodes without any dependency start at time 0 — in a measured trace, the first slice
  of each host thread, at the rank's first event (ranks are offset by when their traces begin). A
  measured node that has no modelled cause at all (a transfer the linker left without its issuing
  op) starts where the trace shows it: an initial condition, not a replayed start.
* **Launch queue** (Kineto GPU traces). Launches are numbered in launch order (CUPTI
  ``correlation``); launch ``k`` may only begin once the device op launched ``Q`` places earlier has
  started (a *start* dependency). ``Q`` is the depth the reader inferred from blocked launches
  (``meta["launch_queue_depth"]``) or the hardware's (1024), raised to one more than the most ops
  ever outstanding in the trace so an unblocked launch is never held. Launches flagged
  ``launch_blocked`` replay the median duration of unblocked launches of the same call instead of
  their measured (blocked) one; other slow launches (module loading) keep theirs.
* **Durations** from :func:`.compute.node_durations`; host nodes keep their measured time.

Across ranks (:func:`build_program`): the k-th collective of a process group on each member (program
order, as :func:`ettools.collate.match_collectives` matches them) forms one *instance*; the i-th
send of channel (src, dst, tag) and the i-th recv of that channel form a pair. Pairs of dependency
graphs (Chakra, synthesized) have eager sends, as in ASTRA-sim; pairs of measured traces rendezvous
(both sides end together, the transfer after the later one started), as NCCL send/recv kernels do. Collectives whose group
has members absent from the trace (two ranks of a 128-rank job) and sends/recvs whose peer is absent
cannot be modelled: they replay their measured duration locally (or, lacking one, the network's time
as if every member arrived together). A member that lacks an instance the others reach makes the
replay deadlock, and the report names it.

Transfer time of an instance: the network's closed form when a network is given; otherwise, for a
trace with measured times, the shortest measured duration among the members (the last member to
arrive waited least: its kernel or gloo span is the transfer itself); otherwise the default network
of the hardware description. With a congestion-aware network the instance is handed to the flow
simulation instead.

**Symmetry** (``symmetric=True``, :func:`symmetry_classes`): ranks are partitioned by colour
refinement — initial colour a hash of everything that decides their timing (node types, modelled
durations, lanes, dependencies, collective types, bytes and transfer times), refined by the colours
of their collective groups' members and send/recv peers until stable. Ranks of one class reach every
collective at the same time, so one representative per class is simulated; a collective among
members of several classes waits for each class's representative.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.checks import structure_key, topological_sort
from ettools.collate import group_members, program_order
from ettools.errors import TraceError
from ettools.graph import COMM_NODE_TYPES, CollectiveType, EdgeKind, NodeType, RankGraph, Trace
from ettools.replayable import DEVICE_HOLD, measured_rows, to_replayable

from . import compute as cm
from .engine import COLL, COMPUTE, P2P, Instance, Program
from .network import Network, default_network

log = logging.getLogger(__name__)


@dataclass
class RankPrep:
    """One rank made ready for the engine."""

    rank: int
    source: RankGraph
    graph: RankGraph
    form: str  # kineto | graph | fallback
    dur: np.ndarray
    dur_src: np.ndarray
    lane: np.ndarray  # local lane index, -1 none
    lane_names: list[str]
    kind: np.ndarray
    start_dep_src: np.ndarray  # rows whose *start* releases start_dep_dst
    start_dep_dst: np.ndarray
    features: tuple[np.ndarray, np.ndarray]
    release: float = 0.0
    measured_span: float | None = None
    steps: list[tuple[str, float, float]] = field(default_factory=list)
    step_rows: list[np.ndarray] = field(default_factory=list)  # host slices of each step
    step_device_rows: list[np.ndarray] = field(default_factory=list)  # device ops each step launched
    step_bounds: list[tuple[float, float]] = field(default_factory=list)  # measured (start, boundary) of each step
    span_rows: np.ndarray | None = None  # rows whose end ends the rank's span
    notes: dict[str, Any] = field(default_factory=dict)
    contention: np.ndarray | None = None  # per node: contention slope of its op-model time (0: none)


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
    _, cyclic, _ = topological_sort(g)
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


def _lanes(g: RankGraph) -> tuple[np.ndarray, list[str]]:
    """Local lane per node and lane names (see module doc)."""
    comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    res = g.resource.astype(np.int64)
    # host-side transfers (gloo) run beside their thread's work: no lane (ORDER edges keep their order)
    key = np.where(comm & ((res < 0) | (g.is_cpu_op == 1)), -9,
                   np.where(res >= 0, res, np.where(g.is_cpu_op == 1, -2, -3)))
    uniq, inv = np.unique(key, return_inverse=True)
    names: list[str] = []
    lane_of_key = np.full(len(uniq), -1, np.int64)
    for j, k in enumerate(uniq.tolist()):
        if k == -9:
            continue
        name = "host" if k == -2 else ("device" if k == -3 else g.strings[k])
        if k >= 0 and name.endswith(" p2p"):
            continue
        lane_of_key[j] = len(names)
        names.append(name)
    return lane_of_key[inv.reshape(-1)], names


def _launch_queue(g: RankGraph, rg: RankGraph, dur: np.ndarray, hw: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Start dependencies of the bounded launch queue; shortens blocked launches in ``dur`` (in place)."""
    info: dict[str, Any] = {}
    src, dst, kind = rg.edge_rows()
    sel = (kind == EdgeKind.LAUNCH) & (src >= 0)
    sel &= (rg.is_cpu_op[np.maximum(src, 0)] == 1) & (rg.is_cpu_op[dst] == 0)
    l_src, l_dst = src[sel], dst[sel]
    empty = np.zeros(0, np.int64)
    if len(l_dst) < 2:
        return empty, empty, info
    corr_col = rg.attrs.get("correlation")
    order_key = np.full(len(rg), np.inf)
    if corr_col is not None:
        order_key[corr_col.rows] = np.asarray(corr_col.values, np.float64)
    missing = ~np.isfinite(order_key[l_dst])
    order_key[l_dst[missing]] = rg.start[l_src[missing]]
    devs = np.unique(l_dst)
    devs = devs[np.lexsort((devs, order_key[devs]))]
    idx = np.full(len(rg), -1, np.int64)
    idx[devs] = np.arange(len(devs))
    call_idx = np.full(len(rg), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(call_idx, l_src, idx[l_dst])
    calls = np.unique(l_src)
    k = call_idx[calls]
    # most ops ever outstanding when a launch began, in the trace: counted from the first op (in
    # launch order) not started by then — streams start out of launch order (an op held on one
    # stream while later ones run on another), and the queue must not hold a launch the trace shows
    first_unstarted = np.searchsorted(np.maximum.accumulate(rg.start[devs]), rg.start[calls], side="left")
    peak = int((k - first_unstarted).max()) if len(calls) else 0
    q_meta = g.meta.get("launch_queue_depth")
    q = int(q_meta) if q_meta else int(hw.get("launch_queue_depth", 1024))
    q = max(q, peak + 1)
    info.update(launch_queue_depth=q, launch_queue_peak=peak)
    gated = k >= q
    s_src = devs[k[gated] - q]
    s_dst = calls[gated]
    # blocked launches replay an unblocked launch's duration
    bcol = rg.attrs.get("launch_blocked")
    nb = 0
    if bcol is not None and len(bcol.rows):
        blocked_rows = bcol.rows[np.asarray(bcol.values, bool)]
        blocked_rows = blocked_rows[np.isin(blocked_rows, calls)]
        if len(blocked_rows):
            lt = g.meta.get("launch_typical_us")  # a Chakra file ettools wrote keeps the source's medians
            typical = ({g.strings.lookup(k): v for k, v in lt.items()} if isinstance(lt, dict)
                       else _typical_launch_dur(g))
            orig = rg.attrs.get("orig")
            tail_of: dict[int, int] = {}
            if orig is not None:
                # the piece after the launch point: same thread, next in time, orig == the call's id
                vals = np.asarray(orig.values, np.int64)
                pos = {}
                for r, v in zip(orig.rows.tolist(), vals.tolist()):
                    pos.setdefault(v, []).append(r)
                for b in blocked_rows.tolist():
                    for r in pos.get(int(rg.id[b]), []):
                        if rg.resource[r] == rg.resource[b] and rg.start[r] >= rg.start[b]:
                            tail_of[b] = r
                            break
            for b in blocked_rows.tolist():
                t = typical.get(int(rg.name[b]))
                if t is None:
                    continue
                head = min(float(dur[b]), t)
                dur[b] = head
                tail = tail_of.get(b)
                if tail is not None:
                    dur[tail] = max(t - head, 0.0)
                nb += 1
    info["launch_blocked_shortened"] = nb
    return s_src.astype(np.int64), s_dst.astype(np.int64), info


def _typical_launch_dur(g: RankGraph) -> dict[int, float]:
    """Median duration of unblocked launch calls, per call name (interned id)."""
    src, dst, kind = g.edge_rows()
    sel = (kind == EdgeKind.LAUNCH) & (src >= 0)
    calls = np.unique(src[sel])
    calls = calls[g.is_cpu_op[calls] == 1]
    blocked = np.zeros(len(g), bool)
    bcol = g.attrs.get("launch_blocked")
    if bcol is not None:
        blocked[bcol.rows[np.asarray(bcol.values, bool)]] = True
    calls = calls[~blocked[calls]]
    out: dict[int, float] = {}
    names = g.name[calls]
    for nm in np.unique(names).tolist():
        out[int(nm)] = float(np.median(g.dur[calls[names == nm]]))
    return out


WHAT_IF_KEYS = ("device", "host", "host_gap", "comm")


def what_if_masks(rg: RankGraph) -> dict[str, np.ndarray]:
    """Node masks the ``what_if`` factors scale: device compute ops, host nodes, host idle gaps."""
    comm = np.isin(rg.type, [int(t) for t in COMM_NODE_TYPES])
    gap = rg.strings.lookup("host_gap")
    is_gap = (rg.name == gap) if gap >= 0 else np.zeros(len(rg), bool)
    # a device hold is a measured wait the trace does not explain, not device work: never scaled
    hold = rg.strings.lookup(DEVICE_HOLD)
    is_hold = (rg.name == hold) if hold >= 0 else np.zeros(len(rg), bool)
    return {"device": (rg.is_cpu_op != 1) & ~comm & ~is_hold, "host": (rg.is_cpu_op == 1) & ~comm,
            "host_gap": is_gap}


def prepare_rank(g: RankGraph, timing: str, hw: dict[str, Any], fit: Any = None,
                 astra_roofline: tuple[float, float] | None = None, cache: dict | None = None,
                 what_if: dict[str, float] | None = None) -> RankPrep:
    """Everything rank-local the engine needs (see the module docstring).

    ``cache``: shared between calls; ranks stamped from one graph (same arrays, no nesting) reuse
    the durations, lanes and features computed for the first of them.
    """
    ckey = None
    if cache is not None and not _is_nested(g) and not what_if:
        c = g.columns
        res = c["resource"]
        ckey = (structure_key(g), id(c["dur"]), id(c["type"]), id(c["is_cpu_op"]), _digest(res),
                id(c["num_ops"]), id(c["tensor_size"]), id(g.tensors) if len(g.tensors) else 0)
        hit = cache.get(ckey)
        if hit is not None:
            return RankPrep(g.rank, g, g, "graph", hit.dur, hit.dur_src, hit.lane, hit.lane_names, hit.kind,
                            hit.start_dep_src, hit.start_dep_dst, hit.features,
                            measured_span=hit.measured_span, notes=dict(hit.notes), contention=hit.contention)
    rg, form = replayable_form(g, cache)
    feats_src = cm.node_features(g)
    if rg is g:
        feats = feats_src
    else:
        rows = g.rows_of(rg.id)
        ok = rows >= 0
        # pieces of host ops get new ids; ids of kept nodes are unique in g
        f0 = np.full(len(rg), -1.0)
        f1 = np.full(len(rg), -1.0)
        f0[ok] = feats_src[0][rows[ok]]
        f1[ok] = feats_src[1][rows[ok]]
        feats = (f0, f1)
    dur, dsrc, cont = cm.node_timing(rg, timing, hw, fit, feats, astra_roofline,
                                     source=g if form == "fallback" else None)
    gap = g.meta.get("chakra_stream_gap_us") if form == "graph" else None
    if gap:
        # a Chakra file ettools wrote keeps measured device durations and the stream's per-op gap
        # apart (GlobalMetadata): add the gap back as to_replayable does for a Kineto graph
        dur = np.where((rg.is_cpu_op == 0) & (dsrc == cm.MEASURED), dur + float(gap), dur)
    lane, lane_names = _lanes(rg)
    kind = np.full(len(rg), COMPUTE, np.int8)
    kind[rg.type == NodeType.COMM_COLL_NODE] = COLL
    kind[(rg.type == NodeType.COMM_SEND_NODE) | (rg.type == NodeType.COMM_RECV_NODE)] = P2P
    notes: dict[str, Any] = {}
    if form == "kineto" or (form == "graph" and "launch_typical_us" in g.meta):
        s_src, s_dst, info = _launch_queue(g, rg, dur, hw)
        notes.update(info)
    else:
        s_src = s_dst = np.zeros(0, np.int64)
    if what_if:
        masks = what_if_masks(rg)
        for key, factor in what_if.items():
            if key in masks:
                dur = np.where(masks[key], dur * float(factor), dur)
    prep = RankPrep(g.rank, g, rg, form, dur, dsrc, lane, lane_names, kind, s_src, s_dst, feats, notes=notes,
                    contention=cont)
    if form == "kineto" and len(g):
        mr = measured_rows(g)
        prep.measured_span = float((g.start + g.dur)[mr].max() - g.start.min())
        prep.span_rows = measured_rows(rg)
        _steps(prep)
    elif len(g) and np.isfinite(g.start).all() and np.isfinite(g.dur).all():
        prep.measured_span = float((g.start + g.dur).max() - g.start.min())
    if form == "graph" and len(g) and g.meta.get("steps"):
        _steps(prep)  # ProfilerSteps a Chakra file ettools wrote keeps in its GlobalMetadata
    if ckey is not None:
        cache[ckey] = prep
    return prep


def _steps(prep: RankPrep) -> None:
    """Host slices of each ProfilerStep of the rank (its thread, the step's measured span)."""
    g, rg = prep.source, prep.graph
    steps = g.meta.get("steps") or []
    if not steps:
        return
    names = g.names()
    # each device op belongs to the step its launch call ran in (an op launched before the trace
    # window, to the step it ran in)
    src, dst, kind = rg.edge_rows()
    sel = (kind == EdgeKind.LAUNCH) & (src >= 0)
    launched = rg.start.astype(float).copy()
    launched[dst[sel]] = rg.start[src[sel]]
    dev = rg.is_cpu_op != 1
    dev_end = np.where(dev & np.isfinite(rg.dur), rg.start + np.nan_to_num(rg.dur), -np.inf)
    for name, s, e in steps:
        rows = [i for i, nm in enumerate(names) if nm == name]
        if not rows:
            continue
        res = g.resource[rows[0]]
        on = np.flatnonzero((rg.resource == res) & (rg.is_cpu_op == 1) & (rg.start >= s - 1e-3) & (rg.start < e - 1e-3))
        if len(on):
            prep.steps.append((name, float(s), float(e)))
            prep.step_rows.append(on)
            drows = np.flatnonzero(dev & (launched >= s - 1e-3) & (launched < e - 1e-3))
            prep.step_device_rows.append(drows)
            host_end = float((rg.start[on] + np.nan_to_num(rg.dur[on])).max())
            bound = max(host_end, float(dev_end[drows].max())) if len(drows) else host_end
            prep.step_bounds.append((float(rg.start[on].min()), bound))


# ---- symmetry --------------------------------------------------------------------------------------

def _digest(*arrays: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    return h.digest()


def symmetry_classes(trace: Trace, preps: dict[int, RankPrep], comm_time: dict[int, np.ndarray],
                     releases: dict[int, float] | None = None) -> dict[int, int]:
    """``{rank: representative rank}`` by colour refinement (see the module docstring); ranks
    released at different times (``releases``, rank skew) are never symmetric."""
    ranks = sorted(preps)
    base: dict[int, bytes] = {}
    cache: dict[tuple, bytes] = {}
    for r in ranks:
        p = preps[r]
        g = p.graph
        key = (structure_key(g), id(p.dur))
        d = cache.get(key)
        if d is None:
            d = _digest(g.type, p.dur, p.lane, g.dep_ptr, g.dep_id, g.comm_type, g.comm_bytes,
                        g.comm_tag, p.start_dep_src, p.start_dep_dst)
            cache[key] = d
        rel = np.array([(releases or {}).get(r, 0.0)], np.float64)
        base[r] = _digest(np.frombuffer(d, np.uint8), comm_time[r], rel)
    colour = _compact(base, ranks)
    groups_of: dict[int, list[tuple[int, ...]]] = {}
    peers_of: dict[int, np.ndarray] = {}
    for r in ranks:
        g = preps[r].graph
        rows = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
        gids = g.comm_group[rows]
        mem = []
        for gi in np.unique(gids).tolist():
            nm = g.strings[gi] if gi >= 0 else ""
            m = group_members(trace, nm) or ()
            mem.append(tuple(m))
        groups_of[r] = mem
        prow = np.flatnonzero((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE))
        peers_of[r] = g.comm_peer[prow].astype(np.int64)
    for _ in range(len(ranks)):
        new: dict[int, bytes] = {}
        for r in ranks:
            gsig = sorted(tuple(sorted(colour.get(m, -1) for m in mem)) for mem in groups_of[r])
            psig = np.array([colour.get(int(q), -1) for q in peers_of[r].tolist()], np.int64)
            new[r] = _digest(np.array([colour[r]], np.int64), np.frombuffer(repr(gsig).encode(), np.uint8), psig)
        nc = _compact(new, ranks)
        if len(set(nc.values())) == len(set(colour.values())):
            colour = nc
            break
        colour = nc
    rep: dict[int, int] = {}
    first: dict[int, int] = {}
    for r in ranks:
        c = colour[r]
        first.setdefault(c, r)
        rep[r] = first[c]
    return rep


def _compact(h: dict[int, bytes], ranks: list[int]) -> dict[int, int]:
    ids: dict[bytes, int] = {}
    return {r: ids.setdefault(h[r], len(ids)) for r in ranks}


# ---- instances and the program ---------------------------------------------------------------------

@dataclass
class Built:
    """A program plus what reports need to map it back to the trace."""

    program: Program
    preps: dict[int, RankPrep]
    sim_ranks: list[int]
    rep_of: dict[int, int]
    local_comm: int = 0  # comm nodes replayed locally (group or peer absent)


def _comm_rows(g: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    p2p = np.flatnonzero((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE))
    return coll, p2p


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the columns ``cols`` (as an ``(k, len(cols))`` int64 array) and each row's
    index among them — ``np.unique(axis=0)`` through one 1-D key of per-column codes (several
    times faster: no structured-array sort)."""
    key = np.zeros(len(cols[0]), np.int64)
    for i, c in enumerate(cols):
        vals, code = np.unique(np.asarray(c, np.int64), return_inverse=True)
        key = key * len(vals) + code.reshape(-1)
        if i < len(cols) - 1:  # re-code so the key stays below len(rows) (no int64 overflow)
            key = np.unique(key, return_inverse=True)[1].reshape(-1)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return np.stack([np.asarray(c, np.int64)[first] for c in cols], axis=1), inv.reshape(-1)


def comm_times(trace: Trace, preps: dict[int, RankPrep], net: Network | None, hw: dict[str, Any]) -> dict[int, np.ndarray]:
    """Per rank, the network time (µs) of each comm node as if all its members arrived together
    (NaN where unknown): the closed form of ``net`` or, without one, the hardware's default network.
    Computed once per distinct (group, type, bytes) and (type, peer, bytes) of a rank."""
    world = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)
    model = net if net is not None else default_network(world, hw)
    out: dict[int, np.ndarray] = {}
    members_of: dict[str, tuple[int, ...] | None] = {}
    for r, p in preps.items():
        g = p.graph
        t = np.full(len(g), np.nan)
        coll, p2p = _comm_rows(g)
        if len(coll):
            uniq, inv = _unique_rows(g.comm_group[coll], g.comm_type[coll], g.comm_bytes[coll])
            vals = np.full(len(uniq), np.nan)
            for k, (gi, ct, b) in enumerate(uniq.tolist()):
                nm = g.strings[gi] if gi >= 0 else ""
                if nm not in members_of:
                    members_of[nm] = group_members(trace, nm)
                mem = members_of[nm]
                if mem is None or b < 0:
                    continue
                vals[k] = model.collective_time(ct, b, tuple(mem)) / 1000.0
            t[coll] = vals[inv.reshape(-1)]
        if len(p2p):
            uniq, inv = _unique_rows(g.type[p2p] == NodeType.COMM_SEND_NODE, g.comm_peer[p2p], g.comm_bytes[p2p])
            vals = np.full(len(uniq), np.nan)
            for k, (is_send, peer, b) in enumerate(uniq.tolist()):
                if peer < 0 or b < 0 or peer >= max(world, model.npus or world):
                    continue
                a, z = (r, peer) if is_send else (peer, r)
                vals[k] = model.send_time(a, z, b) / 1000.0
            t[p2p] = vals[inv.reshape(-1)]
        out[r] = t
    return out


def build_program(trace: Trace, preps: dict[int, RankPrep], net: Network | None, hw: dict[str, Any],
                  rep_of: dict[int, int] | None = None, ctimes: dict[int, np.ndarray] | None = None,
                  overlap_slowdown: float = 0.0, align_ranks: bool = False) -> Built:
    """Flatten the prepared ranks (representatives only, under symmetry) into a :class:`Program`.

    ``align_ranks``: release every rank at time 0 (the no-skew answer) instead of at its first
    traced event on the job's clock (see :func:`rank_releases`).
    """
    all_ranks = sorted(preps)
    rep_of = rep_of or {r: r for r in all_ranks}
    sim = sorted(set(rep_of.values()))
    present = set(trace.graphs)
    if ctimes is None:
        ctimes = comm_times(trace, {r: preps[r] for r in sim}, net, hw)
    flow_mode = net is not None and net.congestion
    offsets = [0]
    for r in sim:
        offsets.append(offsets[-1] + len(preps[r].graph))
    n = offsets[-1]
    dur = np.concatenate([preps[r].dur for r in sim]) if sim else np.zeros(0)
    kind = np.concatenate([preps[r].kind for r in sim]) if sim else np.zeros(0, np.int8)
    lane = np.full(n, -1, np.int64)
    lane_names: list[str] = []
    for j, r in enumerate(sim):
        p = preps[r]
        loc = p.lane
        lane[offsets[j]:offsets[j + 1]] = np.where(loc >= 0, loc + len(lane_names), -1)
        lane_names += [f"rank {r} {nm}" for nm in p.lane_names]
    rank_of = np.repeat(np.arange(len(sim), dtype=np.int32), np.diff(offsets))
    node_row = np.concatenate([np.arange(len(preps[r].graph)) for r in sim]) if sim else np.zeros(0, np.int64)
    inst = np.full(n, -1, np.int64)
    instances: list[Instance] = []
    inst_dur: list[float] = []
    flow_steps: dict[int, list] = {}
    keymap: dict[tuple, int] = {}
    local = 0
    world = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)

    def add_instance(key: tuple, k: int, label: str, members: tuple[int, ...], need: int) -> int:
        i = keymap.get(key)
        if i is None:
            i = keymap[key] = len(instances)
            instances.append(Instance(k, label, members, need))
            inst_dur.append(np.nan)
        return i

    measured_by_inst: dict[int, list[float]] = {}
    members_cache: dict[str, Any] = {}
    coll_names: dict[int, str] = {}
    topo: dict[tuple, np.ndarray] = {}  # topological positions per shared graph structure
    model_by_inst: dict[int, float] = {}
    for j, r in enumerate(sim):
        p = preps[r]
        g = p.graph
        off = offsets[j]
        coll, p2p = _comm_rows(g)
        ct = ctimes[r]
        if len(coll):
            gid = g.comm_group[coll].astype(np.int64)
            okey = issue_order(g, coll, topo)
            o = np.lexsort((okey, gid))
            rows_sorted, gid_sorted = coll[o], gid[o]
            new = np.ones(len(o), bool)
            new[1:] = gid_sorted[1:] != gid_sorted[:-1]
            seg = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
            kth = np.arange(len(o)) - seg
            role_count: dict[tuple, int] = {}
            ginfo: dict[int, tuple | None] = {}  # per group of this rank: (name, members, key prefix, need)
            durs = g.dur[rows_sorted].tolist()
            starts = g.start[rows_sorted].tolist()
            ctypes = g.comm_type[rows_sorted].tolist()
            cts = ct[rows_sorted].tolist()
            for j, (row, gi, k) in enumerate(zip(rows_sorted.tolist(), gid_sorted.tolist(), kth.tolist())):
                info = ginfo.get(gi, False)
                if info is False:
                    gname = g.strings[gi] if gi >= 0 else ""
                    mem = members_cache.get(gname, False)
                    if mem is False:
                        mem = members_cache[gname] = group_members(trace, gname)
                    if mem is None or not present.issuperset(mem) or r not in mem:
                        info = None
                    else:
                        reps = tuple(sorted({rep_of[m] for m in mem}))
                        if len(sim) == len(all_ranks):
                            prefix = ("c", gname)
                        else:  # symmetric: the n-th group of this class pattern on the representative
                            base = ("c", reps)
                            prefix = base + (role_count.get(base, 0),)
                            role_count[base] = role_count.get(base, 0) + 1
                        info = (gname, tuple(mem), prefix, len(reps))
                    ginfo[gi] = info
                if info is None:
                    dur[off + row] = _local_time(g, row, ct)
                    kind[off + row] = COMPUTE
                    local += 1
                    continue
                gname, mem, prefix, need = info
                ctype = ctypes[j]
                cname = coll_names.get(ctype)
                if cname is None:
                    try:
                        cname = CollectiveType(ctype).name.lower()
                    except ValueError:
                        cname = f"collective type {ctype}"
                    coll_names[ctype] = cname
                key = prefix + (k,)
                i = keymap.get(key)
                if i is None:
                    i = add_instance(key, COLL, f"{cname} #{k} of group {gname!r}", mem, need)
                inst[off + row] = i
                d = durs[j]
                if d == d and d >= 0:
                    measured_by_inst.setdefault(i, []).append((starts[j], d))
                if cts[j] == cts[j]:
                    model_by_inst[i] = cts[j]
                if flow_mode and i not in flow_steps:
                    flow_steps[i] = net.collective_steps(ctype, max(int(g.comm_bytes[row]), 0), mem)
        if len(p2p):
            # measured traces (NCCL send/recv kernels, gloo spans) rendezvous; dependency graphs
            # (Chakra, synthesized) have ASTRA-sim's eager sends
            measured_pair = p.form == "kineto"
            okey = issue_order(g, p2p, topo)
            order = p2p[np.argsort(okey, kind="stable")]
            count: dict[tuple, int] = {}
            for row in order.tolist():
                peer = int(g.comm_peer[row])
                is_send = g.type[row] == NodeType.COMM_SEND_NODE
                if peer < 0 or peer >= world or peer not in present:
                    dur[off + row] = _local_time(g, row, ct)
                    kind[off + row] = COMPUTE
                    local += 1
                    continue
                a, b = (r, peer) if is_send else (peer, r)
                ra, rb = rep_of.get(a, a), rep_of.get(b, b)
                chan = (ra, rb, int(g.comm_tag[row]), bool(is_send))
                k = count.get(chan, 0)
                count[chan] = k + 1
                key = ("p", ra, rb, int(g.comm_tag[row]), k)
                i = add_instance(key, P2P, f"send/recv {a}->{b} tag {int(g.comm_tag[row])} #{k}", (a, b), 2)
                inst[off + row] = i
                if measured_pair:
                    kind[off + row] = COLL  # rendezvous: measured send/recv kernels (spans) wait for each other
                d = g.dur[row]
                if np.isfinite(d) and d >= 0:
                    measured_by_inst.setdefault(i, []).append((float(g.start[row]), float(d)))
                if np.isfinite(ct[row]):
                    model_by_inst[i] = float(ct[row])
                if flow_mode and i not in flow_steps:
                    flow_steps[i] = [[(a, b, max(int(g.comm_bytes[row]), 0))]]
    idur = np.asarray(inst_dur, np.float64)
    for i in range(len(instances)):
        if flow_mode:
            idur[i] = np.nan
        elif net is not None and i in model_by_inst:
            idur[i] = model_by_inst[i]
        elif i in measured_by_inst:
            idur[i] = measured_transfer(measured_by_inst[i])
        elif i in model_by_inst:
            idur[i] = model_by_inst[i]
        else:
            idur[i] = 0.0
    # edges
    e_src, e_dst, s_src, s_dst = [], [], [], []
    for j, r in enumerate(sim):
        p = preps[r]
        src, dst, _ = p.graph.edge_rows()
        ok = src >= 0
        e_src.append(src[ok] + offsets[j])
        e_dst.append(dst[ok] + offsets[j])
        s_src.append(p.start_dep_src + offsets[j])
        s_dst.append(p.start_dep_dst + offsets[j])
    e_src_a = np.concatenate(e_src) if e_src else np.zeros(0, np.int64)
    e_dst_a = np.concatenate(e_dst) if e_dst else np.zeros(0, np.int64)
    s_src_a = np.concatenate(s_src) if s_src else np.zeros(0, np.int64)
    s_dst_a = np.concatenate(s_dst) if s_dst else np.zeros(0, np.int64)
    succ_ptr, succ = _csr(e_src_a, e_dst_a, n)
    ssucc_ptr, ssucc = _csr(s_src_a, s_dst_a, n)
    indeg = np.bincount(e_dst_a, minlength=n) + np.bincount(s_dst_a, minlength=n)
    # release: each rank's first event, relative to the earliest rank (measured traces on one
    # clock: rank skew is replayed); sources that start later in the trace than their rank's first
    # event (orphans) at their own start, relative to their rank's
    release = np.zeros(n)
    starts = first_events(preps, sim)
    rel = rank_releases(preps, sim, align_ranks)
    rank_release = np.asarray([rel.get(r, 0.0) for r in sim], np.float64)
    for j, r in enumerate(sim):
        if r in starts:
            a, z = offsets[j], offsets[j + 1]
            release[a:z] = rel[r]
            rg_start = preps[r].graph.start
            src_rows = np.flatnonzero(indeg[a:z] == 0)
            late = src_rows[np.isfinite(rg_start[src_rows]) & (rg_start[src_rows] > starts[r])]
            release[a + late] = rg_start[late] - starts[r] + rel[r]
    prog = Program(
        dur=np.nan_to_num(dur, nan=0.0), lane=lane, kind=kind, inst=inst, succ_ptr=succ_ptr, succ=succ,
        ssucc_ptr=ssucc_ptr, ssucc=ssucc, indeg=indeg.astype(np.int64), rank_of=rank_of, release=release,
        inst_dur=idur, instances=instances, ranks=sim, node_row=node_row,
        rank_offset=np.asarray(offsets, np.int64), lane_names=lane_names, overlap_slowdown=overlap_slowdown,
        flow_steps=flow_steps, rank_release=rank_release,
    )
    if isinstance(net, Network) and net.dims and net.system.from_file:
        astrasim_lanes(prog, [preps[r].graph for r in sim], offsets)
    elif isinstance(net, Network) and net.dims:
        # ASTRA-sim's system layer: a rank's collectives one at a time (see replay/engine.py)
        prog.serialize_colls = "lifo" if net.system.lifo else "fifo"
    if sim and any(preps[r].contention is not None and preps[r].contention.any() for r in sim):
        prog.contention = np.concatenate([preps[r].contention if preps[r].contention is not None
                                          else np.zeros(len(preps[r].graph)) for r in sim])
    prog.is_send = np.concatenate([preps[r].graph.type == NodeType.COMM_SEND_NODE for r in sim]) if sim else np.zeros(0, bool)
    prog.node_ids = np.concatenate([preps[r].graph.id for r in sim]) if sim else np.zeros(0, np.uint64)
    prog.node_names = lambda ri, row: preps[sim[ri]].graph.name_of(row)
    return Built(prog, preps, sim, rep_of, local)


def astrasim_lanes(prog: Program, graphs: list[RankGraph], offsets: list[int]) -> None:
    """ASTRA-sim's execution model (``--network`` YAML with ``--collectives`` SYS): per rank one host
    node (``is_cpu_op``), one device compute node and one collective or send at a time, whatever
    thread or stream a node came from; a recv holds nothing. A freed resource goes to the waiting
    node of smallest id (ASTRA-sim's feeder hands out dependency-free nodes in id order)."""
    n = prog.n
    lane = np.full(n, -1, np.int64)
    names: list[str] = []
    for j, g in enumerate(graphs):
        a, z = offsets[j], offsets[j + 1]
        t = g.type
        comm = (t == NodeType.COMM_COLL_NODE) | (t == NodeType.COMM_SEND_NODE)
        host = (t == NodeType.COMP_NODE) & (g.is_cpu_op == 1)
        dev = (t == NodeType.COMP_NODE) & (g.is_cpu_op != 1)
        base = len(names)
        lane[a:z] = np.select([host, dev, comm], [base, base + 1, base + 2], -1)
        names += [f"rank {prog.ranks[j]} host", f"rank {prog.ranks[j]} device", f"rank {prog.ranks[j]} comm"]
    prog.lane = lane
    prog.lane_names = names
    prog.lane_by_id = True


def first_events(preps: dict[int, RankPrep], ranks: list[int] | None = None) -> dict[int, float]:
    """Start of each measured rank's first kept event (µs on the trace's clock). Only measured
    traces (Kineto form, every start known) have one; other ranks start at 0."""
    ranks = sorted(preps) if ranks is None else ranks
    return {r: float(preps[r].source.start.min()) for r in ranks
            if len(preps[r].source) and np.isfinite(preps[r].source.start).all()
            and (preps[r].form == "kineto" or (preps[r].form == "graph" and "rank_clock" in preps[r].source.meta))}


def rank_releases(preps: dict[int, RankPrep], ranks: list[int] | None = None,
                  align_ranks: bool = False) -> dict[int, float]:
    """When each rank starts in the replay (µs): its first traced event relative to the earliest
    rank's, so ranks that entered the step late (a slow data loader, a straggler) enter it late in
    the replay too and their peers wait for them in collectives; all 0 with ``align_ranks`` (the
    no-skew answer) or when the trace has no measured times. The reader puts ranks on one clock
    when the files allow (``meta.extra["rank_clock"]``), else at their own first event."""
    ranks = sorted(preps) if ranks is None else ranks
    starts = first_events(preps, ranks)
    t0 = min(starts.values()) if starts else 0.0
    return {r: (0.0 if align_ranks or r not in starts else starts[r] - t0) for r in ranks}


def issue_order(g: RankGraph, rows: np.ndarray, topo: dict | None = None) -> np.ndarray:
    """Program-order key of comm nodes: when they were issued (the start of the host slice that
    launched them, through a ``comm_dispatch`` node for host transfers), else their own position
    (:func:`ettools.collate.program_order`). gloo runs collectives on several runloop threads, so
    their own start times need not follow the order the program issued them in."""
    base = program_order(g, rows, topo).astype(np.float64)
    if not len(rows) or not np.isfinite(g.start[rows]).all():
        return base
    src, dst, kind = g.edge_rows()
    ok = src >= 0
    src, dst, kind = src[ok], dst[ok], kind[ok]
    issue = np.full(len(g), np.nan)
    lsel = kind == EdgeKind.LAUNCH
    issue[dst[lsel]] = g.start[src[lsel]]
    disp_id = g.strings.lookup("comm_dispatch")
    if disp_id >= 0:
        via = (g.name[src] == disp_id) & np.isin(dst, rows)
        issue[dst[via]] = issue[src[via]]
    key = np.where(np.isfinite(issue[rows]), issue[rows], g.start[rows])
    return np.lexsort((g.id[rows], key)).argsort().astype(np.float64)


def measured_transfer(spans: list[tuple[float, float]]) -> float:
    """Transfer time of an instance from its members' measured ``(start, dur)``: the shortest span
    (the last member to arrive waited least: its kernel or gloo span is the transfer itself).

    From the last member's start to the first member's end would need the ranks' clocks to agree,
    and gloo's send spans time the ``wait()`` on the send, not the transfer: tried on the sample
    captures, it was further off than the shortest span."""
    return min(d for _, d in spans)


def _local_time(g: RankGraph, row: int, ct: np.ndarray) -> float:
    """A comm node replayed on its own: measured time, else the network's."""
    d = g.dur[row]
    if np.isfinite(d) and d >= 0:
        return float(d)
    return float(ct[row]) if np.isfinite(ct[row]) else 0.0


def _csr(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    o = np.argsort(src, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    return ptr, dst[o].astype(np.int64)
