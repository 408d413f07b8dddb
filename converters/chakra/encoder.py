"""One rank graph encoded as the bytes of its ``.et`` stream: the GlobalMetadata frame, then the
node frames in ascending id order, a chunk of nodes at a time (:func:`encode_rank`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ettools.converters import chakra_wire as w
from ettools.graph import AttrColumn, NodeType, RankGraph, TraceMeta

from .attributes import (
    _ATTR_FIELDS,
    COLUMN_ATTR_NAMES,
    INT_COLUMN_ATTRS,
    IO_ATTRS,
    attr_message,
    canonical_kind,
    split_attr_key,
)
from .encodings import _ATTR_KEY, _DATA_DEP_KINDS, Seg, _attr_prefix, _io_entries, _StringField, attr_entries
from .metadata import ettools_metadata_attrs, metadata_for, metadata_message
from .strict import WriteStats, _check_strict, _node_label, _strict_edges
from .times import _time_us, diffused_us, duration_lanes, included_stream_gap

# nodes encoded per array of frames: the encoding's temporaries cost ~1.2 KB per node (65,536 nodes:
# ~80 MB, the peak of a whole convert); 8,192 keep them ~10 MB at the same CPU time (issue 26)
CHUNK_NODES = 1 << 13


# Attribute sources: the entries of one attribute over the emitted nodes.
@dataclass
class _AttrSource:
    pos: np.ndarray  # emission positions, ascending
    encode: Any  # (k0, k1) -> Seg of complete field-10 (or IOInfo field) entries


class _RankEncoder:
    """Turns one rank graph into Chakra frames, a chunk of nodes at a time."""

    def __init__(self, g: RankGraph, meta: TraceMeta, keys: dict[str, str], strict: bool,
                 stats: WriteStats, name_field: _StringField, check_groups: bool = True) -> None:
        self.g = g
        self.strict = strict
        c = g.columns
        n = len(g)
        types = c["type"]
        if strict:
            keep_row = (types != NodeType.METADATA_NODE) & (types != NodeType.INVALID_NODE)
            stats.dropped_nodes += int(n - keep_row.sum())
        else:
            keep_row = np.ones(n, bool)
        rows = np.flatnonzero(keep_row)
        order = rows[np.argsort(c["id"][rows], kind="stable")]
        self.order = order
        self.m = len(order)
        stats.nodes += self.m
        pos_of_row = np.full(n, -1, np.int64)
        pos_of_row[order] = np.arange(self.m)
        if strict:
            ids = c["id"][order]
            dup = np.flatnonzero(ids[1:] == ids[:-1])
            if len(dup):
                raise ValueError(f"rank {g.rank}: node id {int(ids[dup[0]])} is used by more than one node")
            _check_strict(g, order, meta, check_groups)
            e_owner, e_id, e_data = _strict_edges(g, keep_row, stats)
        else:
            e_owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
            e_id, e_data = g.dep_id, np.isin(g.dep_kind, _DATA_DEP_KINDS)
        e_pos = pos_of_row[e_owner]
        o = np.argsort(e_pos, kind="stable")
        self.e_pos, self.e_id, self.e_data = e_pos[o], e_id[o], e_data[o]

        self.name_field = name_field
        self.cols = {k: c[k][order] for k in ("id", "name", "type")}
        self.start = _time_us(c["start"][order])
        dur = c["dur"][order]
        gap = included_stream_gap(g)
        if gap:
            # measured device time in duration_micros; the gap goes to GlobalMetadata
            dur = np.where(c["is_cpu_op"][order] == 0, dur - gap, dur)
        self.dur = diffused_us(dur, duration_lanes(g, order), c["start"][order], self.cols["id"])
        self.sources = self._attr_sources(g, meta, keys, pos_of_row, stats)

    # -- attributes ----------------------------------------------------------------------------
    def _kind(self, attr: str) -> str:
        canon = canonical_kind(attr)
        assert canon is not None
        if self.strict:
            return canon
        return self.g.meta.get("chakra_attr_kinds", {}).get(attr, canon)

    def _column_source(self, attr: str, values: np.ndarray, present: np.ndarray) -> _AttrSource:
        pos = np.flatnonzero(present)
        vals = values[pos]
        kind = self._kind(attr)
        return _AttrSource(pos, lambda k0, k1: attr_entries(attr, kind, vals[k0:k1]))

    def _string_source(self, attr: str, ids: np.ndarray, rename: dict[str, str] | None) -> _AttrSource:
        pos = np.flatnonzero(ids >= 0)
        sids = ids[pos]
        inner = _StringField(self.g.strings, w.tag(_ATTR_FIELDS["string_val"], w.WT_LEN), False, rename)
        head = _attr_prefix(attr, "string_val")

        def encode(k0: int, k1: int) -> Seg:
            part = sids[k0:k1]
            body = w.concat([w.const_all(head, len(part)), inner.seg(part)])
            return w.length_delimited(_ATTR_KEY, body, np.ones(len(part), bool))

        return _AttrSource(pos, encode)

    def _attr_sources(self, g: RankGraph, meta: TraceMeta, keys: dict[str, str], pos_of_row: np.ndarray,
                      stats: WriteStats) -> list[_AttrSource]:
        c = g.columns
        order = self.order
        out: list[_AttrSource] = []
        io: dict[str, _AttrSource] = {}
        for attr, (col, _canon, _lo, _hi) in INT_COLUMN_ATTRS.items():
            v = c[col][order]
            if attr == "comm_tag":
                continue  # written after the peers, below
            out.append(self._column_source(attr, v, v >= 0))
            if attr == "comm_size":
                groups = c["comm_group"][order]
                out.append(self._string_source("pg_name", groups, keys if self.strict else None))
        t = c["type"][order]
        peer = c["comm_peer"][order].astype(np.int64)
        p2p = ((t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)) & (peer >= 0)
        send = t == NodeType.COMM_SEND_NODE
        rank = np.int64(g.rank)
        out.append(self._column_source("comm_src", np.where(send, rank, peer), p2p))
        out.append(self._column_source("comm_dst", np.where(send, peer, rank), p2p))
        tag_col = c["comm_tag"][order]
        out.append(self._column_source("comm_tag", tag_col, tag_col >= 0))
        out.append(self._string_source("resource", c["resource"][order], None))

        for key, col in g.attrs.items():
            name, suffix = split_attr_key(key)
            if col.kind == "io" and name in IO_ATTRS and suffix is None:
                src = self._sparse(col, pos_of_row, lambda vals, name=name: _io_entries(name, vals))
                if src is not None:
                    io[name] = src
                continue
            if self.strict and name in COLUMN_ATTR_NAMES:
                stats.dropped_attrs += len(col.rows)
                continue
            kind = col.kind
            src = self._sparse(col, pos_of_row, lambda vals, name=name, kind=kind: attr_entries(name, kind, vals))
            if src is not None:
                out.append(src)
        self.io = [io.get("inputs"), io.get("outputs")]
        return out

    @staticmethod
    def _sparse(col: AttrColumn, pos_of_row: np.ndarray, enc: Any) -> _AttrSource | None:
        rows = np.asarray(col.rows, np.int64)
        pos = pos_of_row[rows] if len(rows) else rows
        sel = np.flatnonzero(pos >= 0)
        if not len(sel):
            return None
        o = sel[np.argsort(pos[sel], kind="stable")]
        values = col.values
        if len(o) == len(values) and (o == np.arange(len(o))).all():
            vals = values
        else:
            vals = [values[i] for i in o.tolist()]
        p = pos[o]
        if isinstance(vals, np.ndarray):
            vals = vals.tolist()
        return _AttrSource(p, lambda k0, k1: enc(vals[k0:k1]))

    # -- nodes ---------------------------------------------------------------------------------
    def chunks(self, chunk: int = CHUNK_NODES) -> Iterator[np.ndarray]:
        """Frames of the nodes, ``chunk`` nodes per array of bytes."""
        for a in range(0, self.m, chunk):
            b = min(a + chunk, self.m)
            yield self._encode(a, b)

    def _placed(self, src: _AttrSource | None, a: int, b: int) -> Seg | None:
        if src is None:
            return None
        k0, k1 = np.searchsorted(src.pos, [a, b])
        if k0 == k1:
            return None
        return w.scatter(src.encode(int(k0), int(k1)), src.pos[k0:k1] - a, b - a)

    def _encode(self, a: int, b: int) -> np.ndarray:
        m = b - a
        ids = self.cols["id"][a:b]
        types = self.cols["type"][a:b]
        segs: list[Seg] = [
            w.varint_field(1, ids, ids != 0),
            self.name_field.seg(self.cols["name"][a:b]),
            w.varint_field(3, types, types != 0),
        ]
        e0, e1 = np.searchsorted(self.e_pos, [a, b])
        e_pos, e_id, e_data = self.e_pos[e0:e1] - a, self.e_id[e0:e1], self.e_data[e0:e1]
        ctrl = ~e_data
        segs.append(w.packed_field(4, e_pos[ctrl], e_id[ctrl], m))
        segs.append(w.packed_field(5, e_pos[e_data], e_id[e_data], m))
        start, dur = self.start[a:b], self.dur[a:b]
        segs.append(w.varint_field(6, start, start != 0))
        segs.append(w.varint_field(7, dur, dur != 0))
        for src in self.io + self.sources:
            s = self._placed(src, a, b)
            if s is not None:
                segs.append(s)
        lens = np.sum([w.lengths(s) for s in segs], axis=0)
        if (lens == 0).any():
            row = int(self.order[a + int(np.flatnonzero(lens == 0)[0])])
            raise ValueError(
                f"{_node_label(self.g, row)} has only default fields: its empty frame would end the stream"
            )
        return w.frames(segs)[0]


def encode_rank(g: RankGraph, meta: TraceMeta, keys: dict[str, str], strict: bool, stats: WriteStats,
                name_field: _StringField | None = None, check_groups: bool = True) -> Iterator[bytes | np.ndarray]:
    """The bytes of one rank's ``.et`` stream: GlobalMetadata frame, then node frames in chunks.
    ``check_groups=False`` skips the check that the rank belongs to the groups it names (for a
    probe encoding with other ranks)."""
    gm_msg = metadata_message(metadata_for(g), strict)
    for name, kind, value in ettools_metadata_attrs(g):
        gm_msg.attr.append(attr_message(name, kind, value))
    gm = gm_msg.SerializeToString()
    yield w.varint_bytes(len(gm)) + gm
    enc = _RankEncoder(g, meta, keys, strict, stats,
                       name_field or _StringField(g.strings, w.tag(2, w.WT_LEN)), check_groups)
    yield from enc.chunks()
