"""Column helpers of the Kineto↔ET linker (:mod:`.link`): a rank graph's sparse attributes as
full columns, each row's first parent along an edge kind, and nesting depths."""

from __future__ import annotations

import numpy as np

from ettools.graph import EdgeKind, RankGraph


def _full_int(g: RankGraph, name: str, default: int = -1) -> np.ndarray:
    """A sparse int attribute as a full column (``default`` where absent)."""
    out = np.full(len(g), default, np.int64)
    col = g.attrs.get(name)
    if col is not None and len(col.rows):
        vals = np.fromiter((v if type(v) is int else default for v in col.values), np.int64, len(col.values))
        out[col.rows] = vals
    return out


def _full_str(g: RankGraph, name: str) -> np.ndarray:
    """A sparse string attribute as a full column of ids into ``g.strings`` (-1 where absent)."""
    out = np.full(len(g), -1, np.int32)
    col = g.attrs.get(name)
    if col is not None and len(col.rows):
        intern = g.strings.intern
        out[col.rows] = np.fromiter((intern(v) for v in col.values), np.int32, len(col.values))
    return out


def _parents(g: RankGraph, kind: EdgeKind) -> np.ndarray:
    """Row of the first dependency of ``kind`` per row (-1 if none): NEST parent, launcher."""
    src, dst, k = g.edge_rows()
    m = (k == kind) & (src >= 0)
    out = np.full(len(g), -1, np.int64)
    # reversed so the first edge of a row wins
    out[dst[m][::-1]] = src[m][::-1]
    return out


def _depth(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), np.int64)
    anc = parent.copy()
    for _ in range(10_000):
        live = anc >= 0
        if not live.any():
            break
        depth[live] += 1
        anc[live] = parent[anc[live]]
    return depth

