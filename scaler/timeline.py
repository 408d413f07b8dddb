"""Keeping a rewritten graph's timeline consistent when work gets shorter, longer or moves.

Readers give nested host ops (a parent spans its children, a thread's top-level ops follow one
another) and :func:`ettools.replayable.to_replayable` cuts each host thread by those times, so a
pass that changes host durations must re-lay the thread out, not just shrink spans (the freed
time would turn into idle gaps).

:func:`repack` does that for the units of a :class:`~ettools.scaler.model.StepModel`: on every
host thread, top-level units are laid out one after another in their original order, each
keeping the idle gap it had before it, and everything inside a unit (nested host ops, their
communication nodes, the device ops they launched) is scaled by the unit's factor about the
unit's start and moved with it. Annotations (``ProfilerStep#N``, ``## forward ##``) are re-spanned
over their children. Rows outside every unit keep their times.

Where the compute is on the device (GPU traces), host ops keep their durations (they launch,
they do not compute) and only device ops are scaled, in place: :func:`scale_device`. The
replay recomputes when they run.
"""

from __future__ import annotations

import numpy as np

from ettools.scaler.model import StepModel


def repack(m: StepModel, unit_factor: np.ndarray, start: np.ndarray | None = None,
           dur: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """New ``(start, dur)`` columns with every unit's span scaled by ``unit_factor[unit row]`` (see module doc)."""
    g = m.g
    start = (g.start if start is None else start).astype(np.float64, copy=True)
    dur = (g.dur if dur is None else dur).astype(np.float64, copy=True)
    if not len(g) or not np.isfinite(start[m.units]).all():
        return start, dur
    f = np.asarray(unit_factor, np.float64)
    units = m.units
    res = g.resource[units]
    old_s = start[units].copy()
    old_e = old_s + np.nan_to_num(dur[units])
    new_s = old_s.copy()
    for r in np.unique(res).tolist():
        idx = np.flatnonzero(res == r)
        idx = idx[np.argsort(old_s[idx], kind="stable")]
        s, e = old_s[idx], old_e[idx]
        fu = f[units[idx]]
        gap = np.empty(len(idx))
        gap[0] = 0.0
        # gap before each unit on this thread (overlaps, e.g. a unit nested by time only, count as 0)
        gap[1:] = np.maximum(s[1:] - np.maximum.accumulate(e)[:-1], 0.0)
        length = (e - s) * fu
        ns = np.empty(len(idx))
        ns[0] = s[0]
        if len(idx) > 1:
            ns[1:] = s[0] + np.cumsum(gap[1:] + length[:-1])
        new_s[idx] = ns
    # move every member row with its unit
    shift_of = np.zeros(len(g) + 1)
    scale_of = np.ones(len(g) + 1)
    origin = np.zeros(len(g) + 1)
    shift_of[units] = new_s
    origin[units] = old_s
    scale_of[units] = f[units]
    u = np.where(m.unit >= 0, m.unit, len(g))
    has = (m.unit >= 0) & np.isfinite(start)
    rows = np.flatnonzero(has)
    uu = u[rows]
    start[rows] = shift_of[uu] + (start[rows] - origin[uu]) * scale_of[uu]
    dur[rows] = dur[rows] * scale_of[uu]
    _move_loose_rows(m, old_s, new_s, f, start)
    _respan_annotations(m, start, dur)
    return start, dur


def _move_loose_rows(m: StepModel, old_s: np.ndarray, new_s: np.ndarray, f: np.ndarray, start: np.ndarray) -> None:
    """Rows outside every unit (annotations) move with the last unit of their thread that started
    before them — scaled with it when inside its span, kept at their distance after its end
    otherwise — so an empty ``Optimizer.zero_grad`` of step 2 does not stay where step 1 now runs."""
    g = m.g
    loose = np.flatnonzero((m.unit < 0) & np.isfinite(g.start))
    if not len(loose):
        return
    units = m.units
    res = g.resource[units]
    length = np.nan_to_num(g.dur[units])
    for r in np.unique(g.resource[loose]).tolist():
        rows = loose[g.resource[loose] == r]
        idx = np.flatnonzero(res == r)
        if not len(idx):
            idx = np.arange(len(res))
        idx = idx[np.argsort(old_s[idx], kind="stable")]
        k = np.searchsorted(old_s[idx], g.start[rows], side="right") - 1
        has = k >= 0
        rows, u = rows[has], idx[k[has]]
        into = g.start[rows] - old_s[u]
        fu = f[units[u]]
        start[rows] = np.where(into <= length[u], new_s[u] + into * fu, new_s[u] + length[u] * fu + (into - length[u]))


def _respan_annotations(m: StepModel, start: np.ndarray, dur: np.ndarray) -> None:
    """Annotation rows span their children again (deepest first), keeping their own margins."""
    g = m.g
    ann = np.flatnonzero(m.annotation & np.isfinite(g.start))
    if not len(ann):
        return
    old_s, old_e = g.start, g.start + np.nan_to_num(g.dur)
    for d in sorted(set(m.depth[ann].tolist()), reverse=True):
        rows = ann[m.depth[ann] == d]
        kids = np.flatnonzero(np.isin(m.parent, rows) & np.isfinite(start))
        if not len(kids):
            continue
        p = m.parent[kids]
        e_new = start[kids] + np.nan_to_num(dur[kids])
        lo = np.full(len(g), np.inf)
        hi = np.full(len(g), -np.inf)
        lo_old = np.full(len(g), np.inf)
        hi_old = np.full(len(g), -np.inf)
        np.minimum.at(lo, p, start[kids])
        np.maximum.at(hi, p, e_new)
        np.minimum.at(lo_old, p, old_s[kids])
        np.maximum.at(hi_old, p, old_e[kids])
        ok = rows[np.isfinite(lo[rows])]
        s = lo[ok] - np.maximum(lo_old[ok] - old_s[ok], 0.0)
        e = hi[ok] + np.maximum(old_e[ok] - hi_old[ok], 0.0)
        start[ok] = s
        dur[ok] = e - s


def respan_tight(m: StepModel, start: np.ndarray, dur: np.ndarray) -> None:
    """Annotation rows span exactly their children (deepest first), in place."""
    g = m.g
    ann = np.flatnonzero(m.annotation)
    for d in sorted(set(m.depth[ann].tolist()), reverse=True):
        rows = ann[m.depth[ann] == d]
        kids = np.flatnonzero(np.isin(m.parent, rows) & np.isfinite(start))
        if not len(kids):
            continue
        lo = np.full(len(g), np.inf)
        hi = np.full(len(g), -np.inf)
        np.minimum.at(lo, m.parent[kids], start[kids])
        np.maximum.at(hi, m.parent[kids], start[kids] + np.nan_to_num(dur[kids]))
        ok = rows[np.isfinite(lo[rows])]
        start[ok] = lo[ok]
        dur[ok] = hi[ok] - lo[ok]


def scale_device(m: StepModel, row_factor: np.ndarray, dur: np.ndarray | None = None) -> np.ndarray:
    """Device-op durations scaled by ``row_factor`` (host rows unchanged)."""
    g = m.g
    dur = (g.dur if dur is None else dur).astype(np.float64, copy=True)
    dev = g.is_cpu_op == 0
    dur[dev] = dur[dev] * row_factor[dev]
    return dur


__all__ = ["repack", "respan_tight", "scale_device"]
