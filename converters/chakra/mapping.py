"""The one Chakra ``Node`` -> :class:`~ettools.graph.RankGraph` mapping: the fields a decoder
gathers (:class:`Collected`, from protobuf messages here or in bulk by :mod:`.decode`) turned into
node columns, edges and sparse attributes (column attributes placed where they fit, the rest kept).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.graph import NODE_COLUMNS, AttrColumn, EdgeKind, NodeType, RankGraph, StringTable

from .attributes import (
    _I31,
    _I63,
    INT_COLUMN_ATTRS,
    INT_KINDS,
    IO_ATTRS,
    PEER_KIND,
    STR_COLUMN_ATTRS,
)


@dataclass
class _AttrAcc:
    rows: Any = field(default_factory=list)  # list or int64 array of node rows
    values: list[Any] = field(default_factory=list)


@dataclass
class Collected:
    """The fields of a rank's nodes, gathered by a decoder before the graph is built.

    ``dep_id`` holds every node's data deps then its ctrl deps; ``dep_counts`` is ``(n, 2)``:
    the number of each. ``attrs`` maps ``(name, kind)`` to the rows and values carrying it, in
    order of first appearance; ``io`` maps ``"inputs"``/``"outputs"`` to non-empty IOInfo tuples.
    """

    ids: np.ndarray
    names: np.ndarray
    types: np.ndarray
    starts: np.ndarray
    durs: np.ndarray
    dep_id: np.ndarray
    dep_counts: np.ndarray
    attrs: dict[tuple[str, str], _AttrAcc]
    io: dict[str, _AttrAcc]


def collect_messages(nodes: Iterable[Any], strings: StringTable) -> Collected:
    """Gather the fields of ``pb.Node`` messages (the reference decoder; JSON uses it too)."""
    ids: list[int] = []
    names: list[int] = []
    types: list[int] = []
    starts: list[int] = []
    durs: list[int] = []
    dep_ids: list[int] = []
    dep_counts: list[int] = []  # per node: number of data deps, number of ctrl deps
    attrs: dict[tuple[str, str], _AttrAcc] = {}
    io: dict[str, _AttrAcc] = {"inputs": _AttrAcc(), "outputs": _AttrAcc()}
    intern = strings.intern
    ids_append, names_append, types_append = ids.append, names.append, types.append
    starts_append, durs_append = starts.append, durs.append
    dep_extend, cnt_append = dep_ids.extend, dep_counts.append
    attrs_get = attrs.get
    row = 0
    for node in nodes:
        ids_append(node.id)
        names_append(intern(node.name))
        types_append(node.type)
        starts_append(node.start_time_micros)
        durs_append(node.duration_micros)
        dd = node.data_deps
        cd = node.ctrl_deps
        dep_extend(dd)
        dep_extend(cd)
        cnt_append(len(dd))
        cnt_append(len(cd))
        for a in node.attr:
            kind = a.WhichOneof("value")
            if kind is None:
                kind, v = "none", None
            else:
                v = getattr(a, kind)
                if kind[-1] == "t":  # *_list
                    v = list(v.values)
            key = (a.name, kind)
            acc = attrs_get(key)
            if acc is None:
                acc = attrs[key] = _AttrAcc()
            acc.rows.append(row)
            acc.values.append(v)
        for fname in IO_ATTRS:
            if node.HasField(fname):
                m = getattr(node, fname)
                t = (m.values, m.shapes, m.types)
                if t[0] or t[1] or t[2]:
                    acc = io[fname]
                    acc.rows.append(row)
                    acc.values.append(t)
        row += 1
    return Collected(
        ids=np.asarray(ids, np.uint64),
        names=np.asarray(names, np.int32),
        types=np.asarray(types, np.int64),
        starts=np.asarray(starts, np.float64),
        durs=np.asarray(durs, np.float64),
        dep_id=np.asarray(dep_ids, np.uint64),
        dep_counts=np.asarray(dep_counts, np.int64).reshape(row, 2),
        attrs=attrs,
        io=io,
    )


def build_rank_graph(
    col: Collected, rank: int, strings: StringTable, path: Path, meta: dict[str, Any] | None = None,
    first_frame: int | None = 2,
) -> RankGraph:
    """The rank graph of collected node fields: the one Chakra Node -> graph mapping.

    ``first_frame`` is the frame number of the first node in error messages (None: say the
    node's index instead, as for JSON).
    """
    n = len(col.ids)
    type_arr = col.types
    bad = np.flatnonzero((type_arr < 0) | (type_arr > max(NodeType)))
    if len(bad):
        k = int(bad[0])
        where = f"frame {k + first_frame}" if first_frame is not None else f"node {k}"
        raise TraceError(path, f"{where} (node id {int(col.ids[k])}) has unknown node type {int(type_arr[k])}")
    starts = np.asarray(col.starts, np.float64)
    if n and not starts.any():
        # every start_time_micros is 0: the file carries no start times (Chakra's converter and
        # synthesizers leave them unset), so none is claimed — a replay must not call them measured
        starts = np.full(n, np.nan)
    durs = np.asarray(col.durs, np.float64)
    comm = (type_arr >= NodeType.COMM_SEND_NODE) & (type_arr <= NodeType.COMM_COLL_NODE)
    if n and (comm & (durs == 0)).any():
        # proto3 cannot tell an unset duration_micros from 0, and no transfer takes 0 µs: a
        # collective or send/recv written with 0 has no known time (the network model times it)
        durs = np.where(comm & (durs == 0), np.nan, durs)
    columns: dict[str, np.ndarray] = {
        "id": col.ids,
        "name": col.names,
        "type": type_arr.astype(np.uint8),
        "start": starts,
        "dur": durs,
    }
    for c, (dtype, absent) in NODE_COLUMNS.items():
        columns.setdefault(c, np.full(n, absent, dtype))
    counts = col.dep_counts.reshape(-1)
    dep_kind = np.repeat(np.tile(np.array([EdgeKind.DATA, EdgeKind.CTRL], np.uint8), n), counts)
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(col.dep_counts.sum(axis=1), out=dep_ptr[1:])
    rmeta: dict[str, Any] = dict(meta or {})
    attr_cols, kinds = _attrs_to_columns(col.attrs, col.io, columns, rank, strings)
    if kinds:
        rmeta["chakra_attr_kinds"] = kinds
    return RankGraph(rank, strings, columns, dep_ptr, col.dep_id, dep_kind, attr_cols, meta=rmeta)


def nodes_to_graph(
    nodes: Iterable[Any], rank: int, strings: StringTable, path: Path, meta: dict[str, Any] | None = None,
    first_frame: int | None = 2,
) -> RankGraph:
    """Build the rank graph of a stream of ``pb.Node`` messages (see :func:`build_rank_graph`)."""
    return build_rank_graph(collect_messages(nodes, strings), rank, strings, path, meta, first_frame)


def _int_values(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """Integers (a list, or an array from the bulk decoder) as ``int64`` plus a mask of those that fit."""
    arr = np.asarray(values)
    if arr.dtype.kind in "bi" or (arr.dtype.kind == "u" and arr.dtype.itemsize < 8):
        return arr.astype(np.int64), np.ones(len(arr), bool)
    if arr.dtype == np.uint64:
        ok = arr <= np.uint64(_I63)
        return np.where(ok, arr, 0).astype(np.int64), ok
    ok = np.array([isinstance(v, int) and -(1 << 63) <= v <= _I63 for v in values], bool)
    return np.array([v if o else 0 for v, o in zip(values, ok)], np.int64), ok


def _first_per_row(rows: np.ndarray) -> np.ndarray:
    first = np.ones(len(rows), bool)
    first[1:] = rows[1:] != rows[:-1]
    return first


def _attrs_to_columns(
    attrs: dict[tuple[str, str], _AttrAcc],
    io: dict[str, _AttrAcc],
    columns: dict[str, np.ndarray],
    rank: int,
    strings: StringTable,
) -> tuple[dict[str, AttrColumn], dict[str, str]]:
    """Move column attributes into ``columns``; the rest become sparse AttrColumns."""
    kinds: dict[str, str] = {}
    # Entries still to place, per attribute name, kinds in first-seen order.
    left: dict[str, list[tuple[str, np.ndarray, Any, np.ndarray]]] = {}
    for (name, kind), acc in attrs.items():
        left.setdefault(name, []).append((kind, np.asarray(acc.rows, np.int64), acc.values,
                                          np.ones(len(acc.rows), bool)))

    def pick(name: str, accept: frozenset[str] | set[str]) -> tuple[str, np.ndarray, list[Any], np.ndarray] | None:
        for entry in left.get(name, ()):
            if entry[0] in accept:
                return entry
        return None

    for name, (col, canon, lo, hi) in INT_COLUMN_ATTRS.items():
        entry = pick(name, INT_KINDS)
        if entry is None:
            continue
        kind, rows, values, unplaced = entry
        vals, ok = _int_values(values)
        take = ok & (vals >= lo) & (vals <= hi) & _first_per_row(rows)
        if take.any():
            columns[col][rows[take]] = vals[take]
            unplaced &= ~take
            if kind != canon:
                kinds[name] = kind
    for name, col in STR_COLUMN_ATTRS.items():
        entry = pick(name, {"string_val"})
        if entry is None:
            continue
        kind, rows, values, unplaced = entry
        take = _first_per_row(rows)
        idx = np.flatnonzero(take)
        ids = {v: strings.intern(v) for v in dict.fromkeys(values)}  # intern each distinct value once
        columns[col][rows[idx]] = [ids[values[i]] for i in idx.tolist()]
        unplaced &= ~take

    src, dst = pick("comm_src", INT_KINDS), pick("comm_dst", INT_KINDS)
    if src is not None and dst is not None:
        _peer_columns(src, dst, columns, rank, kinds)

    out: dict[str, AttrColumn] = {}
    for fname, acc in io.items():
        if len(acc.rows):
            out[fname] = AttrColumn("io", np.asarray(acc.rows, np.int64), acc.values)
    for name, entries in left.items():
        for kind, rows, values, unplaced in entries:
            if not unplaced.any():
                continue
            if isinstance(values, np.ndarray):
                vals = (values if unplaced.all() else values[unplaced]).tolist()
            elif unplaced.all():
                vals = values
            else:
                vals = [v for v, u in zip(values, unplaced.tolist()) if u]
            key = name if name not in out else f"{name}@{kind}"
            out[key] = AttrColumn(kind, rows[unplaced], vals)
    return out, kinds


def _peer_columns(src: tuple, dst: tuple, columns: dict[str, np.ndarray], rank: int, kinds: dict[str, str]) -> None:
    """comm_src/comm_dst of SEND/RECV nodes -> comm_peer, when one side is the file's own rank."""
    s_kind, s_rows, s_values, s_unplaced = src
    d_kind, d_rows, d_values, d_unplaced = dst
    s_vals, s_ok = _int_values(s_values)
    d_vals, d_ok = _int_values(d_values)
    s_first, d_first = _first_per_row(s_rows), _first_per_row(d_rows)
    s_idx = np.flatnonzero(s_ok & s_first)
    d_idx = np.flatnonzero(d_ok & d_first)
    both, si, di = np.intersect1d(s_rows[s_idx], d_rows[d_idx], assume_unique=True, return_indices=True)
    si, di = s_idx[si], d_idx[di]
    t = columns["type"][both]
    sv, dv = s_vals[si], d_vals[di]
    send = (t == NodeType.COMM_SEND_NODE) & (sv == rank) & (dv >= 0) & (dv <= _I31)
    recv = (t == NodeType.COMM_RECV_NODE) & (dv == rank) & (sv >= 0) & (sv <= _I31)
    take = send | recv
    if not take.any():
        return
    columns["comm_peer"][both[take]] = np.where(send, dv, sv)[take]
    s_unplaced[si[take]] = False
    d_unplaced[di[take]] = False
    if s_kind != PEER_KIND:
        kinds["comm_src"] = s_kind
    if d_kind != PEER_KIND:
        kinds["comm_dst"] = d_kind
