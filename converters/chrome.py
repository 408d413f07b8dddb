"""Chrome trace JSON writer: a trace as a timeline Perfetto and chrome://tracing open.

Layout:

* one process per rank (``pid`` = rank, ``process_name`` "rank N", sorted by rank);
* one thread per resource that ran nodes: host threads first (``thread …``/``cpu…`` resources, or
  nodes marked ``is_cpu_op``), then device streams (``stream …``/``gpu…``, or device ops), then
  anything else; numbers in names sort numerically. ``tid`` is the lane's position (1, 2, …) in
  that order, so it is stable for a given graph; ``thread_name`` gives the resource's name.
  Nodes with no resource go to a lane named "host", "device" or "unassigned" by ``is_cpu_op``;
* one complete event (``ph: "X"``, ``ts``/``dur`` in µs, exactly the graph's floats) per node,
  named after the node, ``cat`` its node type, ``args`` its id, type and — when present — comm
  type, bytes, group, peer and tag, ``num_ops``, ``tensor_size``;
* optionally (``flows=True``, the default) a flow arrow from each launching runtime call to the
  kernel it launched (``LAUNCH`` edges).

Nodes without a start time (synthesized graphs) are laid out by an ASAP schedule over their
dependencies (:func:`asap_start`): a node starts when its last dependency ends, durations NaN
count as 0, nodes with a known start keep it. The file is then viewable, but such times are a
layout, not a measurement. A missing duration is written as 0.

The output is deterministic; a name ending in ``.gz`` is gzipped; the file is written atomically.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ettools.checks import topological_sort
from ettools.graph import COMM_NODE_TYPES, CollectiveType, EdgeKind, NodeType, RankGraph, Trace
from ettools.io import atomic_write, json_bytes

_NUM = re.compile(r"(\d+)")
_HOST, _DEVICE, _OTHER = 0, 1, 2


def asap_start(g: RankGraph) -> np.ndarray:
    """Start times with every missing one filled by an ASAP schedule over the dependencies.

    A node without a start begins when its latest dependency ends (start + duration, NaN
    duration = 0), or at the earliest known start of the graph (0 if none) when it has no
    dependency. Known starts are kept. Nodes on or after dependency cycles start at that origin
    (or after their dependencies outside the cycle that are already placed). O(nodes + edges).
    """
    start = g.start.astype(np.float64, copy=True)
    missing = np.isnan(start)
    if not missing.any():
        return start
    base = float(np.nanmin(start)) if (~missing).any() else 0.0
    _, cyclic, asap = topological_sort(g, dur=g.dur, start=start, origin=base)
    out = np.where(np.isnan(asap), base, asap)
    if cyclic.any():
        # place leftover nodes after whatever placed dependencies they have
        dur = np.maximum(np.nan_to_num(g.dur, nan=0.0), 0.0)
        src, dst, _ = g.edge_rows()
        sel = (src >= 0) & cyclic[dst] & ~cyclic[np.maximum(src, 0)]
        ready = np.full(len(g), base)
        np.maximum.at(ready, dst[sel], out[src[sel]] + dur[src[sel]])
        out[cyclic] = np.where(np.isnan(start[cyclic]), ready[cyclic], start[cyclic])
    return out


def _lane_class(name: str) -> int:
    low = name.lower()
    if low.startswith(("thread", "cpu", "host")):
        return _HOST
    if low.startswith(("stream", "gpu", "device", "cuda")):
        return _DEVICE
    return _OTHER


def _natural(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in _NUM.split(name))


def _lanes(g: RankGraph) -> tuple[np.ndarray, list[str]]:
    """``(tid of every row, lane names in tid order)``."""
    res = g.resource.astype(np.int64)
    cpu = g.is_cpu_op
    # rows without a resource get a pseudo lane keyed by is_cpu_op: -2 host, -3 device, -4 unknown
    key = np.where(res >= 0, res, np.where(cpu == 1, -2, np.where(cpu == 0, -3, -4)))
    ukeys, inv = np.unique(key, return_inverse=True)
    lanes = []
    for k in ukeys.tolist():
        if k >= 0:
            name = g.strings[k]
            cls = _lane_class(name)
            if cls == _OTHER:
                # classify by what runs on it
                c = cpu[res == k]
                cls = _HOST if (c == 1).any() and not (c == 0).any() else (
                    _DEVICE if (c == 0).any() and not (c == 1).any() else _OTHER)
        else:
            name, cls = {-2: ("host", _HOST), -3: ("device", _DEVICE), -4: ("unassigned", _OTHER)}[k]
        lanes.append((cls, _natural(name), name, k))
    order = sorted(range(len(lanes)), key=lambda i: lanes[i][:3])
    tid_of_lane = np.empty(len(lanes), np.int64)
    tid_of_lane[order] = np.arange(1, len(lanes) + 1)
    names = [lanes[i][2] for i in order]
    return tid_of_lane[inv.reshape(-1)], names


def _rank_events(g: RankGraph, flows: bool, flow_id: int) -> tuple[list[dict[str, Any]], int]:
    rank = g.rank
    tid, lane_names = _lanes(g)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    for i, lane in enumerate(lane_names, start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": i, "args": {"name": lane}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": i,
                       "args": {"sort_index": i}})
    start = asap_start(g)
    dur = np.nan_to_num(g.dur, nan=0.0)
    type_names = {t.value: t.name for t in NodeType}
    coll_names = {c.value: c.name for c in CollectiveType}
    c = g.columns
    tnames = [type_names.get(t, str(t)) for t in c["type"].tolist()]
    args: list[dict[str, Any]] = [{"id": i, "type": t} for i, t in zip(c["id"].tolist(), tnames)]
    # optional fields: loop only over the rows that have them
    for key, col in (("is_cpu_op", "is_cpu_op"), ("num_ops", "num_ops"), ("tensor_size", "tensor_size")):
        vals = c[col]
        rows = np.flatnonzero(vals >= 0)
        for r, v in zip(rows.tolist(), vals[rows].tolist()):
            args[r][key] = v
    comm = np.isin(c["type"], [int(t) for t in COMM_NODE_TYPES])
    strings = g.strings
    for key, col in (("comm_type", "comm_type"), ("comm_bytes", "comm_bytes"), ("group", "comm_group"),
                     ("peer", "comm_peer"), ("tag", "comm_tag")):
        vals = c[col]
        rows = np.flatnonzero(comm & (vals >= 0))
        for r, v in zip(rows.tolist(), vals[rows].tolist()):
            if key == "comm_type":
                v = coll_names.get(v, v)
            elif key == "group":
                v = strings[v]
            args[r][key] = v
    events += [
        {"ph": "X", "name": nm, "cat": tn, "pid": rank, "tid": td, "ts": ts, "dur": du, "args": a}
        for nm, tn, td, ts, du, a in zip(g.names(), tnames, tid.tolist(), start.tolist(), dur.tolist(), args)
    ]
    if flows:
        src, dst, kind = g.edge_rows()
        sel = np.flatnonzero((kind == EdgeKind.LAUNCH) & (src >= 0))
        for s, d in zip(src[sel].tolist(), dst[sel].tolist()):
            events.append({"ph": "s", "id": flow_id, "name": "launch", "cat": "launch", "pid": rank,
                           "tid": int(tid[s]), "ts": float(start[s])})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "launch", "cat": "launch",
                           "pid": rank, "tid": int(tid[d]), "ts": float(start[d])})
            flow_id += 1
    return events, flow_id


def chrome_events(trace: Trace, flows: bool = True) -> list[dict[str, Any]]:
    """The ``traceEvents`` list :func:`write_chrome` writes (ranks ascending, rows in graph order)."""
    events: list[dict[str, Any]] = []
    flow_id = 1
    for g in trace:
        ev, flow_id = _rank_events(g, flows, flow_id)
        events += ev
    return events


def write_chrome(trace: Trace, path: Path, flows: bool = True) -> Path:
    """Write ``trace`` as Chrome trace JSON to ``path`` (gzipped if it ends in ``.gz``); returns ``path``."""
    path = Path(path)
    doc = {
        "traceEvents": chrome_events(trace, flows),
        "displayTimeUnit": "ms",
        "otherData": {"generator": "ettools", "source": trace.meta.source,
                      "world_size": trace.meta.world_size},
    }
    data = json_bytes(doc, path)
    with atomic_write(path) as f:
        f.write(data)
    return path
