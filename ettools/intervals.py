"""Unions of time intervals, vectorized: the merged busy spans of a lane, and how much of other
intervals they cover (compute beside communication, kernels beside collectives)."""

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
