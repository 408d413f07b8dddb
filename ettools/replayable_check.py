"""Replaying a completion-semantics graph the simplest way, to check it against its measurement:
the longest-path ASAP schedule (:func:`asap_schedule`) and the rows whose end is the rank's
measured span (:func:`measured_rows`)."""

from __future__ import annotations

import numpy as np

from ettools.graph import COMM_NODE_TYPES, EdgeKind, RankGraph


def asap_schedule(graph: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """Longest-path ASAP replay: ``start = max(end of dependencies)`` (0 without any),
    ``end = start + dur``. Returns ``(start, end)`` per row; raises ValueError on a cycle."""
    order = graph.topological_order()
    if order is None:
        raise ValueError("graph has a cycle")
    src, dst, _ = graph.edge_rows()
    ok = src >= 0
    src, dst = src[ok], dst[ok]
    o = np.argsort(dst, kind="stable")
    src_sorted = src[o].tolist()
    ptr = np.zeros(len(graph) + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=len(graph)), out=ptr[1:])
    ptr_l = ptr.tolist()
    dur = np.nan_to_num(graph.dur, nan=0.0).tolist()
    end = [0.0] * len(graph)
    begin = [0.0] * len(graph)
    for v in order.tolist():
        a, b = ptr_l[v], ptr_l[v + 1]
        s = 0.0
        for k in range(a, b):
            e = end[src_sorted[k]]
            if e > s:
                s = e
        begin[v] = s
        end[v] = s + dur[v]
    return np.array(begin), np.array(end)


def measured_rows(graph: RankGraph) -> np.ndarray:
    """Rows whose end defines a rank's measured span: device ops, comm nodes and the host threads
    that launch device work or issue collectives (every host thread when the rank has neither) —
    an NCCL watchdog polling ``cudaEventQuery`` until the trace ends is not part of the step."""
    g = graph
    src, dst, kind = g.edge_rows()
    launchers = src[(kind == EdgeKind.LAUNCH) & (src >= 0)]
    busy = np.unique(g.resource[launchers]) if len(launchers) else np.zeros(0, np.int32)
    is_comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    host = g.is_cpu_op == 1
    if len(busy) == 0:
        return np.flatnonzero(np.ones(len(g), bool))
    return np.flatnonzero(~host | is_comm | np.isin(g.resource, busy))
