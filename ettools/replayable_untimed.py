"""Completion semantics for a graph without measured times (PyTorch ET alone): each outermost
operator stands for its subtree (:func:`collapse_untimed`). :func:`ettools.replayable.to_replayable`
hands such graphs here, since a graph without times cannot be sliced by time."""

from __future__ import annotations

import numpy as np

from ettools.graph import COMM_NODE_TYPES, EdgeKind, RankGraph


def collapse_untimed(graph: RankGraph) -> RankGraph:
    """Completion semantics for a graph without times: each outermost operator stands for its subtree.

    Operators are nodes named ``ns::op`` or carrying an ``op_schema``; record-function scopes
    (``[param|…]``, ``## … ##``) are transparent containers and are dropped. Kept: operators with
    no operator above them, and communication nodes at any depth (a collective nested in the op
    that issued it then depends on that op). Kept host ops are chained per thread in id order
    (PyTorch ET ids follow execution order); every other edge is re-pointed from a nested op to its
    nearest kept ancestor. Edges that would then point to the node itself or backwards in id order
    (they join concurrent threads and could close a cycle) are dropped and counted in
    ``meta["replayable"]["dropped_edges"]``.
    """
    g = graph
    n = len(g)
    src, dst, kind = g.edge_rows()
    ok = src >= 0
    src, dst, kind = src[ok], dst[ok], kind[ok]
    parent = np.full(n, -1, np.int64)
    nest = kind == EdgeKind.NEST
    parent[dst[nest]] = src[nest]
    is_comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    names = g.strings.decode(np.unique(g.columns["name"]))
    op_names = [g.strings.lookup(x) for x in names if "::" in x]
    is_op = np.isin(g.columns["name"], op_names)
    schema = g.attr("op_schema")
    if schema is not None:
        is_op[schema.rows[np.array([bool(v) for v in schema.values], bool)]] = True
    if not is_op.any():
        is_op[:] = True
    # nearest operator strictly above each node, by pointer jumping over the parent array
    up = np.where(parent >= 0, parent, -1)
    op_above = np.where((up >= 0) & is_op[np.maximum(up, 0)], up, -1)
    hop = np.where(op_above >= 0, -1, up)  # keep climbing where no operator found yet
    for _ in range(64):
        live = hop >= 0
        if not live.any():
            break
        found = live & (op_above < 0) & is_op[np.maximum(hop, 0)]
        op_above[found] = hop[found]
        hop = np.where(live & ~found, parent[np.maximum(hop, 0)], -1)
    keep = (is_op & (op_above < 0)) | is_comm
    # nearest kept ancestor-or-self (-1 for containers above every kept node)
    rep = np.where(keep, np.arange(n), parent)
    for _ in range(64):
        safe = np.maximum(rep, 0)
        nxt = np.where((rep < 0) | keep[safe], rep, parent[safe])
        if (nxt == rep).all():
            break
        rep = nxt
    rest = ~nest & (kind != EdgeKind.ORDER)
    e_src, e_dst, e_kind = rep[src[rest]], rep[dst[rest]], kind[rest]
    # a nested comm node hangs off the op that issued it
    hung = keep & (parent >= 0) & (rep[np.maximum(parent, 0)] >= 0)
    hung_rows = np.flatnonzero(hung)
    e_src = np.concatenate((e_src, rep[parent[hung_rows]]))
    e_dst = np.concatenate((e_dst, hung_rows))
    e_kind = np.concatenate((e_kind, np.full(len(hung_rows), EdgeKind.CTRL, np.uint8)))
    # host ops chained per thread in id order
    chained = np.flatnonzero(keep & ~hung)
    chained = chained[np.lexsort((g.id[chained], g.resource[chained]))]
    same = g.resource[chained[1:]] == g.resource[chained[:-1]]
    e_src = np.concatenate((e_src, chained[:-1][same]))
    e_dst = np.concatenate((e_dst, chained[1:][same]))
    e_kind = np.concatenate((e_kind, np.full(int(same.sum()), EdgeKind.ORDER, np.uint8)))
    ids = g.id
    valid = (e_src >= 0) & (e_dst >= 0)
    e_src, e_dst, e_kind = e_src[valid], e_dst[valid], e_kind[valid]
    forward = (e_src != e_dst) & (ids[e_src] < ids[e_dst])
    dropped = int((~forward).sum())
    e_src, e_dst, e_kind = e_src[forward], e_dst[forward], e_kind[forward]
    # one edge per (dependent, dependency, kind), in a deterministic order
    key = np.unique(np.stack((e_dst, e_src, e_kind.astype(np.int64))), axis=1)
    e_dst, e_src, e_kind = key[0], key[1], key[2].astype(np.uint8)
    sub = g.select(keep, drop_dangling=True)
    new_row = np.cumsum(keep) - 1
    rows = new_row[e_dst]
    order = np.argsort(rows, kind="stable")
    dep_ptr = np.zeros(len(sub) + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=len(sub)), out=dep_ptr[1:])
    out = RankGraph(
        sub.rank, sub.strings, sub.columns, dep_ptr, ids[e_src][order], e_kind[order], sub.attrs,
        sub.tensors, sub.in_ptr, sub.in_tensor, sub.out_ptr, sub.out_tensor, sub.meta,
    )
    out.meta["replayable"] = {"collapsed_untimed": int(n - keep.sum()), "dropped_edges": dropped}
    return out
