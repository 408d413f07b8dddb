"""Time intervals, vectorized: the merged busy spans of a lane, how much of other intervals they
cover (compute beside communication, kernels beside collectives), and the nearest earlier span
still open at a time (:func:`prev_ge`: the innermost op containing a slice, a nested op's parent)."""

from __future__ import annotations

import numpy as np


def merge_intervals(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of the intervals ``[s, e)`` as sorted, disjoint ``(starts, ends)``."""
    s, e = np.asarray(s, float), np.asarray(e, float)
    if not len(s):
        return np.zeros(0), np.zeros(0)
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum.accumulate(e[o])
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]  # a start after every earlier end opens a new run
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def union_length(s: np.ndarray, e: np.ndarray) -> float:
    """Total length of the union of the intervals ``[s, e)``."""
    starts, ends = merge_intervals(s, e)
    return float((ends - starts).sum())


def covered_length(cs: np.ndarray, ce: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Length of each ``[s, e)`` covered by the disjoint sorted intervals ``(cs, ce)``
    (:func:`merge_intervals`' output)."""
    if not len(cs) or not len(s):
        return np.zeros(len(s))
    cum = np.concatenate([[0.0], np.cumsum(ce - cs)])

    def upto(x: np.ndarray) -> np.ndarray:  # covered length of (-inf, x)
        i = np.searchsorted(cs, x, side="right")  # intervals starting at or before x
        last = np.maximum(i - 1, 0)
        part = np.where(i > 0, np.clip(x - cs[last], 0.0, ce[last] - cs[last]), 0.0)
        return cum[last] + part

    return np.maximum(upto(e) - upto(s), 0.0)


def prev_ge(vals: np.ndarray, q: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
    """For each query k the largest ``j <= pos[k]`` with ``vals[j] >= q[k]`` (-1 if none).

    ``pos`` defaults to ``k - 1`` (queries are the elements themselves: "previous greater or
    equal"). Binary lifting over a sparse table of maxima: O((n + queries) log n), all numpy.
    """
    n = len(vals)
    if pos is None:
        pos = np.arange(len(q), dtype=np.int64) - 1
    p = np.asarray(pos, np.int64).copy()
    if n == 0 or len(p) == 0:
        return np.full(len(p), -1, np.int64)
    table = [np.asarray(vals, np.float64)]
    step = 1
    while step < n:
        prev = table[-1]
        nxt = prev.copy()
        nxt[step:] = np.maximum(prev[step:], prev[:-step])
        table.append(nxt)  # table[k][i] = max(vals[i - 2^k + 1 .. i])
        step *= 2
    p[p >= n] = n - 1
    for k in range(len(table) - 1, -1, -1):
        idx = np.flatnonzero(p >= 0)
        if len(idx) == 0:
            break
        fail = table[k][p[idx]] < q[idx]
        p[idx[fail]] -= 1 << k
    p[p < 0] = -1
    return p
