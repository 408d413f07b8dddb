"""Ranks that share a structure encoded once: rank graphs stamped out from one graph encode to
the same bytes but for their group keys and peers, so each later rank is the kept bytes with its
own keys and peer varints patched in (:class:`_SharedEncodings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.converters import chakra_wire as w
from ettools.graph import NodeType, RankGraph, Trace, structure_identity

from .encoder import encode_rank
from .encodings import _StringField
from .metadata import ettools_metadata_attrs, metadata_for
from .strict import WriteStats, _node_label

_POOL = 4  # patched copies a structure keeps for reuse


class _SharedEncodings:
    """Encodings of rank graphs that share every array but their groups and peers, patched per rank.

    Ranks stamped out from one graph (shared arrays) encode to the same bytes except the
    ``pg_name`` values of their collectives (each rank's own groups) and the ``comm_src`` /
    ``comm_dst`` of their sends/recvs (their rank and peers). In strict mode every group key has one
    width (:func:`group_keys`), and ranks whose rank and peers have the same varint lengths share a
    structure, so a structure is encoded once — twice: as its first rank, and with every key set to
    ``"\\1" * width`` (instead of ``"\\0" * width``) and the rank and peers XOR 1 (same varint
    length, other first byte). The bytes that differ are exactly the key bytes and the first byte
    of each peer varint, in file order; each rank sharing the structure is written as a copy with
    its own keys and varints put in place (numpy scatters, no re-encoding). The rank's groups are
    checked as the encoder checks them (defined, and the rank a member).

    Only structures another selected rank shares are kept (at most ``_LIMIT`` bytes). Outside strict
    mode (group names verbatim, any length) the group and peer columns and the rank are part of
    the key: only identical ranks share.
    """

    _LIMIT = 1 << 29  # bytes kept at most

    def __init__(self, trace: Trace, selected: list[int], keys: dict[str, str], strict: bool) -> None:
        self.strict = strict
        self.meta = trace.meta
        self.width = len(next(iter(keys.values()))) if strict and keys else 0
        # key bytes by group name; members by group name (sets, for the per-rank check)
        self._key_bytes = {nm: k.encode() for nm, k in keys.items()} if strict else {}
        self._members: dict[str, frozenset[int]] = {}
        self._keys: dict[int, tuple] = {}  # by id() of the graph: each rank's key is asked for 3 times
        counts: dict[tuple, int] = {}
        for r in selected:
            k = self._key(trace.graphs[r])
            counts[k] = counts.get(k, 0) + 1
        self._repeated = {k for k, n in counts.items() if n > 1}
        self._tpl: dict[tuple, _Template | None] = {}
        self._owner: dict[int, _Template] = {}  # id() of a patched copy being written -> its structure
        self._size = 0

    def _key(self, g: RankGraph) -> tuple:
        k = self._keys.get(id(g))
        if k is None:
            k = self._keys[id(g)] = self._compute_key(g)
        return k

    def _compute_key(self, g: RankGraph) -> tuple:
        attrs = tuple((k, id(v)) for k, v in sorted(g.attrs.items()))
        k = structure_identity(g) + (attrs, id(metadata_for(g)), repr(ettools_metadata_attrs(g)))
        p2p = (g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE)
        if not self.strict:
            return k + (id(g.comm_group), id(g.comm_peer), g.rank if p2p.any() else -1)
        # groups and peers patched: the key holds which nodes name a group / a peer and the varint
        # lengths of the rank and the peers, not their values
        peer = g.comm_peer[p2p].astype(np.int64)
        sizes = w.varint_sizes(peer.view(np.uint64)).astype(np.uint8) * (peer >= 0)
        rank_size = int(w.varint_sizes(np.array([g.rank], np.uint64))[0]) if p2p.any() else 0
        return k + (np.packbits(g.comm_group >= 0).tobytes(), sizes.tobytes(), rank_size)

    def wanted(self, g: RankGraph) -> bool:
        """Whether ``g``'s encoding will be needed again."""
        k = self._key(g)
        return k in self._repeated and k not in self._tpl and self._size < self._LIMIT

    def encode(self, g: RankGraph, keys: dict[str, str], stats: WriteStats, nf: _StringField | None) -> np.ndarray:
        """Encode ``g``'s structure, keep it, and return ``g``'s bytes."""
        before = stats.as_dict()

        def enc(h: RankGraph, k: dict[str, str], st: WriteStats, check: bool = True) -> np.ndarray:
            return np.frombuffer(b"".join(bytes(p) for p in encode_rank(h, self.meta, k, self.strict, st, nf, check)),
                                 np.uint8)

        key = self._key(g)
        if not self.strict:
            tpl = _Template(enc(g, keys, stats))
        else:
            a = enc(g, {nm: "\0" * self.width for nm in keys}, stats)
            tpl = self._sites(g, a, enc)
            if tpl is None:  # not found where expected (a writer change): encode every rank in full
                self._tpl[key] = None
                return enc(g, keys, WriteStats())
        self._tpl[key] = tpl
        tpl.stats = {k: v - before[k] for k, v in stats.as_dict().items()}
        self._size += len(tpl.data)
        return self._patched(g, tpl)

    def _sites(self, g: RankGraph, a: np.ndarray, enc: Any) -> _Template | None:
        """Where ``g``'s group keys and peer varints sit in its probe encoding ``a``."""
        t = g.type
        p2p = ((t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)) & (g.comm_peer >= 0)
        keep = (t != NodeType.METADATA_NODE) & (t != NodeType.INVALID_NODE)
        rows = np.flatnonzero(keep & ((g.comm_group >= 0) | p2p))
        rows = rows[np.argsort(g.columns["id"][rows], kind="stable")]  # file order: ascending id
        peer = g.comm_peer.astype(np.int64)
        h = g.replace(comm_peer=np.where(p2p, peer ^ 1, peer).astype(g.comm_peer.dtype))
        h.rank = g.rank ^ 1
        b = enc(h, {nm: "\1" * self.width for nm in self._key_bytes}, WriteStats(), False)
        if len(a) != len(b):
            return None
        diff = np.flatnonzero(a != b)
        # per site row: the key (width bytes) then comm_src, comm_dst (one byte each): the writer's order
        has_pg, has_p2p = g.comm_group[rows] >= 0, p2p[rows]
        per = has_pg * self.width + has_p2p * 2
        if len(diff) != int(per.sum()):
            return None
        first = np.cumsum(per) - per
        pg_rows, pg_first = rows[has_pg], first[has_pg]
        pos = diff[pg_first] if len(pg_first) else pg_first
        if len(pos) and not (diff[pg_first[:, None] + np.arange(self.width)] == pos[:, None] + np.arange(self.width)).all():
            return None
        q_rows = rows[has_p2p]
        q_first = first[has_p2p] + has_pg[has_p2p] * self.width
        send = t[q_rows] == NodeType.COMM_SEND_NODE
        tpl = _Template(a, pos, pg_rows, q_rows)
        tpl.pg_idx = (pos[:, None] + np.arange(self.width)[None, :]).ravel()
        if len(q_rows):
            # each varint's bytes, grouped by length (the lengths are part of the structure key)
            peer, rank = g.comm_peer[q_rows].astype(np.int64), np.int64(g.rank)
            tpl.send = send
            for which, (at, vals) in enumerate(((diff[q_first], np.where(send, rank, peer)),
                                                (diff[q_first + 1], np.where(send, peer, rank)))):
                lens = w.varint_sizes(vals.view(np.uint64))
                for length in np.unique(lens).tolist():
                    sel = np.flatnonzero(lens == length)
                    tpl.peer_sites.append((which, sel, (at[sel][:, None] + np.arange(length)[None, :]).ravel(),
                                           length))
        return tpl

    def lookup(self, g: RankGraph, stats: WriteStats) -> np.ndarray | None:
        """``g``'s bytes from a kept structure (its groups checked, groups and peers patched in); None if none."""
        tpl = self._tpl.get(self._key(g))
        if tpl is None:
            return None
        for name, v in tpl.stats.items():
            setattr(stats, name, getattr(stats, name) + v)
        return self._patched(g, tpl)

    def _patched(self, g: RankGraph, tpl: _Template) -> np.ndarray:
        if not len(tpl.pos) and not len(tpl.p2p_rows):
            return tpl.data
        buf = tpl.free.pop() if tpl.free else tpl.data.copy()  # a copy whose write is done, or a new one
        self._owner[id(buf)] = tpl
        if len(tpl.pos):
            gids = g.comm_group[tpl.rows]
            uniq, inv = np.unique(gids, return_inverse=True)
            table = np.empty((len(uniq), self.width), np.uint8)
            for i, gid in enumerate(uniq.tolist()):
                gname = g.strings[gid]
                members = self._members.get(gname)
                if members is None:
                    pg = self.meta.process_groups.get(gname)
                    members = self._members[gname] = frozenset(pg.ranks) if pg is not None else frozenset()
                if g.rank not in members:
                    row = int(tpl.rows[np.flatnonzero(gids == gid)[0]])
                    pg = self.meta.process_groups.get(gname)
                    raise ValueError(
                        f"{_node_label(g, row)} names process group {gname!r}, which the trace does not define"
                        if pg is None else
                        f"{_node_label(g, row)} names process group {gname!r}, whose ranks {list(pg.ranks)} "
                        f"do not include rank {g.rank}")
                table[i] = np.frombuffer(self._key_bytes[gname], np.uint8)
            buf[tpl.pg_idx] = table[inv.reshape(-1)].reshape(-1)
        if tpl.peer_sites:
            peer, rank = g.comm_peer[tpl.p2p_rows].astype(np.int64), np.int64(g.rank)
            ends = (np.where(tpl.send, rank, peer), np.where(tpl.send, peer, rank))  # comm_src, comm_dst
            for which, sel, idx, length in tpl.peer_sites:
                buf[idx] = w.varint_matrix(ends[which][sel], length).reshape(-1)
        return buf

    def recycle(self, buf: np.ndarray) -> None:
        """Take back a buffer :meth:`lookup` or :meth:`encode` returned, once its bytes are written
        (the next rank of its structure is patched into it)."""
        tpl = self._owner.pop(id(buf), None)
        if tpl is not None and len(tpl.free) < _POOL:  # a few: more would hold memory once ranks move on
            tpl.free.append(buf)


@dataclass
class _Template:
    """One structure's bytes and where its per-rank values sit: group keys (byte offsets, rows in
    file order; ``pg_idx`` every key byte) and the sends/recvs' comm_src/comm_dst varints
    (``peer_sites``: ``(0 src / 1 dst, which p2p rows, their bytes, varint length)``); ``free``:
    patched copies whose writes are done."""

    data: np.ndarray
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    p2p_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    send: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    pg_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    peer_sites: list[tuple[int, np.ndarray, np.ndarray, int]] = field(default_factory=list)
    free: list[np.ndarray] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
