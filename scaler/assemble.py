"""Building a rank graph out of blocks of rows copied from source graphs (pipeline stages).

A pipeline stage runs its share of the forward and backward units once per micro-batch, and the
data preparation and optimizer once per step. :func:`assemble` builds such a graph from
:class:`Block` s: row sets of one or more *sources* — versions of one graph that share rows and
node ids (the captured graph, and the same graph rescaled to a micro-batch) — each placed as a
*shared* block (copied once, ids kept) or as one *instance* (a micro-batch; ids offset by
``(instance + 1) × stride``), and shifted in time.

Dependencies are re-pointed per block: to the row's copy in the same instance, else the shared
copy, else (for a shared row depending on replicated work, such as the optimizer after the last
gradient) the copy in ``last_instance``; a dependency on a row the stage does not hold is dropped
(pipeline passes add send/recv nodes in its place). Attributes, tensor lists and times follow
their rows; the tensor tables of the sources are concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ettools.graph import NODE_COLUMNS, AttrColumn, RankGraph, TensorTable


@dataclass
class Block:
    """Rows of one source placed once in the assembled graph."""

    source: int
    rows: np.ndarray
    instance: int = -1  # -1: shared (ids kept); k >= 0: micro-batch k
    shift: float = 0.0  # µs added to the rows' start times


@dataclass
class Assembled:
    """An assembled graph and where every block's rows went."""

    graph: RankGraph
    new_row: list[np.ndarray]  # per block: new row of each of its rows
    slot_ids: np.ndarray  # [1 + instances, source rows]: new id per (slot, source row), -1 absent
    stride: int

    def id_of(self, instance: int, row: int) -> int:
        """New id of source ``row`` in ``instance`` (-1: shared copy), or -1."""
        return int(self.slot_ids[instance + 1, row])


def _concat_tensors(tables: list[TensorTable]) -> tuple[TensorTable, list[int]]:
    offs = [0]
    for t in tables[:-1]:
        offs.append(offs[-1] + len(t))
    if len(tables) == 1:
        return tables[0], offs
    shape_ptr = [np.zeros(1, np.int64)]
    base = 0
    for t in tables:
        shape_ptr.append(t.shape_ptr[1:] + base)
        base += int(t.shape_ptr[-1])
    out = TensorTable(
        tensor_id=np.concatenate([t.tensor_id for t in tables]),
        storage_id=np.concatenate([t.storage_id for t in tables]),
        offset=np.concatenate([t.offset for t in tables]),
        numel=np.concatenate([t.numel for t in tables]),
        elem_bytes=np.concatenate([t.elem_bytes for t in tables]),
        dtype=np.concatenate([t.dtype for t in tables]),
        device=np.concatenate([t.device for t in tables]),
        shape_ptr=np.concatenate(shape_ptr),
        dims=np.concatenate([t.dims for t in tables]),
    )
    return out, offs


def _gather_csr(ptr: np.ndarray, vals: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts, values) of CSR rows ``rows`` in order."""
    counts = ptr[rows + 1] - ptr[rows]
    if not counts.sum():
        return counts, vals[:0]
    starts = np.repeat(ptr[rows], counts)
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return counts, vals[starts + within]


def assemble(sources: list[RankGraph], blocks: list[Block], instances: int, last_instance: int) -> Assembled:
    """The graph of ``blocks`` (see the module docstring)."""
    g0 = sources[0]
    n = len(g0)
    for s in sources[1:]:
        if len(s) != n or s.strings is not g0.strings:
            raise ValueError("assemble: sources must share rows and the string table")
    stride = int(g0.id.max()) + 1 if n else 1
    slots = np.full((instances + 1, n), -1, np.int64)
    new_row: list[np.ndarray] = []
    total = 0
    for b in blocks:
        rows = np.asarray(b.rows, np.int64)
        slot = b.instance + 1
        if (slots[slot, rows] >= 0).any():
            raise ValueError(f"assemble: a row is placed twice in instance {b.instance}")
        base = 0 if b.instance < 0 else (b.instance + 1) * stride
        slots[slot, rows] = g0.id[rows].astype(np.int64) + base
        new_row.append(np.arange(total, total + len(rows)))
        total += len(rows)
    tensors, t_off = _concat_tensors([s.tensors for s in sources])
    cols: dict[str, list[np.ndarray]] = {c: [] for c in NODE_COLUMNS}
    e_dst, e_id, e_kind = [], [], []
    in_cnt, in_val, out_cnt, out_val = [], [], [], []
    attr_parts: dict[str, tuple[str, list[np.ndarray], list[list]]] = {}
    for k, b in enumerate(blocks):
        src = sources[b.source]
        rows = np.asarray(b.rows, np.int64)
        slot = b.instance + 1
        for c in NODE_COLUMNS:
            v = src.columns[c][rows]
            if c == "id":
                v = slots[slot, rows].astype(np.uint64)
            elif c == "start" and b.shift:
                v = v + b.shift
            cols[c].append(v)
        # edges
        cnt, dep = _gather_csr(src.dep_ptr, src.dep_id, rows)
        _, kinds = _gather_csr(src.dep_ptr, src.dep_kind, rows)
        owner = np.repeat(new_row[k], cnt)
        dep_rows = src.rows_of(dep)
        ok = dep_rows >= 0
        dr = np.maximum(dep_rows, 0)
        nid = np.where(ok, slots[slot, dr], -1)
        nid = np.where(nid < 0, np.where(ok, slots[0, dr], -1), nid)
        if b.instance < 0:
            nid = np.where(nid < 0, np.where(ok, slots[last_instance + 1, dr], -1), nid)
        keep = nid >= 0
        e_dst.append(owner[keep])
        e_id.append(nid[keep])
        e_kind.append(kinds[keep])
        # tensors
        c_in, v_in = _gather_csr(src.in_ptr, src.in_tensor, rows)
        c_out, v_out = _gather_csr(src.out_ptr, src.out_tensor, rows)
        in_cnt.append(c_in)
        in_val.append(v_in + t_off[b.source])
        out_cnt.append(c_out)
        out_val.append(v_out + t_off[b.source])
        # attributes
        for name, col in src.attrs.items():
            if not len(col.rows):
                continue
            pos = np.searchsorted(col.rows, rows)
            pos_c = np.minimum(pos, len(col.rows) - 1)
            has = col.rows[pos_c] == rows
            if not has.any():
                continue
            entry = attr_parts.setdefault(name, (col.kind, [], []))
            entry[1].append(new_row[k][has])
            vals = col.values
            entry[2].append([vals[i] for i in pos_c[has].tolist()])
    columns = {c: (np.concatenate(v) if v else np.zeros(0, NODE_COLUMNS[c][0])) for c, v in cols.items()}
    dst = np.concatenate(e_dst) if e_dst else np.zeros(0, np.int64)
    ids = np.concatenate(e_id) if e_id else np.zeros(0, np.int64)
    kinds = np.concatenate(e_kind) if e_kind else np.zeros(0, np.uint8)
    o = np.argsort(dst, kind="stable")
    dep_ptr = np.zeros(total + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=total), out=dep_ptr[1:])

    def ptr_of(cnts: list[np.ndarray]) -> np.ndarray:
        p = np.zeros(total + 1, np.int64)
        if cnts:
            np.cumsum(np.concatenate(cnts), out=p[1:])
        return p

    attrs = {}
    for name, (kind, rs, vs) in attr_parts.items():
        r = np.concatenate(rs)
        v = [x for part in vs for x in part]
        oo = np.argsort(r, kind="stable")
        attrs[name] = AttrColumn(kind, r[oo], [v[i] for i in oo.tolist()])
    graph = RankGraph(
        g0.rank, g0.strings, columns, dep_ptr, ids[o].astype(np.uint64), kinds[o], attrs, tensors,
        ptr_of(in_cnt), np.concatenate(in_val) if in_val else np.zeros(0, np.int64),
        ptr_of(out_cnt), np.concatenate(out_val) if out_val else np.zeros(0, np.int64), dict(g0.meta),
    )
    return Assembled(graph, new_row, slots, stride)


__all__ = ["Assembled", "Block", "assemble"]
