"""Cross-rank collation: match each collective across the members of its group, each send with its recv.

Plain functions over a :class:`~ettools.graph.Trace` (networkx style), vectorized per group so
traces of thousands of ranks cost O(communication nodes + group members):

* :func:`match_collectives` — for every process group, the sequence of ``COMM_COLL`` nodes of each
  member rank, in program order (:func:`program_order`), matched by position: the k-th
  collective of a group on one member is the k-th on every other member. Reported per node:
  a member *missing* the k-th collective (fewer than the group's usual count), an *extra* one (more),
  a *type* or *bytes* differing from the value most members agree on (ties: the smaller value is
  taken as the reference; ALL_TO_ALL bytes are not compared, as all_to_allv sends a per-rank
  total that may differ between members), a node naming an
  *unknown group*, a node on a rank that is *not a member* of its group. Unknown values (-1, a
  foreign file's missing attribute) match anything here: :func:`ettools.checks.check_comm_attrs`
  reports them.
* :func:`match_p2p` — each ``COMM_SEND`` (rank r, peer p, tag t) paired with a ``COMM_RECV`` on
  rank p whose peer is r and whose tag is t, the i-th send of channel (r → p, t) with the i-th
  recv of that channel; bytes compared on each pair.

A trace may carry only some ranks of a job (``hta_world128_sampled`` has ranks 0 and 1 of 128).
What needs an absent rank cannot be checked: such collectives and sends/recvs are counted
*unverifiable*, not reported as errors. The members that are present are still compared with each
other, so a disagreement between two present ranks is reported even in a partly present group.

Group resolution: a node's ``comm_group`` names a key of ``TraceMeta.process_groups``; a node
without a group, or with group ``"0"`` when no such group is declared, belongs to the world
(ranks ``0 … world_size-1``), as in Chakra/ASTRA-sim (``pg_name`` ``""`` or ``"0"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.graph import CollectiveType, NodeType, RankGraph, Trace
from ettools.graph_algorithms import structure_key, topological_sort

_BIG = np.iinfo(np.int64).max


@dataclass
class Unmatched:
    """One node (or, for *missing*, one expected node) that failed to match."""

    rank: int
    node_id: int | None  # None when the node is missing
    name: str
    group: str
    kind: str  # missing | extra | type | bytes | unknown_group | not_member | no_peer | unpaired
    reason: str
    index: int | None = None  # position in the group's (or channel's) sequence

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable dict."""
        return {
            "rank": self.rank, "node_id": self.node_id, "name": self.name, "group": self.group,
            "index": self.index, "kind": self.kind, "reason": self.reason,
        }


@dataclass
class CollationReport:
    """Result of :func:`match_collectives` or :func:`match_p2p`.

    ``matched``: collective instances (one per group and position) or send/recv pairs verified on
    every side; ``unverifiable``: instances/pairs that need a rank the trace does not carry (and
    agree on the ranks it does); ``unmatched``: the failures, one entry per node.
    """

    what: str  # "collectives" or "p2p"
    nodes: int = 0  # communication nodes examined
    matched: int = 0
    matched_nodes: int = 0
    unverifiable: int = 0
    unverifiable_nodes: int = 0
    unmatched: list[Unmatched] = field(default_factory=list)
    groups: int = 0  # groups (collectives) or channels (p2p) seen
    partial_groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is unmatched (unverifiable items are not failures)."""
        return not self.unmatched

    def to_dict(self, max_items: int | None = 1000) -> dict[str, Any]:
        """JSON-serializable summary; lists are cut to ``max_items`` entries (None: all)."""
        cut = slice(None) if max_items is None else slice(max_items)
        key = "collectives" if self.what == "collectives" else "comm_nodes"
        return {
            key: self.nodes,
            "groups" if self.what == "collectives" else "channels": self.groups,
            "matched": self.matched,
            "matched_nodes": self.matched_nodes,
            "unmatched_count": len(self.unmatched),
            "unverifiable": self.unverifiable,
            "unverifiable_nodes": self.unverifiable_nodes,
            "unmatched": [u.to_dict() for u in self.unmatched[cut]],
            "partial_groups": self.partial_groups[cut],
        }


# ---- ordering ----------------------------------------------------------------------------------

def program_order(g: RankGraph, rows: np.ndarray, _topo: dict[tuple, np.ndarray] | None = None) -> np.ndarray:
    """A sort key for ``rows`` of ``g`` giving their program order on that rank.

    By start time (ties by id) when every one of ``rows`` has a start time; otherwise by position
    in a topological order (:func:`ettools.checks.topological_sort`), falling back to id order if
    ``g`` is cyclic.
    Keys are comparable only within one rank. ``_topo`` caches topological positions per graph
    structure, so ranks stamped out from one graph (sharing arrays) sort once.
    """
    rows = np.asarray(rows, np.int64)
    start = g.start[rows]
    if len(rows) and np.isfinite(start).all():
        o = np.lexsort((g.id[rows], start))
        key = np.empty(len(rows), np.int64)
        key[o] = np.arange(len(rows))
        return key
    key = structure_key(g)
    pos = None if _topo is None else _topo.get(key)
    if pos is None:
        order, cyclic, _ = topological_sort(g)
        if cyclic.any():
            order = np.argsort(g.id, kind="stable")
        pos = np.empty(len(g), np.int64)
        pos[order] = np.arange(len(g))
        if _topo is not None:
            _topo[key] = pos
    return pos[rows]


def group_members(trace: Trace, name: str) -> tuple[int, ...] | None:
    """Global ranks of process group ``name`` (``""``/undeclared ``"0"``: the world); None if unknown."""
    pg = trace.meta.process_groups.get(name)
    if pg is not None:
        return tuple(pg.ranks)
    if name in ("", "0"):
        return tuple(range(max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)))
    return None


def _column_mode(mat: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per column, the most frequent valid value (ties: the smallest); ``_BIG`` where none is valid."""
    m, k = mat.shape
    if m == 0 or k == 0:
        return np.full(k, _BIG, np.int64)
    s = np.sort(np.where(valid, mat, _BIG), axis=0)
    idx = np.broadcast_to(np.arange(m)[:, None], (m, k))
    new_run = np.ones((m, k), bool)
    new_run[1:] = s[1:] != s[:-1]
    run_start = np.maximum.accumulate(np.where(new_run, idx, 0), axis=0)
    length = idx - run_start + 1
    length[s == _BIG] = 0
    best = np.argmax(length, axis=0)
    return s[best, np.arange(k)]


def _count_mode(counts: np.ndarray) -> int:
    """The most frequent count (ties: the largest, so a shorter member is 'missing', not the longer 'extra')."""
    vals, freq = np.unique(counts, return_counts=True)
    return int(vals[freq == freq.max()].max())


# ---- collectives ---------------------------------------------------------------------------------

def group_sequences(trace: Trace, order: Callable[[RankGraph, np.ndarray, dict], np.ndarray] | None = None) -> dict[str, dict[int, np.ndarray]]:
    """Group name -> {rank: rows of that rank's ``COMM_COLL`` nodes in the group, in order}.

    ``order(g, rows, cache)`` gives each row's sort key (default :func:`program_order`; the replay
    passes its issue order)."""
    order = order or program_order
    cache: dict[tuple, np.ndarray] = {}
    seqs: dict[str, dict[int, np.ndarray]] = {}
    for rank in trace.ranks:
        g = trace.graphs[rank]
        rows = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
        if not len(rows):
            continue
        gid = g.comm_group[rows].astype(np.int64)
        key = order(g, rows, cache)
        o = np.lexsort((key, gid))
        rows, gid = rows[o], gid[o]
        cut = np.flatnonzero(np.diff(gid)) + 1
        for seg in np.split(np.arange(len(rows)), cut):
            gi = int(gid[seg[0]])
            name = g.strings[gi] if gi >= 0 else ""
            seqs.setdefault(name, {})[rank] = rows[seg]
    return seqs


def match_collectives(trace: Trace) -> CollationReport:
    """Match every ``COMM_COLL`` node across the members of its process group (see module doc)."""
    rep = CollationReport("collectives")
    rep.nodes = sum(int((trace.graphs[r].type == NodeType.COMM_COLL_NODE).sum()) for r in trace.ranks)
    seqs = group_sequences(trace)
    rep.groups = len(seqs)
    for name in sorted(seqs):
        _match_group(trace, name, seqs[name], rep)
    return rep


def _match_group(trace: Trace, name: str, by_rank: dict[int, np.ndarray], rep: CollationReport) -> None:
    members = group_members(trace, name)
    if members is None:
        for rank, rows in sorted(by_rank.items()):
            g = trace.graphs[rank]
            for k, r in enumerate(rows.tolist()):
                rep.unmatched.append(Unmatched(
                    rank, int(g.id[r]), g.name_of(r), name, "unknown_group",
                    f"process group {name!r} is not declared in the trace's process groups", k))
        return
    member_set = set(members)
    for rank, rows in sorted(by_rank.items()):
        if rank not in member_set:
            g = trace.graphs[rank]
            for k, r in enumerate(rows.tolist()):
                rep.unmatched.append(Unmatched(
                    rank, int(g.id[r]), g.name_of(r), name, "not_member",
                    f"rank {rank} is not a member of process group {name!r}", k))
    present = [m for m in members if m in trace.graphs]
    absent = len(members) - len(present)
    if not present:
        return
    counts = np.array([len(by_rank.get(m, ())) for m in present], np.int64)
    kmax = int(counts.max())
    if kmax == 0:
        return
    mcount = len(present)
    valid = np.arange(kmax)[None, :] < counts[:, None]
    ctype = np.full((mcount, kmax), -1, np.int64)
    cbytes = np.full((mcount, kmax), -1, np.int64)
    rowmat = np.full((mcount, kmax), -1, np.int64)
    for i, m in enumerate(present):
        rows = by_rank.get(m)
        if rows is None or not len(rows):
            continue
        g = trace.graphs[m]
        n = len(rows)
        ctype[i, :n] = g.comm_type[rows]
        cbytes[i, :n] = g.comm_bytes[rows]
        rowmat[i, :n] = rows
    kref = _count_mode(counts)
    type_ref = _column_mode(ctype, valid & (ctype >= 0))
    bad_type = valid & (ctype >= 0) & (type_ref[None, :] != _BIG) & (ctype != type_ref[None, :])
    # bytes are compared among the members that agree on the type; all_to_all(v) moves a
    # per-rank total that may differ between members, so it is not compared
    same_type = valid & ~bad_type & (ctype != CollectiveType.ALL_TO_ALL)
    bytes_ref = _column_mode(cbytes, same_type & (cbytes >= 0))
    bad_bytes = same_type & (cbytes >= 0) & (bytes_ref[None, :] != _BIG) & (cbytes != bytes_ref[None, :])
    cols = np.arange(kmax)[None, :]
    missing = (~valid) & (cols < kref)
    extra = valid & (cols >= kref)
    bad_col = (bad_type | bad_bytes | missing | extra).any(axis=0)
    good_col = ~bad_col
    good_nodes = int((valid & good_col[None, :]).sum())
    if absent == 0:
        rep.matched += int(good_col.sum())
        rep.matched_nodes += good_nodes
    else:
        rep.unverifiable += int(good_col.sum())
        rep.unverifiable_nodes += good_nodes
        rep.partial_groups.append({
            "group": name, "members": len(members), "present": len(present), "absent": absent,
            "collectives": int(kmax),
        })

    def ref_node(k: int) -> tuple[str, int]:
        # a member that has position k: its node name, for naming a missing collective
        i = int(np.flatnonzero(valid[:, k])[0])
        g = trace.graphs[present[i]]
        return g.name_of(int(rowmat[i, k])), present[i]

    def where(mask: np.ndarray) -> str:
        # the members holding the reference value, for the message
        ranks = [present[j] for j in np.flatnonzero(mask)[:4].tolist()]
        total = int(mask.sum())
        if total == 1:
            return f"on rank {ranks[0]}"
        shown = ", ".join(map(str, ranks[:3])) + (", …" if total > 3 else "")
        return f"on {total} other members (ranks {shown})"

    for i, k in zip(*np.nonzero(bad_type | bad_bytes | extra)):
        i, k = int(i), int(k)
        rank = present[i]
        g = trace.graphs[rank]
        r = int(rowmat[i, k])
        if extra[i, k]:
            kind = "extra"
            reason = (f"collective #{k} of group {name!r} on rank {rank}, but most of the group's "
                      f"{len(present)} present members issue only {kref}")
        elif bad_type[i, k]:
            kind = "type"
            reason = (f"collective #{k} of group {name!r} is {_ctype_name(ctype[i, k])} on rank {rank} "
                      f"but {_ctype_name(type_ref[k])} {where(ctype[:, k] == type_ref[k])}")
        else:
            kind = "bytes"
            reason = (f"collective #{k} of group {name!r} has {int(cbytes[i, k])} bytes on rank {rank} "
                      f"but {int(bytes_ref[k])} {where(same_type[:, k] & (cbytes[:, k] == bytes_ref[k]))}")
        rep.unmatched.append(Unmatched(rank, int(g.id[r]), g.name_of(r), name, kind, reason, k))
    for i, k in zip(*np.nonzero(missing)):
        i, k = int(i), int(k)
        rname, other = ref_node(k)
        rep.unmatched.append(Unmatched(
            present[i], None, rname, name, "missing",
            f"rank {present[i]} has {int(counts[i])} collectives in group {name!r}; collective #{k} "
            f"({rname}, present on rank {other}) is missing", k))


def _ctype_name(v: int) -> str:
    try:
        return CollectiveType(int(v)).name
    except ValueError:
        return f"type {int(v)}"


# ---- send / recv ---------------------------------------------------------------------------------

def match_p2p(trace: Trace) -> CollationReport:
    """Pair each send with a recv: same channel (src rank, dst rank, tag), same position, equal bytes."""
    rep = CollationReport("p2p")
    topo: dict[tuple, np.ndarray] = {}
    world = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)
    parts: list[tuple[np.ndarray, ...]] = []
    for rank in trace.ranks:
        g = trace.graphs[rank]
        t = g.type
        rows = np.flatnonzero((t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE))
        if not len(rows):
            continue
        rep.nodes += len(rows)
        is_recv = (t[rows] == NodeType.COMM_RECV_NODE).astype(np.int64)
        peer = g.comm_peer[rows].astype(np.int64)
        me = np.full(len(rows), rank, np.int64)
        src = np.where(is_recv == 1, peer, me)
        dst = np.where(is_recv == 1, me, peer)
        parts.append((src, dst, g.comm_tag[rows].astype(np.int64), g.comm_bytes[rows].astype(np.int64),
                      program_order(g, rows, topo), is_recv, me, rows))
    if not parts:
        return rep
    src, dst, tag, nbytes, key, is_recv, owner, row = (np.concatenate(c) for c in zip(*parts))
    peer = np.where(is_recv == 1, src, dst)
    bad_peer = (peer < 0) | (peer >= world)
    absent_peer = ~bad_peer & ~np.isin(peer, np.asarray(trace.ranks, np.int64))
    for j in np.flatnonzero(bad_peer).tolist():
        g = trace.graphs[int(owner[j])]
        r = int(row[j])
        what = "no peer rank" if peer[j] < 0 else f"peer rank {int(peer[j])} outside the world of {world}"
        rep.unmatched.append(Unmatched(int(owner[j]), int(g.id[r]), g.name_of(r), g.group_name(r),
                                       "no_peer", f"{'recv' if is_recv[j] else 'send'} with {what}"))
    rep.unverifiable_nodes = int(absent_peer.sum())
    live = np.flatnonzero(~bad_peer & ~absent_peer)
    # channel position: i-th send (or recv) of (src, dst, tag) in program order
    o = live[np.lexsort((key[live], tag[live], dst[live], src[live], is_recv[live]))]
    chan = np.stack([is_recv[o], src[o], dst[o], tag[o]])
    new = np.ones(len(o), bool)
    new[1:] = (chan[:, 1:] != chan[:, :-1]).any(axis=0)
    seg_start = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
    seq = np.empty(len(src), np.int64)
    seq[o] = np.arange(len(o)) - seg_start
    # join sends and recvs on (src, dst, tag, seq): sort with the flag last, pairs are adjacent
    o2 = live[np.lexsort((is_recv[live], seq[live], tag[live], dst[live], src[live]))]
    k2 = np.stack([src[o2], dst[o2], tag[o2], seq[o2]])
    same = np.zeros(len(o2), bool)
    if len(o2) > 1:
        same[:-1] = (k2[:, 1:] == k2[:, :-1]).all(axis=0) & (is_recv[o2[:-1]] == 0) & (is_recv[o2[1:]] == 1)
    s_idx, r_idx = o2[:-1][same[:-1]], o2[1:][same[:-1]]
    paired = np.zeros(len(src), bool)
    paired[s_idx] = True
    paired[r_idx] = True
    bb = (nbytes[s_idx] >= 0) & (nbytes[r_idx] >= 0) & (nbytes[s_idx] != nbytes[r_idx])
    rep.matched = int((~bb).sum())
    rep.matched_nodes = 2 * rep.matched
    chans = {(int(a), int(b), int(c)) for a, b, c in zip(src[o][new], dst[o][new], tag[o][new])}
    rep.groups = len(chans)
    for s, r in zip(s_idx[bb].tolist(), r_idx[bb].tolist()):
        gs, gr = trace.graphs[int(owner[s])], trace.graphs[int(owner[r])]
        rs, rr = int(row[s]), int(row[r])
        rep.unmatched.append(Unmatched(
            int(owner[s]), int(gs.id[rs]), gs.name_of(rs), gs.group_name(rs), "bytes",
            f"send #{int(seq[s])} to rank {int(dst[s])} tag {int(tag[s])} has {int(nbytes[s])} bytes but "
            f"its recv (rank {int(owner[r])} node {int(gr.id[rr])}) has {int(nbytes[r])}", int(seq[s])))
    for j in live[~paired[live]].tolist():
        g = trace.graphs[int(owner[j])]
        r = int(row[j])
        if is_recv[j]:
            reason = (f"recv #{int(seq[j])} from rank {int(src[j])} tag {int(tag[j])} has no matching send "
                      f"on rank {int(src[j])}")
        else:
            reason = (f"send #{int(seq[j])} to rank {int(dst[j])} tag {int(tag[j])} has no matching recv "
                      f"on rank {int(dst[j])}")
        rep.unmatched.append(Unmatched(int(owner[j]), int(g.id[r]), g.name_of(r), g.group_name(r),
                                       "unpaired", reason, int(seq[j])))
    rep.unverifiable = rep.unverifiable_nodes
    return rep
