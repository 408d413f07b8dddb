"""Data flow between units: which top-level operator feeds which.

Built from the ``DATA`` edges readers derive from tensor ids (PyTorch ET, linked ET+Kineto): an
edge between two rows becomes an edge between their units. A graph without any ``DATA`` edge
(Kineto alone) falls back to a chain: each forward unit feeds the next one (exact for plain
feed-forward stacks, a simplification where a network branches).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from ettools.graph import EdgeKind
from ettools.scaler.model import BWD, FWD, PRE, StepModel


class UnitFlow:
    """Successors and predecessors of every unit (rows of units as keys)."""

    def __init__(self, m: StepModel) -> None:
        self.m = m
        g = m.g
        src, dst, kind = g.edge_rows()
        ok = (kind == EdgeKind.DATA) & (src >= 0)
        su, du = m.unit[src[ok]], m.unit[dst[ok]]
        keep = (su >= 0) & (du >= 0) & (su != du)
        pairs = np.unique(np.stack([su[keep], du[keep]], axis=1), axis=0) if keep.any() else np.zeros((0, 2), np.int64)
        self.exact = bool(ok.any())
        if not self.exact:
            fw = m.units[np.isin(m.phase[m.units], (PRE, FWD))]
            pairs = np.stack([fw[:-1], fw[1:]], axis=1) if len(fw) > 1 else np.zeros((0, 2), np.int64)
            bw = m.units[m.phase[m.units] == BWD]
            if len(bw) > 1:
                pairs = np.concatenate([pairs, np.stack([bw[:-1], bw[1:]], axis=1)])
        self.succ: dict[int, list[int]] = {}
        self.pred: dict[int, list[int]] = {}
        for a, b in pairs.tolist():
            self.succ.setdefault(a, []).append(b)
            self.pred.setdefault(b, []).append(a)

    def reach(self, starts: Iterable[int], forward: bool = True, stop: set[int] | None = None,
              within: set[int] | None = None) -> set[int]:
        """Units reachable from ``starts`` (not included unless reached again); ``stop`` units are
        reached but not expanded; only units in ``within`` are visited when given."""
        adj = self.succ if forward else self.pred
        seen: set[int] = set()
        q = deque(starts)
        while q:
            u = q.popleft()
            for v in adj.get(u, ()):
                if v in seen or (within is not None and v not in within):
                    continue
                seen.add(v)
                if stop is None or v not in stop:
                    q.append(v)
        return seen


__all__ = ["UnitFlow"]
