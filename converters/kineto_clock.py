"""The ranks of a Kineto trace on one clock.

Each file's times are first relative to its own first event; this module says where each rank's
first event lies on a clock shared by all ranks (``baseTimeNanoseconds`` + ``ts``, or wall-clock
``ts`` in older files), or that the files cannot say; reads the clock differences the collectives
show (their kernels end together on every member); and moves a rank's times by an offset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.converters.kineto_columns import unique
from ettools.graph import NodeType, RankGraph, TraceMeta

EPOCH_US_MIN = 1e15  # µs since 1970 of 2001-09: a ts this large is wall-clock time, not relative


def _base_time_ns(data: dict[str, Any]) -> int | None:
    """``baseTimeNanoseconds`` of a file (newer Kineto writes ``ts`` relative to it), else None."""
    b = data.get("baseTimeNanoseconds")
    if isinstance(b, str) and b.strip().isdigit():
        b = int(b)
    return int(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 else None


def _common_clock(origin_of: dict[int, float], base_ns: dict[int, int | None]) -> dict[int, float] | None:
    """Each rank's first event on one clock shared by all ranks, or None when the files cannot say.

    Newer Kineto writes ``ts`` in µs since ``baseTimeNanoseconds`` (the wall clock floored to a
    quarter, so ranks of one job may differ in it); older Kineto writes wall-clock µs. Ranks on one
    host share that clock (across hosts it is as good as their clock sync). The base is added as an
    exact integer difference to the smallest base, so sub-µs timestamps keep their precision.
    """
    if len(origin_of) < 2:
        return dict(origin_of)
    known = [b for b in base_ns.values() if b is not None]
    b0 = min(known) if known else 0
    out: dict[int, float] = {}
    for r, o in origin_of.items():
        b = base_ns.get(r)
        if b is not None:
            out[r] = o + (b - b0) / 1000.0
        elif not known and o >= EPOCH_US_MIN:
            out[r] = o
        else:
            return None  # relative times without a base, or a mix of both kinds: no common clock
    return out


COLLECTIVE_END_TOL_US = 5.0  # kernels of one NCCL collective end this close together on one clock


def _collective_clock_offsets(graphs: dict[int, RankGraph], meta: TraceMeta) -> dict[int, float]:
    """How far each rank's clock runs ahead of the lowest rank's, read from their collectives.

    The device kernels of one collective end together on every member (each waits for the last to
    arrive, then they finish the transfer together: within a µs on the 8-rank DLRM trace), so the
    k-th collective of a group whose members are all in the trace gives one clock difference per
    rank. Only a consistent answer counts: the median difference, when the differences agree within
    ``COLLECTIVE_END_TOL_US`` (median absolute deviation) on at least two collectives; ranks without
    one are left out.
    """
    present = set(graphs)
    ends: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    complete: dict[int, bool] = {}
    for r, g in graphs.items():
        sel = np.flatnonzero((g.type == NodeType.COMM_COLL_NODE) & (g.is_cpu_op == 0)
                             & np.isfinite(g.start) & np.isfinite(g.dur))
        if not len(sel):
            continue
        gid = g.comm_group[sel].astype(np.int64)
        for x in unique(gid).tolist():
            if x not in complete:
                pg = meta.process_groups.get(g.strings[x]) if x >= 0 else None
                complete[x] = pg is not None and len(pg.ranks) > 1 and present.issuperset(pg.ranks)
        sel = sel[np.array([complete[x] for x in gid.tolist()], bool)]
        if not len(sel):
            continue
        o = sel[np.lexsort((g.start[sel], g.comm_group[sel]))]
        gid = g.comm_group[o].astype(np.int64)
        new = np.ones(len(o), bool)
        new[1:] = gid[1:] != gid[:-1]
        kth = np.arange(len(o)) - np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
        ends[r] = (gid * (1 << 32) + kth, g.start[o] + g.dur[o])
    if len(ends) < 2:
        return {}
    ref = min(ends)
    out: dict[int, float] = {}
    for r, (keys, e) in ends.items():
        if r == ref:
            continue
        _, a, b = np.intersect1d(keys, ends[ref][0], return_indices=True)
        if len(a) < 2:
            continue
        d = e[a] - ends[ref][1][b]
        med = float(np.median(d))
        if float(np.median(np.abs(d - med))) <= COLLECTIVE_END_TOL_US:
            out[r] = med
    if out:
        out[ref] = 0.0
    return out


def _shift(g: RankGraph, delta: float) -> None:
    """Move a rank's times from its own base to the trace origin (in place, during reading)."""
    if delta == 0:
        return
    g.columns["start"] = g.columns["start"] + delta
    m = g.meta
    m["steps"] = [(n, s + delta, e + delta) for n, s, e in m["steps"]]
    m["span_us"] = (m["span_us"][0] + delta, m["span_us"][1] + delta)
    if "memory" in m:
        m["memory"]["ts"] = m["memory"]["ts"] + delta
