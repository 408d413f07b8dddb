"""The order a rank issued its communication in: the key that matches the k-th collective of a
group (and the i-th send of a channel) across ranks, for the replay and the network fit alike."""

from __future__ import annotations

import numpy as np

from ettools.collate import program_order
from ettools.graph import EdgeKind, RankGraph


def issue_order(g: RankGraph, rows: np.ndarray, topo: dict | None = None) -> np.ndarray:
    """Program-order key of comm nodes: when they were issued (the start of the host slice that
    launched them, through a ``comm_dispatch`` node for host transfers), else their own position
    (:func:`ettools.collate.program_order`). gloo runs collectives on several runloop threads, so
    their own start times need not follow the order the program issued them in."""
    base = program_order(g, rows, topo).astype(np.float64)
    if not len(rows) or not np.isfinite(g.start[rows]).all():
        return base
    src, dst, kind = g.edge_rows()
    ok = src >= 0
    src, dst, kind = src[ok], dst[ok], kind[ok]
    issue = np.full(len(g), np.nan)
    lsel = kind == EdgeKind.LAUNCH
    issue[dst[lsel]] = g.start[src[lsel]]
    disp_id = g.strings.lookup("comm_dispatch")
    if disp_id >= 0:
        via = (g.name[src] == disp_id) & np.isin(dst, rows)
        issue[dst[via]] = issue[src[via]]
    key = np.where(np.isfinite(issue[rows]), issue[rows], g.start[rows])
    return np.lexsort((g.id[rows], key)).argsort().astype(np.float64)
