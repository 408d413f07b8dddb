"""The edges of a PyTorch ET rank graph: NEST to the parent and ORDER between consecutive siblings
of a thread (:func:`_add_structure_edges`), and DATA from each op to the last earlier non-ancestor
writer of what it reads (:func:`_add_data_edges`)."""

from __future__ import annotations

from ettools.graph import EdgeKind, GraphBuilder


def _add_structure_edges(b: GraphBuilder, kept: list, id_to_row: dict[int, int]) -> None:
    """NEST edges to the parent and ORDER edges between consecutive siblings of one thread."""
    last_child: dict[tuple[int, int], int] = {}
    nest_rows, nest_ids, order_rows, order_ids = [], [], [], []
    for row, nid, parent, tid, _n in kept:
        if parent >= 0 and parent in id_to_row:
            nest_rows.append(row)
            nest_ids.append(parent)
        elif parent >= 0:
            parent = -1  # parent not in the file: treat as top-level (kept as a dangling-free graph)
        key = (parent, tid)
        prev = last_child.get(key)
        if prev is not None:
            order_rows.append(row)
            order_ids.append(prev)
        last_child[key] = nid
    b.add_deps(nest_rows, nest_ids, EdgeKind.NEST)
    b.add_deps(order_rows, order_ids, EdgeKind.ORDER)


def _add_data_edges(b: GraphBuilder, kept: list, reads: list, writes: list) -> None:
    """DATA edges: each op depends on the last earlier non-ancestor writer of what it reads.

    Work is linear in tensor mentions, plus the nesting depth when the last writer of a tensor
    is an ancestor of the reader (in-place ops nested in in-place ops).
    """
    parent_of = {nid: parent for _row, nid, parent, _tid, _n in kept}
    writers: dict[tuple[int, int], list[int]] = {}
    rows, ids = [], []
    for k, (row, nid, _parent, _tid, _n) in enumerate(kept):
        rd = reads[k]
        if rd:
            deps: set[int] = set()
            anc: set[int] | None = None
            for key in rd:
                wl = writers.get(key)
                if not wl:
                    continue
                j = len(wl) - 1
                w = wl[j]
                if anc is None and parent_of.get(nid, -1) >= 0:
                    anc = set()
                    p = parent_of[nid]
                    while p >= 0 and p not in anc:
                        anc.add(p)
                        p = parent_of.get(p, -1)
                if anc:
                    while j >= 0 and wl[j] in anc:
                        j -= 1
                    if j < 0:
                        continue
                    w = wl[j]
                deps.add(w)
            for d in sorted(deps):
                rows.append(row)
                ids.append(d)
        for key in writes[k]:
            wl = writers.get(key)
            if wl is None:
                writers[key] = [nid]
            elif wl[-1] != nid:
                wl.append(nid)
    b.add_deps(rows, ids, EdgeKind.DATA)
