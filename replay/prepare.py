"""From a :class:`~ettools.graph.Trace` to the engine's :class:`~.engine.Program`.


Per rank (:func:`prepare_rank`):

* **Form** (:mod:`.form`). A graph with nesting (Kineto, PyTorch ET + Kineto) is rewritten into
  completion semantics (host slices, launches, syncs as waits), with the cross-thread waits the
  trace implies and without the waits its times contradict; a dependency graph is used as it is; a
  nested graph the pass cannot handle falls back to its top-level ops, ``form = "fallback"``.
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

Across ranks the prepared ranks become the engine's program (:mod:`.program`: instances, transfer
times, releases), and ranks that replay alike share one simulation (:mod:`.symmetry`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.checks import structure_key
from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph
from ettools.replayable import DEVICE_HOLD, measured_rows

from . import compute as cm

# the imports marked noqa: F401 are re-exported (ettools.convert and the replay's callers import
# them from here)
from .commorder import issue_order  # noqa: F401
from .devices import Hardware
from .engine import COLL, COMPUTE, P2P
from .form import _is_nested, replayable_form  # noqa: F401
from .program import (  # noqa: F401
    Built,
    RankPrep,
    astrasim_lanes,
    build_program,
    comm_times,
    first_events,
    measured_transfer,
    rank_releases,
)
from .symmetry import _digest, symmetry_classes  # noqa: F401


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


def _launch_queue(g: RankGraph, rg: RankGraph, dur: np.ndarray, hw: Hardware) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
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
    q = int(q_meta) if q_meta else int(hw.launch_queue_depth)
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


_PREDICTED = (cm.ROOFLINE, cm.FITTED, cm.TRANSFERRED, cm.CALIBRATED)


def prepare_rank(g: RankGraph, timing: str, hw: Hardware, fit: Any = None,
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
    # (not in a pure roofline replay, --timing roofline, nor ASTRA-sim's roofline)
    kgap = float(hw.kernel_gap_us or 0.0) \
        if (form == "graph" and astra_roofline is None and timing != "roofline") else 0.0
    predicted = (rg.is_cpu_op == 0) & (rg.type == NodeType.COMP_NODE) & np.isin(dsrc, _PREDICTED)
    if kgap > 0 and predicted.any():
        # the op models predict a kernel's own duration; a stream runs its next kernel after the
        # GPU's measured back-to-back gap (data/kernel_gaps.json), which measured durations carry
        dur = np.where(predicted, dur + kgap, dur)
    lane, lane_names = _lanes(rg)
    kind = np.full(len(rg), COMPUTE, np.int8)
    kind[rg.type == NodeType.COMM_COLL_NODE] = COLL
    kind[(rg.type == NodeType.COMM_SEND_NODE) | (rg.type == NodeType.COMM_RECV_NODE)] = P2P
    notes: dict[str, Any] = {"kernel_gap_nodes": int(predicted.sum())} if kgap > 0 else {}
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
