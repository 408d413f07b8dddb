"""One rank's nodes as columns: :class:`RankGraph` (node columns, CSR dependencies and tensor
lists, sparse attributes), its lookups (ids to rows, edges, node views) and the graphs derived
from it (:meth:`~RankGraph.replace`, :meth:`~RankGraph.select`). The layout is described in
:mod:`ettools.graph`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ettools.graph_algorithms import topological_sort
from ettools.graph_schema import NODE_COLUMNS, EdgeKind, NodeType
from ettools.graph_tables import AttrColumn, Node, StringTable, TensorTable


def _empty_ptr(n: int) -> np.ndarray:
    return np.zeros(n + 1, np.int64)


class RankGraph:
    """One rank's nodes as columns; see the module docstring for the layout."""

    def __init__(
        self,
        rank: int,
        strings: StringTable,
        columns: dict[str, np.ndarray],
        dep_ptr: np.ndarray | None = None,
        dep_id: np.ndarray | None = None,
        dep_kind: np.ndarray | None = None,
        attrs: dict[str, AttrColumn] | None = None,
        tensors: TensorTable | None = None,
        in_ptr: np.ndarray | None = None,
        in_tensor: np.ndarray | None = None,
        out_ptr: np.ndarray | None = None,
        out_tensor: np.ndarray | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.rank = int(rank)
        self.strings = strings
        n = len(columns["id"])
        self.columns: dict[str, np.ndarray] = {}
        for col, (dtype, absent) in NODE_COLUMNS.items():
            arr = columns.get(col)
            if arr is None:
                arr = np.full(n, absent, dtype)
            else:
                arr = np.asarray(arr, dtype)
                if len(arr) != n:
                    raise ValueError(f"column {col!r} has {len(arr)} rows, expected {n}")
            self.columns[col] = arr
        self.dep_ptr = _empty_ptr(n) if dep_ptr is None else np.asarray(dep_ptr, np.int64)
        self.dep_id = np.zeros(0, np.uint64) if dep_id is None else np.asarray(dep_id, np.uint64)
        self.dep_kind = (
            np.zeros(len(self.dep_id), np.uint8) if dep_kind is None else np.asarray(dep_kind, np.uint8)
        )
        self.attrs: dict[str, AttrColumn] = attrs or {}
        self.tensors = tensors if tensors is not None else TensorTable()
        self.in_ptr = _empty_ptr(n) if in_ptr is None else in_ptr
        self.in_tensor = np.zeros(0, np.int64) if in_tensor is None else in_tensor
        self.out_ptr = _empty_ptr(n) if out_ptr is None else out_ptr
        self.out_tensor = np.zeros(0, np.int64) if out_tensor is None else out_tensor
        self.meta: dict[str, Any] = meta if meta is not None else {}
        self._row_of_sorted: tuple[np.ndarray, np.ndarray] | None = None

    # ---- columns -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.columns["id"])

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return len(self)

    @property
    def num_edges(self) -> int:
        """Number of dependency edges (dangling ones included)."""
        return len(self.dep_id)

    def __getattr__(self, name: str) -> np.ndarray:
        # g.start, g.type, ... read the node columns.
        columns = self.__dict__.get("columns")
        if columns is not None and name in columns:
            return columns[name]
        raise AttributeError(name)

    def names(self) -> list[str]:
        """Every node's name, decoded."""
        return self.strings.decode(self.columns["name"])

    def name_of(self, row: int) -> str:
        """Name of node ``row``."""
        return self.strings[int(self.columns["name"][row])]

    def group_name(self, row: int) -> str:
        """Process-group name of node ``row`` ("" if none)."""
        g = int(self.columns["comm_group"][row])
        return self.strings[g] if g >= 0 else ""

    # ---- ids and edges -------------------------------------------------------------------
    def rows_of(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Rows of the given node ids; -1 where an id is not in the graph."""
        if self._row_of_sorted is None:
            order = np.argsort(self.columns["id"], kind="stable")
            self._row_of_sorted = (self.columns["id"][order], order)
        sorted_ids, order = self._row_of_sorted
        ids = np.asarray(ids, np.uint64)
        if len(sorted_ids) == 0:
            return np.full(len(ids), -1, np.int64)
        pos = np.searchsorted(sorted_ids, ids)
        pos_c = np.minimum(pos, len(sorted_ids) - 1)
        found = sorted_ids[pos_c] == ids
        return np.where(found, order[pos_c], -1).astype(np.int64)

    def deps_of(self, row: int) -> list[tuple[int, EdgeKind]]:
        """``(dependency id, kind)`` of node ``row``, in stored order."""
        a, b = int(self.dep_ptr[row]), int(self.dep_ptr[row + 1])
        return [(int(d), EdgeKind(k)) for d, k in zip(self.dep_id[a:b], self.dep_kind[a:b])]

    def edge_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All edges as row arrays ``(src, dst, kind)``: ``dst`` depends on ``src``.

        Dangling edges (dependency id not in the graph) get ``src == -1``.
        """
        dst = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.dep_ptr))
        return self.rows_of(self.dep_id), dst, self.dep_kind

    def dangling_edges(self) -> int:
        """Number of dependencies naming an id absent from the graph."""
        src, _, _ = self.edge_rows()
        return int((src < 0).sum())

    # ---- attributes, tensors -------------------------------------------------------------
    def attr(self, name: str) -> AttrColumn | None:
        """The sparse attribute column ``name``, if any node has it."""
        return self.attrs.get(name)

    def inputs_of(self, row: int) -> np.ndarray:
        """Tensor-table rows read by node ``row``."""
        return self.in_tensor[self.in_ptr[row] : self.in_ptr[row + 1]]

    def outputs_of(self, row: int) -> np.ndarray:
        """Tensor-table rows written by node ``row``."""
        return self.out_tensor[self.out_ptr[row] : self.out_ptr[row + 1]]

    def node(self, row: int) -> Node:
        """A :class:`Node` view of row ``row`` (for tests and small tools, not hot loops)."""
        c = self.columns
        res = int(c["resource"][row])
        return Node(
            id=int(c["id"][row]),
            name=self.name_of(row),
            type=NodeType(int(c["type"][row])),
            start=float(c["start"][row]),
            dur=float(c["dur"][row]),
            resource=self.strings[res] if res >= 0 else "",
            is_cpu_op=int(c["is_cpu_op"][row]),
            num_ops=int(c["num_ops"][row]),
            tensor_size=int(c["tensor_size"][row]),
            comm_type=int(c["comm_type"][row]),
            comm_bytes=int(c["comm_bytes"][row]),
            comm_group=self.group_name(row),
            comm_peer=int(c["comm_peer"][row]),
            comm_tag=int(c["comm_tag"][row]),
            deps=self.deps_of(row),
            attrs={k: col.get(row) for k, col in self.attrs.items() if col.get(row) is not None},
            inputs=self.inputs_of(row).tolist(),
            outputs=self.outputs_of(row).tolist(),
        )

    def iter_nodes(self) -> Iterator[Node]:
        """Every node as a :class:`Node` view (slow path)."""
        for i in range(len(self)):
            yield self.node(i)

    # ---- derived graphs ------------------------------------------------------------------
    def replace(self, **columns: np.ndarray) -> RankGraph:
        """A copy with some node columns replaced (others shared, not copied)."""
        unknown = set(columns) - set(NODE_COLUMNS)
        if unknown:
            raise KeyError(f"unknown node columns: {sorted(unknown)}")
        new = dict(self.columns)
        new.update(columns)
        if "id" in columns:  # the row count may change: every column is checked against it
            return RankGraph(
                self.rank, self.strings, new, self.dep_ptr, self.dep_id, self.dep_kind, dict(self.attrs),
                self.tensors, self.in_ptr, self.in_tensor, self.out_ptr, self.out_tensor, dict(self.meta),
            )
        # the kept columns are already typed and sized: only the new ones are (a stamped copy per
        # rank of thousands is made this way)
        n = len(self)
        for col, arr in columns.items():
            arr = new[col] = np.asarray(arr, NODE_COLUMNS[col][0])
            if len(arr) != n:
                raise ValueError(f"column {col!r} has {len(arr)} rows, expected {n}")
        g = RankGraph.__new__(RankGraph)
        g.rank, g.strings, g.columns = self.rank, self.strings, new
        g.dep_ptr, g.dep_id, g.dep_kind = self.dep_ptr, self.dep_id, self.dep_kind
        g.attrs, g.tensors = dict(self.attrs), self.tensors
        g.in_ptr, g.in_tensor, g.out_ptr, g.out_tensor = self.in_ptr, self.in_tensor, self.out_ptr, self.out_tensor
        g.meta, g._row_of_sorted = dict(self.meta), None
        return g

    def with_rank(self, rank: int) -> RankGraph:
        """The same graph labelled as another rank (arrays shared)."""
        g = self.replace()
        g.rank = int(rank)
        return g

    def select(self, keep: np.ndarray, drop_dangling: bool = True) -> RankGraph:
        """The subgraph of rows where ``keep`` is true.

        Dependencies on removed nodes are dropped when ``drop_dangling`` (default); attributes
        and tensor lists follow their nodes.
        """
        keep = np.asarray(keep, bool)
        rows = np.flatnonzero(keep)
        cols = {k: v[rows] for k, v in self.columns.items()}
        counts = np.diff(self.dep_ptr)
        edge_keep = np.repeat(keep, counts)
        if drop_dangling:
            src, _, _ = self.edge_rows()
            src_kept = np.zeros(len(src), bool)
            present = src >= 0
            src_kept[present] = keep[src[present]]
            edge_keep &= src_kept
        dep_ptr, dep_id = _csr_subset(self.dep_ptr, self.dep_id, rows, edge_keep)
        dep_kind = self.dep_kind[edge_keep]
        new_index = np.full(len(self), -1, np.int64)
        new_index[rows] = np.arange(len(rows))
        attrs = {}
        for name, col in self.attrs.items():
            m = keep[col.rows] if len(col.rows) else np.zeros(0, bool)
            if m.any():
                attrs[name] = AttrColumn(
                    col.kind, new_index[col.rows[m]], [v for v, k in zip(col.values, m) if k]
                )
        in_ptr, in_tensor = _csr_subset(self.in_ptr, self.in_tensor, rows, None)
        out_ptr, out_tensor = _csr_subset(self.out_ptr, self.out_tensor, rows, None)
        return RankGraph(
            self.rank, self.strings, cols, dep_ptr, dep_id, dep_kind, attrs, self.tensors,
            in_ptr, in_tensor, out_ptr, out_tensor, dict(self.meta),
        )

    def topological_order(self) -> np.ndarray | None:
        """Rows in an order where every node follows its dependencies; None if cyclic.

        Kahn's algorithm, O(nodes + edges); dangling edges are ignored. See
        :func:`ettools.graph_algorithms.topological_sort` for the variant that also reports which rows sit
        on cycles and computes an ASAP schedule in the same pass.
        """
        order, cyclic, _ = topological_sort(self)
        return None if cyclic.any() else order

    def __repr__(self) -> str:
        return f"RankGraph(rank={self.rank}, nodes={len(self)}, edges={self.num_edges})"


def _csr_subset(
    ptr: np.ndarray, values: np.ndarray, rows: np.ndarray, value_keep: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a CSR list, optionally filtering values with ``value_keep``."""
    counts = np.diff(ptr)
    row_keep = np.zeros(len(counts), bool)
    row_keep[rows] = True
    keep = np.repeat(row_keep, counts)
    if value_keep is not None:
        keep &= value_keep
    owner = np.repeat(np.arange(len(counts)), counts)[keep]
    new_counts = np.bincount(owner, minlength=len(counts))[rows]
    new_ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(new_counts, out=new_ptr[1:])
    return new_ptr, values[keep]
