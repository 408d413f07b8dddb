"""How an op's duration changes when its work does: the time model shared by the passes.

A pass that changes an op's work (rescale, tensor / expert parallelism) knows its cost before and
after (:func:`ettools.scaler.rescale.op_cost`: FLOPs for GEMM/attention, elements touched
otherwise). The new duration is the measured one times a ratio:

* with a calibrated compute model (``fit``, :mod:`ettools.replay.calibrate`), device ops take
  ``fit(new) / fit(old)``;
* otherwise the trace calibrates itself (:func:`affine_ratio`): per op name, when the trace holds
  that op at two or more sizes, a line ``t = a + b·cost`` (``a, b ≥ 0``) is fitted through the
  median time at each size, and the ratio is ``(a + b·new) / (a + b·old)``. A fixed per-call
  overhead (the ``a``) does not shrink with the work: small host ops on a CPU keep most of their
  time when split four ways, large GPU kernels scale with their FLOPs. Ops seen at one size only
  use their op class's line (fitted on every leaf op of the class, each name's times normalised
  by its median), then the plain cost ratio (TrioSim's rule).
"""

from __future__ import annotations

import numpy as np

from ettools.classify import classify_names


def fit_line(c: np.ndarray, t: np.ndarray) -> tuple[float, float] | None:
    """Non-negative ``(a, b)`` of ``t ≈ a + b·c`` on relative error, or None when underdetermined."""
    from scipy.optimize import nnls

    uc = np.unique(c)
    if len(uc) < 2:
        return None
    med = np.array([np.median(t[c == x]) for x in uc])
    w = 1.0 / np.maximum(med, 1e-6)
    X = np.stack([np.ones(len(uc)), uc], axis=1) * w[:, None]
    (a, b), _ = nnls(X, med * w)
    if a <= 0 and b <= 0:
        return None
    return float(a), float(b)


def affine_ratio(g, leaf: np.ndarray, cost_old: np.ndarray, cost_new: np.ndarray) -> np.ndarray:
    """Per row: duration ratio from lines fitted on ``g``'s own ``leaf`` rows (see the module doc); NaN where unknown."""
    n = len(g)
    out = np.full(n, np.nan)
    dur = g.dur
    ok = leaf & np.isfinite(cost_old) & (cost_old > 0) & np.isfinite(dur) & (dur > 0)
    rows = np.flatnonzero(ok)
    want = np.flatnonzero(np.isfinite(cost_old) & (cost_old > 0) & np.isfinite(cost_new))
    if not len(rows) or not len(want):
        return out
    name = g.name
    lines: dict[int, tuple[float, float]] = {}
    by_name = {}
    order = np.argsort(name[rows], kind="stable")
    r_sorted = rows[order]
    cut = np.flatnonzero(np.diff(name[r_sorted])) + 1
    for grp in np.split(r_sorted, cut):
        if not len(grp):
            continue
        by_name[int(name[grp[0]])] = grp
        ln = fit_line(cost_old[grp], dur[grp])
        if ln is not None:
            lines[int(name[grp[0]])] = ln
    # class lines: every name's times normalised by its own median, against cost normalised likewise
    cls = classify_names(name, g.strings)
    class_lines: dict[int, tuple[float, float]] = {}
    for c in np.unique(cls[rows]).tolist():
        cs, ts = [], []
        for grp in by_name.values():
            if cls[grp[0]] != c:
                continue
            mc, mt = np.median(cost_old[grp]), np.median(dur[grp])
            if mc > 0 and mt > 0:
                cs.append(cost_old[grp] / mc)
                ts.append(dur[grp] / mt)
        if cs:
            ln = fit_line(np.concatenate(cs).round(6), np.concatenate(ts))
            if ln is not None:
                class_lines[c] = ln
    med_cost = {k: float(np.median(cost_old[v])) for k, v in by_name.items()}
    for r in want.tolist():
        k = int(name[r])
        ln = lines.get(k)
        if ln is not None:
            a, b = ln
            old, new = a + b * cost_old[r], a + b * cost_new[r]
        else:
            cl = class_lines.get(int(cls[r]))
            mc = med_cost.get(k, cost_old[r])
            if cl is None or mc <= 0:
                continue
            a, b = cl
            old, new = a + b * cost_old[r] / mc, a + b * cost_new[r] / mc
        if old > 0:
            out[r] = new / old
    return out


__all__ = ["affine_ratio", "fit_line"]
