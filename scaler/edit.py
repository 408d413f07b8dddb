"""Editing rank graphs without a node model: a copy-on-write :class:`Editor`, and rank stamping.

Passes never mutate their input. An :class:`Editor` wraps a source :class:`RankGraph`; a pass
changes whole columns (copied the first time they are touched, shared otherwise), appends nodes
and edges, drops edges, and calls :meth:`Editor.build`. Appended nodes get fresh ids above the
source's largest id, rows after the source's rows, and empty tensor lists.

:func:`stamp` makes the graph of one rank from a template graph by re-mapping its communication
columns (process-group names, send/recv peers): every other array is shared with the template,
so 1,024 ranks of one template cost 1,024 small column arrays, not 1,024 graphs. Ranks with the
same mapping share those too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ettools.graph import NODE_COLUMNS, AttrColumn, EdgeKind, NodeType, RankGraph


class Editor:
    """Changes to one source graph, built into a new :class:`RankGraph` by :meth:`build`."""

    def __init__(self, g: RankGraph) -> None:
        self.g = g
        self.n0 = len(g)
        self._cols: dict[str, np.ndarray] = {}
        self._new: dict[str, list[Any]] = {k: [] for k in NODE_COLUMNS}
        self._e_dst: list[int] = []
        self._e_id: list[int] = []
        self._e_kind: list[int] = []
        self._drop: np.ndarray | None = None
        self._attrs: dict[str, tuple[str, list[int], list[Any]]] = {}
        self._next_id = int(g.id.max()) + 1 if len(g) else 0
        self.tensors = g.tensors
        self.meta: dict[str, Any] = dict(g.meta)
        self.attrs_replaced: dict[str, AttrColumn] = {}  # whole attribute columns replaced

    # ---- columns of source rows ------------------------------------------------------------
    def column(self, name: str) -> np.ndarray:
        """A writable copy of source column ``name`` (copied once, then shared by later calls)."""
        arr = self._cols.get(name)
        if arr is None:
            arr = self._cols[name] = self.g.columns[name].copy()
        return arr

    def set_column(self, name: str, values: np.ndarray) -> None:
        """Replace source column ``name`` (one value per source row)."""
        dtype = NODE_COLUMNS[name][0]
        values = np.asarray(values, dtype)
        if len(values) != self.n0:
            raise ValueError(f"column {name!r} needs {self.n0} values, got {len(values)}")
        self._cols[name] = values

    def current(self, name: str) -> np.ndarray:
        """Source column ``name`` as edited so far (not a copy)."""
        return self._cols.get(name, self.g.columns[name])

    def scale(self, name: str, rows: np.ndarray, factor: np.ndarray | float) -> None:
        """Multiply column ``name`` on ``rows`` by ``factor`` (absent values stay absent)."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return
        col = self.column(name)
        vals = col[rows]
        f = np.broadcast_to(np.asarray(factor, np.float64), vals.shape)
        if col.dtype.kind == "f":
            col[rows] = vals * f
        else:
            col[rows] = np.where(vals >= 0, np.rint(vals * f), vals).astype(col.dtype)

    # ---- new nodes and edges ---------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Rows of the graph being built (source rows plus appended ones)."""
        return self.n0 + len(self._new["id"])

    def new_id(self) -> int:
        """A fresh node id."""
        i = self._next_id
        self._next_id += 1
        return i

    def add_node(self, name: str, type: int = NodeType.COMP_NODE, **cols: Any) -> tuple[int, int]:
        """Append a node; ``cols`` are node columns (``start=``, ``comm_group=`` as a name, …). Returns ``(row, id)``."""
        nid = self.new_id()
        intern = self.g.strings.intern
        new = self._new
        for col, (_, absent) in NODE_COLUMNS.items():
            if col == "id":
                v = nid
            elif col == "name":
                v = intern(name)
            elif col == "type":
                v = int(type)
            else:
                v = cols.get(col, absent)
                if col in ("resource", "comm_group"):
                    v = intern(v) if isinstance(v, str) else (-1 if v is None else v)
            new[col].append(v)
        return self.num_rows - 1, nid

    def set_new(self, row: int, column: str, value: Any) -> None:
        """Overwrite one column value of an appended row (e.g. a start time known later)."""
        if row < self.n0:
            raise ValueError("set_new changes appended rows only; use column() for source rows")
        self._new[column][row - self.n0] = value

    def add_edge(self, dst_row: int, src_id: int, kind: int = EdgeKind.CTRL) -> None:
        """Node at ``dst_row`` (source or appended) depends on node id ``src_id``."""
        self._e_dst.append(int(dst_row))
        self._e_id.append(int(src_id))
        self._e_kind.append(int(kind))

    def add_edges(self, dst_rows: Sequence[int] | np.ndarray, src_ids: Sequence[int] | np.ndarray, kind: int) -> None:
        """Many edges of one kind."""
        d = np.asarray(dst_rows, np.int64).tolist()
        s = np.asarray(src_ids, np.int64).tolist()
        self._e_dst.extend(d)
        self._e_id.extend(s)
        self._e_kind.extend([int(kind)] * len(d))

    def drop_edges(self, mask: np.ndarray) -> None:
        """Drop the source edges where ``mask`` (over the source's edge list) is true."""
        mask = np.asarray(mask, bool)
        self._drop = mask if self._drop is None else (self._drop | mask)

    def set_attr(self, row: int, name: str, value: Any, kind: str) -> None:
        """Attach attribute ``name`` to an appended (or source) row."""
        entry = self._attrs.get(name)
        if entry is None:
            entry = self._attrs[name] = (kind, [], [])
        entry[1].append(int(row))
        entry[2].append(value)

    def id_of(self, row: int) -> int:
        """Node id of a source or appended row."""
        if row < self.n0:
            return int(self.g.id[row])
        return int(self._new["id"][row - self.n0])

    # ---- build -------------------------------------------------------------------------------
    def build(self) -> RankGraph:
        """The edited graph."""
        g = self.g
        n0, k = self.n0, len(self._new["id"])
        n = n0 + k
        cols: dict[str, np.ndarray] = {}
        for col, (dtype, _) in NODE_COLUMNS.items():
            base = self._cols.get(col, g.columns[col])
            if k:
                cols[col] = np.concatenate([base, np.asarray(self._new[col], dtype)])
            else:
                cols[col] = base
        old_owner = np.repeat(np.arange(n0, dtype=np.int64), np.diff(g.dep_ptr))
        keep = np.ones(len(g.dep_id), bool) if self._drop is None else ~self._drop
        if self._e_dst or self._drop is not None:
            dst = np.concatenate([old_owner[keep], np.asarray(self._e_dst, np.int64)])
            ids = np.concatenate([g.dep_id[keep], np.asarray(self._e_id, np.uint64)])
            kinds = np.concatenate([g.dep_kind[keep], np.asarray(self._e_kind, np.uint8)])
            o = np.argsort(dst, kind="stable")
            dep_ptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])
            dep_id, dep_kind = ids[o], kinds[o]
        else:
            dep_ptr = _extend_ptr(g.dep_ptr, k)
            dep_id, dep_kind = g.dep_id, g.dep_kind
        if ("start" in self._cols or "dur" in self._cols) and self.meta.get("steps"):
            self.meta["steps"] = retimed_steps(self.meta["steps"], g.names(), cols["start"], cols["dur"])
        attrs = dict(g.attrs)
        attrs.update(self.attrs_replaced)
        for name, (kind, rows, values) in self._attrs.items():
            r = np.asarray(rows, np.int64)
            old = attrs.get(name)
            if old is not None:
                r = np.concatenate([old.rows, r])
                values = list(old.values) + list(values)
            o = np.argsort(r, kind="stable")
            attrs[name] = AttrColumn(kind if old is None else old.kind, r[o], [values[i] for i in o.tolist()])
        return RankGraph(
            g.rank, g.strings, cols, dep_ptr, dep_id, dep_kind, attrs, self.tensors,
            _extend_ptr(g.in_ptr, k), g.in_tensor, _extend_ptr(g.out_ptr, k), g.out_tensor, self.meta,
        )


def retimed_steps(steps: list, names: list[str], start: np.ndarray, dur: np.ndarray) -> list:
    """``meta["steps"]`` following the re-timed step annotations (``ProfilerStep#N`` rows).

    Each ``(name, start, end)`` takes the span of the row of that name; steps without such a row
    keep their old span.
    """
    row_of: dict[str, int] = {}
    wanted = {s[0] for s in steps}
    for i, nm in enumerate(names):
        if nm in wanted and nm not in row_of:
            row_of[nm] = i
    out = []
    for name, s0, e0 in steps:
        r = row_of.get(name)
        if r is None or not np.isfinite(start[r]):
            out.append((name, s0, e0))
        else:
            out.append((name, float(start[r]), float(start[r] + np.nan_to_num(dur[r]))))
    return out


def _extend_ptr(ptr: np.ndarray, k: int) -> np.ndarray:
    """A CSR pointer array with ``k`` empty rows appended."""
    if not k:
        return ptr
    return np.concatenate([ptr, np.full(k, ptr[-1], ptr.dtype)])


# ---- stamping ranks out of templates ---------------------------------------------------------

class Stamper:
    """Makes rank graphs from templates by re-mapping group names and peers (arrays shared).

    ``group_map`` maps a template's group name to the rank's actual group name;
    ``peer_map`` maps a template's ``comm_peer`` value (a placeholder such as a stage index) to a
    global rank. Results are cached by (template, mapping), so ranks with equal mappings share
    their columns too.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def stamp(self, template: RankGraph, rank: int, group_map: Mapping[str, str] | None = None,
              peer_map: Mapping[int, int] | None = None) -> RankGraph:
        """The graph of ``rank`` from ``template``."""
        s = template.strings
        gkey = tuple(sorted(group_map.items())) if group_map else ()
        pkey = tuple(sorted(peer_map.items())) if peer_map else ()
        key = (id(template.columns["comm_group"]), id(template.columns["comm_peer"]), gkey, pkey)
        hit = self._cache.get(key)
        if hit is None:
            cg = template.comm_group
            if group_map:
                lut_from = np.array([s.intern(a) for a in group_map], np.int32)
                lut_to = np.array([s.intern(b) for b in group_map.values()], np.int32)
                if np.isin(cg, lut_from).any():
                    cg = cg.copy()
                    for a, b in zip(lut_from.tolist(), lut_to.tolist()):
                        cg[template.comm_group == a] = b
            cp = template.comm_peer
            if peer_map:
                m = cp >= 0
                if m.any():
                    cp = cp.copy()
                    src = template.comm_peer
                    for a, b in peer_map.items():
                        cp[src == a] = b
            hit = self._cache[key] = (cg, cp)
            # keep the template alive while its id is a cache key
            self._cache[("_keep", key)] = (template.comm_group, template.comm_peer)  # type: ignore[assignment]
        cg, cp = hit
        if cg is template.comm_group and cp is template.comm_peer:
            return template.with_rank(rank)
        out = template.replace(comm_group=cg, comm_peer=cp)
        out.rank = int(rank)
        return out


def comm_time_us(kind: str, nbytes: float, group: int, device: bool) -> float:
    """A first-order duration for an inserted communication node (µs), for viewers and rough replay.

    Ring algorithms over a bus of ``100 GB/s`` (device, NCCL-like) or ``2 GB/s`` (host, gloo-like)
    with ``10 µs`` / ``50 µs`` latency per step. Replay engines with a network model ignore it.
    """
    if nbytes <= 0 or group <= 1:
        return 0.0
    bw = 100e3 if device else 2e3  # bytes per µs
    lat = 10.0 if device else 50.0
    p = group
    if kind == "ALL_REDUCE":
        vol, steps = 2.0 * (p - 1) / p * nbytes, 2 * (p - 1)
    elif kind in ("ALL_GATHER",):
        vol, steps = (p - 1) * nbytes, p - 1
    elif kind in ("REDUCE_SCATTER", "ALL_TO_ALL"):
        vol, steps = (p - 1) / p * nbytes, p - 1
    else:  # send/recv, broadcast
        vol, steps = nbytes, 1
    return float(lat * math.log2(max(steps, 1) + 1) + vol / bw)


__all__ = ["Editor", "Stamper", "comm_time_us"]
