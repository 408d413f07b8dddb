"""What the strict writer enforces so ASTRA-sim accepts a file: dependencies on dropped nodes
passed on, dangling, self and duplicate dependencies removed (counted in :class:`WriteStats`), and
communication nodes a simulator cannot run refused with a ``ValueError`` naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ettools.graph import CollectiveType, NodeType, RankGraph, TraceMeta

from .attributes import _I31
from .encodings import _DATA_DEP_KINDS


@dataclass
class WriteStats:
    """What the strict writer changed, summed over ranks."""

    nodes: int = 0
    dropped_nodes: int = 0  # METADATA/INVALID nodes left out
    passed_through_deps: int = 0  # dependencies inherited from a dropped node
    dangling_deps: int = 0
    self_deps: int = 0
    duplicate_deps: int = 0
    dropped_attrs: int = 0  # sparse copies of column attributes left out (strict)

    def as_dict(self) -> dict[str, int]:
        """The counts as a dict."""
        return dict(self.__dict__)


def _strict_edges(g: RankGraph, keep_row: np.ndarray, stats: WriteStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges ``(owner row, dep id, is_data)`` for the strict writer, in owner-major stored order.

    Dependencies on dropped nodes are replaced by the dropped node's own dependencies
    (transitively, in place); dangling, self and duplicate dependencies are removed.
    """
    deg = np.diff(g.dep_ptr)
    n = len(g)
    all_src = g.rows_of(g.dep_id) if len(g.dep_id) else np.zeros(0, np.int64)
    all_data = np.isin(g.dep_kind, _DATA_DEP_KINDS)
    owner = np.repeat(np.arange(n, dtype=np.int64), deg)
    sel = keep_row[owner]
    e_owner, e_id, e_src, e_data = owner[sel], g.dep_id[sel], all_src[sel], all_data[sel]
    dropped = ~keep_row
    limit = int(dropped.sum()) + 1
    rounds = 0
    while len(e_src):
        via = np.zeros(len(e_src), bool)
        has = e_src >= 0
        via[has] = dropped[e_src[has]]
        if not via.any():
            break
        rounds += 1
        if rounds > limit:  # a cycle among dropped nodes: nothing more to inherit
            keep = ~via
            e_owner, e_id, e_src, e_data = e_owner[keep], e_id[keep], e_src[keep], e_data[keep]
            break
        parents = np.flatnonzero(via)
        p_rows = e_src[parents]
        cnt = deg[p_rows]
        total = int(cnt.sum())
        child = np.repeat(g.dep_ptr[p_rows] - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt) + np.arange(total)
        kept = np.flatnonzero(~via)
        k1 = np.concatenate((kept, np.repeat(parents, cnt)))
        k2 = np.concatenate((np.zeros(len(kept), np.int64), np.arange(total) + 1))
        o = np.lexsort((k2, k1))
        stats.passed_through_deps += total
        e_owner = np.concatenate((e_owner[kept], np.repeat(e_owner[parents], cnt)))[o]
        e_id = np.concatenate((e_id[kept], g.dep_id[child]))[o]
        e_src = np.concatenate((e_src[kept], all_src[child]))[o]
        e_data = np.concatenate((e_data[kept], np.repeat(e_data[parents], cnt) & all_data[child]))[o]
    dangling = e_src < 0
    self_dep = e_src == e_owner
    stats.dangling_deps += int(dangling.sum())
    stats.self_deps += int(self_dep.sum())
    keep = ~(dangling | self_dep)
    e_owner, e_id, e_data = e_owner[keep], e_id[keep], e_data[keep]
    if len(e_id):
        o = np.lexsort((e_data, e_id, e_owner))  # stable: first of equal edges comes first
        s_owner, s_id, s_data = e_owner[o], e_id[o], e_data[o]
        dup = np.zeros(len(o), bool)
        dup[1:] = (s_owner[1:] == s_owner[:-1]) & (s_id[1:] == s_id[:-1]) & (s_data[1:] == s_data[:-1])
        if dup.any():
            stats.duplicate_deps += int(dup.sum())
            keep = np.ones(len(o), bool)
            keep[o[dup]] = False
            e_owner, e_id, e_data = e_owner[keep], e_id[keep], e_data[keep]
    return e_owner, e_id, e_data


def _node_label(g: RankGraph, row: int) -> str:
    return f"rank {g.rank}: node {int(g.columns['id'][row])} ({g.name_of(row)!r})"


def _check_strict(g: RankGraph, rows: np.ndarray, meta: TraceMeta, check_groups: bool = True) -> None:
    """Refuse comm nodes a simulator cannot run (raises ValueError naming the first); ``check_groups``:
    also that every group named is defined and holds the rank."""
    c = g.columns
    t = c["type"][rows]
    coll = t == NodeType.COMM_COLL_NODE
    p2p = (t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)
    checks = [
        (coll, "comm_type", c["comm_type"][rows] < 0),
        (coll | p2p, "comm_size", c["comm_bytes"][rows] < 0),
        (coll, "pg_name (process group)", c["comm_group"][rows] < 0),
        (p2p, "peer (comm_src/comm_dst)", c["comm_peer"][rows] < 0),
        (p2p, "comm_tag", c["comm_tag"][rows] < 0),
    ]
    for on, what, missing in checks:
        bad = np.flatnonzero(on & missing)
        if len(bad):
            row = int(rows[bad[0]])
            raise ValueError(
                f"{_node_label(g, row)} is a {NodeType(int(c['type'][row])).name} without {what} "
                f"({len(bad)} such node(s) in the rank)"
            )
    ct = c["comm_type"][rows]
    bad = np.flatnonzero(coll & (ct > max(CollectiveType)))
    if len(bad):
        row = int(rows[bad[0]])
        raise ValueError(f"{_node_label(g, row)} has unknown collective type {int(c['comm_type'][row])}")
    tags = c["comm_tag"][rows]
    bad = np.flatnonzero(tags > _I31)
    if len(bad):
        row = int(rows[bad[0]])
        raise ValueError(f"{_node_label(g, row)} has comm_tag {int(tags[bad[0]])}, beyond int32")
    groups = c["comm_group"][rows]
    used = np.unique(groups[groups >= 0]) if check_groups else groups[:0]
    for gid in used.tolist():
        gname = g.strings[gid]
        row = int(rows[np.flatnonzero(groups == gid)[0]])
        pg = meta.process_groups.get(gname)
        if pg is None:
            raise ValueError(
                f"{_node_label(g, row)} names process group {gname!r}, which the trace does not define"
            )
        if g.rank not in pg.ranks:
            raise ValueError(
                f"{_node_label(g, row)} names process group {gname!r}, whose ranks {list(pg.ranks)} "
                f"do not include rank {g.rank}"
            )
