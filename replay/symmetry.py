"""Which ranks replay alike, so that one representative per class is simulated.

**Symmetry** (``symmetric=True``, :func:`symmetry_classes`): ranks are partitioned by colour
refinement — initial colour a hash of everything that decides their timing (node types, modelled
durations, lanes, dependencies, collective types, bytes and transfer times, per-node contention,
release time) and of what the report reads per rank besides (FLOPs and bytes of each node, the
tensor table and each node's tensors, for MFU and memory), refined by the colours of their
collective groups' members and send/recv peers until stable. Ranks of one class reach every
collective at the same time and report alike, so one representative per class is simulated; a
collective among members of several classes waits for each class's representative. A rank whose
inputs differ in anything hashed is its own class, so the partition is a proof, not a guess: a
measured multi-rank trace (every duration its own) keeps every rank, a synthesized plan collapses
to its distinct positions.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ettools.checks import structure_key
from ettools.collate import group_members
from ettools.graph import NodeType, Trace

from .program import RankPrep


def _digest(*arrays: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(a.dtype.str.encode())
        h.update(a.tobytes())
    return h.digest()


def symmetry_classes(trace: Trace, preps: dict[int, RankPrep], comm_time: dict[int, np.ndarray],
                     releases: dict[int, float] | None = None) -> dict[int, int]:
    """``{rank: representative rank}`` by colour refinement (see the module docstring); ranks
    released at different times (``releases``, rank skew) are never symmetric."""
    ranks = sorted(preps)
    base: dict[int, bytes] = {}
    cache: dict[tuple, bytes] = {}
    comm_rows: dict[int, tuple] = {}
    for r in ranks:
        p = preps[r]
        g = p.graph
        key = (structure_key(g), id(p.dur))
        d = cache.get(key)
        if d is None:
            d = _digest(g.type, p.dur, p.lane, g.dep_ptr, g.dep_id, g.comm_type, g.comm_bytes,
                        g.comm_tag, p.start_dep_src, p.start_dep_dst)
            cache[key] = d
        rel = np.array([(releases or {}).get(r, 0.0)], np.float64)
        report = (g.num_ops, g.tensor_size, g.in_ptr, g.in_tensor, g.out_ptr, g.out_tensor, *_tensor_cols(g),
                  *(() if p.contention is None else (p.contention,)))
        rkey = tuple(id(a) for a in report)
        m = cache.get(rkey)
        if m is None:
            m = cache[rkey] = _digest(*report)
        rows = comm_rows.get(id(g.type))
        if rows is None:  # ranks stamped from one graph share its type column
            rows = comm_rows[id(g.type)] = (_comm_rows(g), g.type)
        (_coll, comm, _p2p), _keep = rows
        # comm_times holds NaN off the comm rows, which the type column (in ``d``) places; ranks
        # alike share one times array
        ct = comm_time[r]
        ck = (id(ct), id(g.type))
        c = cache.get(ck)
        if c is None:
            c = cache[ck] = _digest(ct[comm])
        base[r] = _digest(np.frombuffer(d, np.uint8), np.frombuffer(m, np.uint8), np.frombuffer(c, np.uint8), rel)
    colour = _compact(base, ranks)
    # groups as ids into one list of member arrays: a group's signature is computed once per round,
    # not once per member rank (a 512-rank DP group has 512 members asking)
    group_id: dict[str, int] = {}
    group_mem: list[np.ndarray] = []
    groups_of: dict[int, list[int]] = {}
    peers_of: dict[int, np.ndarray] = {}
    for r in ranks:
        g = preps[r].graph
        rows = comm_rows[id(g.type)][0][0]
        ids = []
        for gi in set(g.comm_group[rows].tolist()):
            nm = g.strings[gi] if gi >= 0 else ""
            k = group_id.get(nm)
            if k is None:
                k = group_id[nm] = len(group_mem)
                group_mem.append(np.asarray(group_members(trace, nm) or (), np.int64))
            ids.append(k)
        groups_of[r] = ids
        prow = comm_rows[id(g.type)][0][2]
        peers_of[r] = g.comm_peer[prow].astype(np.int64)
    top = max([*ranks, *(int(m.max()) for m in group_mem if len(m)),
               *(int(p.max()) for p in peers_of.values() if len(p))], default=0)
    for _ in range(len(ranks)):
        col = np.full(top + 2, -1, np.int64)  # a rank outside the replayed ones has colour -1
        col[ranks] = [colour[r] for r in ranks]
        gsig = [_digest(np.sort(col[np.clip(m, -1, top + 1)])) for m in group_mem]  # 16 bytes each
        new: dict[int, bytes] = {}
        for r in ranks:
            sig = b"".join(sorted(gsig[k] for k in groups_of[r]))
            psig = col[np.clip(peers_of[r], -1, top + 1)]
            new[r] = _digest(np.array([colour[r]], np.int64), np.frombuffer(sig, np.uint8), psig)
        nc = _compact(new, ranks)
        if len(set(nc.values())) == len(set(colour.values())):
            colour = nc
            break
        colour = nc
    rep: dict[int, int] = {}
    first: dict[int, int] = {}
    for r in ranks:
        c = colour[r]
        first.setdefault(c, r)
        rep[r] = first[c]
    return rep


def _comm_rows(g) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the collectives, of every comm node, and of the sends and receives."""
    coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    p2p = np.flatnonzero((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE))
    return coll, np.union1d(coll, p2p), p2p


def _tensor_cols(g) -> tuple[np.ndarray, ...]:
    """The tensor-table columns the memory model reads (sizes, storages, devices, shapes)."""
    t = g.tensors
    return (t.tensor_id, t.storage_id, t.offset, t.numel, t.elem_bytes, t.device, t.shape_ptr, t.dims)


def _compact(h: dict[int, bytes], ranks: list[int]) -> dict[int, int]:
    ids: dict[bytes, int] = {}
    return {r: ids.setdefault(h[r], len(ids)) for r in ranks}

