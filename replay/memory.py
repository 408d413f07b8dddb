"""Device memory of each rank over the replayed step, from tensor lifetimes; the measured curve beside it.

Model (per rank, from the graph's tensor table — PyTorch ET tensors, linked traces, Chakra IOInfo):

* a tensor's storage (tensors sharing a ``storage_id`` count once, at their largest extent) is live
  from the first node that touches it to the end of the last one; storages whose first use is a
  *read* (weights, optimizer state, inputs: resident across steps) are live for the whole step;
* nodes are ordered by their replayed start where the replayed graph still has them (device ops,
  comm nodes, anchors), else their measured start, else their topological position;
* devices: the GPU tensors when the rank has any, else (CPU captures) the CPU ones.

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


def storage_lifetimes(g: RankGraph, order_key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per storage ``(size bytes, first position, last position, flags)`` with positions in the order
    of ``order_key`` (per node) and flags bit 0 = first use is a read, bit 1 = last use is a write."""
    t = g.tensors
    n = len(g)
    pos = np.empty(n, np.int64)
    pos[np.lexsort((np.arange(n), order_key))] = np.arange(n)
    in_node = np.repeat(np.arange(n), np.diff(g.in_ptr))
    out_node = np.repeat(np.arange(n), np.diff(g.out_ptr))
    use_t = np.concatenate([g.in_tensor, g.out_tensor]).astype(np.int64)
    use_node = np.concatenate([in_node, out_node])
    is_write = np.concatenate([np.zeros(len(in_node), bool), np.ones(len(out_node), bool)])
    kind = np.where(t.storage_id >= 0, 0, np.where(t.tensor_id >= 0, 1, 2))
    val = np.where(kind == 0, t.storage_id, np.where(kind == 1, t.tensor_id, np.arange(len(t))))
    _, key = np.unique(np.stack([kind, val], axis=1), axis=0, return_inverse=True)
    key = key.reshape(-1)
    nk = int(key.max()) + 1 if len(key) else 0
    extent = (np.maximum(t.offset, 0) + np.maximum(t.numel, 0)) * np.maximum(t.elem_bytes, 0).astype(np.int64)
    size = np.zeros(nk, np.int64)
    np.maximum.at(size, key, extent)
    uk = key[use_t]
    up = pos[use_node]
    first = np.full(nk, n, np.int64)
    last = np.full(nk, -1, np.int64)
    np.minimum.at(first, uk, up)
    np.maximum.at(last, uk, up)
    # first use a read (an in-place op on an input counts as a read: resident)? last use a write?
    fr = np.zeros(nk, bool)
    lw = np.zeros(nk, bool)
    at_first = up == first[uk]
    fr[uk[at_first & ~is_write]] = True
    at_last = up == last[uk]
    lw[uk[at_last & is_write]] = True
    flags = fr.astype(np.int8) | (lw.astype(np.int8) << 1)
    return size, first, last, flags


def _device_mask(g: RankGraph) -> np.ndarray:
    t = g.tensors
    names = {int(d): (g.strings[int(d)].lower() if d >= 0 else "") for d in np.unique(t.device)}
    gpu_ids = [d for d, s in names.items() if s.startswith(("cuda", "gpu", "hip", "xpu", "mps"))]
    if gpu_ids:
        return np.isin(t.device, gpu_ids)
    return np.ones(len(t), bool)


def model_memory(g: RankGraph, order_key: np.ndarray, times: np.ndarray | None = None) -> dict[str, Any]:
    """Peak, resident and the live-bytes curve of one rank graph with tensors (see the module doc)."""
    t = g.tensors
    if not len(t) or not (len(g.in_tensor) or len(g.out_tensor)):
        return {}
    keep_t = _device_mask(g)
    # drop tensors on other devices by zeroing their extent through a masked copy of the table
    size, first, last, flags = storage_lifetimes(g, order_key)
    used = last >= 0
    # storages whose every tensor is off-device count 0
    kind = np.where(t.storage_id >= 0, 0, np.where(t.tensor_id >= 0, 1, 2))
    val = np.where(kind == 0, t.storage_id, np.where(kind == 1, t.tensor_id, np.arange(len(t))))
    _, key = np.unique(np.stack([kind, val], axis=1), axis=0, return_inverse=True)
    key = key.reshape(-1)
    on = np.zeros(len(size), bool)
    on[key[keep_t]] = True
    size = np.where(on & used, size, 0)
    n = len(g)
    start_at = np.where(flags & 1, 0, first)
    end_at = np.where(flags & 1, n - 1, last)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, start_at[used], size[used])
    np.add.at(delta, end_at[used] + 1, -size[used])
    live = np.cumsum(delta[:n])
    resident = int(size[used & ((flags & 1) == 1)].sum())
    peak = int(live.max()) if n else 0
    out: dict[str, Any] = {"peak_bytes": peak, "resident_bytes": resident,
                           "transient_peak_bytes": peak - resident, "source": "tensors"}
    if times is not None:
        order = np.lexsort((np.arange(n), order_key))
        out["_curve"] = (np.asarray(times)[order], live)
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
    device_bytes = int(res.hardware.get("memory_bytes", 0) or 0)
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
