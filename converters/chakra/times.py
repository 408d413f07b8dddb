"""Measured times as the whole microseconds a Chakra file holds: start times rounded, durations
rounded without bias along each lane (:func:`diffused_us`), and the per-op device gap a replayable
graph added to its durations (left out of ``duration_micros``).
"""

from __future__ import annotations

import numpy as np

from ettools.graph import RankGraph


def _time_us(col: np.ndarray) -> np.ndarray:
    v = np.where(np.isfinite(col) & (col > 0), col, 0.0)
    return np.rint(v).astype(np.uint64)


def included_stream_gap(g: RankGraph) -> float:
    """µs that :func:`ettools.replayable.to_replayable` added to every device op's ``dur`` of ``g``
    (its ``meta["replayable"]["stream_gap_us"]``), 0 for any other graph."""
    rep = g.meta.get("replayable")
    gap = rep.get("stream_gap_us") if isinstance(rep, dict) else None
    return float(gap) if gap is not None and np.isfinite(gap) and gap > 0 else 0.0


def diffused_us(dur: np.ndarray, lane: np.ndarray, start: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Durations as integer µs without bias: error diffusion along each lane.

    Within a lane (nodes sorted by start time, then id) node ``i`` gets
    ``round(S_i) - round(S_{i-1})`` with ``S_i`` the exact running sum of the lane's durations, so
    the rounding remainder is carried to the next node: every run of consecutive nodes of a lane
    (a step, a phase) sums to within 1 µs of its exact total, however many nodes it holds (plain
    rounding biases each node by up to 0.5 µs). Non-finite and negative durations count as 0.
    Deterministic: same arrays, same result.
    """
    x = np.where(np.isfinite(dur) & (dur > 0), dur, 0.0).astype(np.float64)
    n = len(x)
    if n == 0:
        return np.zeros(0, np.uint64)
    t = np.where(np.isfinite(start), start, np.inf)
    o = np.lexsort((ids, t, lane))
    xs = x[o]
    ls = lane[o]
    first = np.ones(n, bool)
    first[1:] = ls[1:] != ls[:-1]
    # running sum restarted at every lane: subtract the lane's total before its first node
    c = np.cumsum(xs)
    seg = np.cumsum(first) - 1
    base = (c - xs)[first]
    run = c - base[seg]
    r = np.floor(run + 0.5)
    prev = np.empty(n)
    prev[1:] = r[:-1]
    prev[first] = 0.0
    out = np.empty(n, np.uint64)
    out[o] = np.maximum(r - prev, 0.0).astype(np.uint64)
    return out


def duration_lanes(g: RankGraph, rows: np.ndarray) -> np.ndarray:
    """Lane of each row for :func:`diffused_us`: its resource (thread, stream), else host or device.

    The replay's ``device_hold`` nodes (measured waits on a stream) get a lane of their own beside
    their stream's, so the stream's operators alone keep sums exact to 1 µs over any run of them.
    """
    res = g.columns["resource"][rows].astype(np.int64)
    lane = np.where(res >= 0, res, np.where(g.columns["is_cpu_op"][rows] == 1, -2, -3))
    hold = g.strings.lookup("device_hold")
    is_hold = (g.columns["name"][rows] == hold) if hold >= 0 else np.zeros(len(rows), bool)
    return lane * 2 + is_hold
