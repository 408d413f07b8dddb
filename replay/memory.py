"""Device memory of each rank over the replayed step, from tensor lifetimes; the measured curve beside it.

Model (per rank, from the graph's tensor table — PyTorch ET tensors, linked traces, Chakra IOInfo):
tensor lifetimes as :mod:`ettools.lifetimes` defines them (resident storages live the whole step,
others from first write to last use; the device's tensors only), with

* nodes ordered by their replayed start where the replayed graph still has them (device ops,
  comm nodes, anchors), else their measured start, else their topological position.

``peak_bytes`` is the highest live total, ``resident_bytes`` what is live at the start,
``transient_peak_bytes = peak − resident``; ``oom`` when the peak exceeds the hardware's
``memory_bytes``. Graphs without tensors fall back to the synthesizer's ``meta["peak_memory_bytes"]``
(``source: "synth"``). When the rank (or ``memory_trace``) carries Kineto ``[memory]`` events, the
measured curve (``total_allocated`` over the rank's span) is reported beside it: ``measured_peak_bytes``
and ``measured_growth_bytes`` (peak − first sample: the profiler counts only allocations it saw, so
growth is what compares with ``transient_peak_bytes``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.checks import topological_sort
from ettools.graph import RankGraph, Trace
from ettools.lifetimes import live_bytes


def model_memory(g: RankGraph, order_key: np.ndarray, times: np.ndarray | None = None) -> dict[str, Any]:
    """Peak, resident and the live-bytes curve of one rank graph with tensors (see the module doc)."""
    lb = live_bytes(g, order_key)
    if lb is None:
        return {}
    out: dict[str, Any] = {"peak_bytes": lb.peak_bytes, "resident_bytes": lb.resident_bytes,
                           "transient_peak_bytes": lb.transient_peak_bytes, "source": "tensors"}
    if times is not None:
        out["_curve"] = (np.asarray(times)[lb.order], lb.live)
    return out


def measured_memory(g: RankGraph) -> dict[str, Any]:
    """Peak and growth of the Kineto ``[memory]`` events within the rank's span."""
    m = g.meta.get("memory")
    if not m or not len(m.get("ts", [])):
        return {}
    ts = np.asarray(m["ts"], np.float64)
    alloc = np.asarray(m["total_allocated"], np.float64)
    # one allocator's counter: the device's (the most frequent non-CPU one) when there is one
    dtype = np.asarray(m.get("device_type", np.zeros(len(ts))), np.int64)
    dev_id = np.asarray(m.get("device_id", np.zeros(len(ts))), np.int64)
    gpu = dtype != 0
    if gpu.any():
        pairs, counts = np.unique(np.stack([dtype[gpu], dev_id[gpu]], axis=1), axis=0, return_counts=True)
        want = pairs[np.argmax(counts)]
        sel = (dtype == want[0]) & (dev_id == want[1])
        ts, alloc = ts[sel], alloc[sel]
    span = g.meta.get("span_us")
    if span:
        sel = (ts >= span[0] - 1e-6) & (ts <= span[1] + 1e-6)
        if sel.any():
            ts, alloc = ts[sel], alloc[sel]
    return {"measured_peak_bytes": int(alloc.max()), "measured_growth_bytes": int(alloc.max() - alloc[0]),
            "_measured_curve": (ts, alloc)}


def rank_memory(res: Any, memory_trace: Trace | None = None) -> dict[int, dict[str, Any]]:
    """Memory report per rank of a :class:`~.report.ReplayResult` (see the module docstring)."""
    out: dict[int, dict[str, Any]] = {}
    device_bytes = int(res.hardware.memory_bytes or 0)
    done: dict[int, dict[str, Any]] = {}
    for r in sorted(res.built.rep_of):
        rep = res.built.rep_of[r]
        p = res.built.preps[r]
        src = p.source
        mg = memory_trace.graphs.get(r) if memory_trace is not None else None
        g = mg if mg is not None and len(mg.tensors) else src
        info: dict[str, Any] = {}
        if len(g.tensors) and (len(g.in_tensor) or len(g.out_tensor)):
            key = rep if g is src else r
            if key in done and g is src and r != rep:
                info = dict(done[key])
            else:
                order_key, times = _order(res, r, g)
                info = model_memory(g, order_key, times)
                done[key] = info
        elif src.meta.get("peak_memory_bytes") is not None:
            info = {"peak_bytes": int(src.meta["peak_memory_bytes"]), "source": "synth"}
        meas = measured_memory(src) or (measured_memory(mg) if mg is not None else {})
        info = dict(info)
        info.update(meas)
        if "peak_bytes" not in info and "measured_peak_bytes" in info:
            info["peak_bytes"] = info["measured_peak_bytes"]
            info["source"] = "measured"
        if "peak_bytes" in info and "measured_peak_bytes" in info and info.get("source") == "tensors":
            mp = info["measured_growth_bytes"]
            if mp > 0:
                info["transient_error_pct"] = 100.0 * (info["transient_peak_bytes"] - mp) / mp
        info.setdefault("peak_bytes", 0)
        info.setdefault("source", "none")
        info["device_bytes"] = device_bytes
        info["oom"] = bool(device_bytes and info["peak_bytes"] > device_bytes)
        out[r] = info
    res.memory_curves = {r: (v.pop("_curve", None), v.pop("_measured_curve", None)) for r, v in out.items()}
    return out


def _order(res: Any, rank: int, g: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """Order key (and times) of ``g``'s nodes: replayed start, else measured start, else topological."""
    n = len(g)
    key = np.full(n, np.nan)
    try:
        p = res.built.preps[rank]
        st, _ = res.replayed_times(rank)
        rows = p.graph.rows_of(g.id) if g is p.source else np.full(n, -1)
        ok = rows >= 0
        key[ok] = st[rows[ok]]
    except (KeyError, ValueError):
        pass
    miss = np.isnan(key)
    if miss.any() and np.isfinite(g.start[miss]).all():
        base = np.nanmin(g.start) if np.isfinite(g.start).any() else 0.0
        key[miss] = g.start[miss] - base
    miss = np.isnan(key)
    if miss.any():
        order, _, _ = topological_sort(g)
        pos = np.empty(n, np.float64)
        pos[order] = np.arange(len(order))
        key[miss] = pos[miss]
    return key, key.copy()
