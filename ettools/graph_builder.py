"""Building a :class:`~ettools.graph.RankGraph` one node at a time: :class:`GraphBuilder`
(readers, synthesizers, passes) gathers nodes, edges, attributes and tensors in lists and freezes
them into columns and CSR structures at :meth:`GraphBuilder.build`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ettools.graph_schema import NODE_COLUMNS, EdgeKind, NodeType
from ettools.graph_tables import AttrColumn, StringTable, TensorTable
from ettools.rank_graph import RankGraph


class GraphBuilder:
    """Builds a :class:`RankGraph` one node at a time (readers, synthesizers, passes).

    ``add_node`` returns the new node's id (sequential from ``first_id`` unless given).
    Dependencies may name nodes added later; they are grouped per node at :meth:`build`.
    """

    def __init__(self, rank: int, strings: StringTable, first_id: int = 0) -> None:
        self.rank = rank
        self.strings = strings
        self._next_id = first_id
        self._cols: dict[str, list[Any]] = {k: [] for k in NODE_COLUMNS}
        self._dep_node: list[int] = []  # row of the dependent node
        self._dep_id: list[int] = []
        self._dep_kind: list[int] = []
        self._attrs: dict[str, tuple[str, list[int], list[Any]]] = {}
        self._tensor_cols: dict[str, list[Any]] = {
            k: [] for k in ("tensor_id", "storage_id", "offset", "numel", "elem_bytes", "dtype", "device")
        }
        self._shape_lens: list[int] = []
        self._dims: list[int] = []
        self._io: dict[str, tuple[list[int], list[int]]] = {"in": ([], []), "out": ([], [])}
        self.meta: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._cols["id"])

    def add_node(
        self,
        name: str,
        type: int = NodeType.COMP_NODE,
        *,
        start: float = math.nan,
        dur: float = math.nan,
        resource: str | None = None,
        is_cpu_op: int = -1,
        num_ops: int = -1,
        tensor_size: int = -1,
        comm_type: int = -1,
        comm_bytes: int = -1,
        comm_group: str | None = None,
        comm_peer: int = -1,
        comm_tag: int = -1,
        node_id: int | None = None,
    ) -> int:
        """Append a node and return its id."""
        if node_id is None:
            node_id = self._next_id
        self._next_id = max(self._next_id, node_id + 1)
        intern = self.strings.intern
        c = self._cols
        c["id"].append(node_id)
        c["name"].append(intern(name))
        c["type"].append(int(type))
        c["start"].append(start)
        c["dur"].append(dur)
        c["resource"].append(intern(resource) if resource is not None else -1)
        c["is_cpu_op"].append(is_cpu_op)
        c["num_ops"].append(num_ops)
        c["tensor_size"].append(tensor_size)
        c["comm_type"].append(comm_type)
        c["comm_bytes"].append(comm_bytes)
        c["comm_group"].append(intern(comm_group) if comm_group is not None else -1)
        c["comm_peer"].append(comm_peer)
        c["comm_tag"].append(comm_tag)
        return node_id

    @property
    def last_row(self) -> int:
        """Row of the most recently added node."""
        return len(self._cols["id"]) - 1

    def set(self, row: int, column: str, value: Any) -> None:
        """Overwrite one column value of an added node (e.g. a duration learned later)."""
        if column in ("name", "resource", "comm_group"):
            value = self.strings.intern(value) if value is not None else -1
        self._cols[column][row] = value

    def add_dep(self, row: int, dep_id: int, kind: int = EdgeKind.CTRL) -> None:
        """Make node ``row`` depend on the node with id ``dep_id``."""
        self._dep_node.append(row)
        self._dep_id.append(dep_id)
        self._dep_kind.append(int(kind))

    def add_deps(self, rows: Sequence[int] | np.ndarray, dep_ids: Sequence[int] | np.ndarray, kind: int) -> None:
        """Add many edges at once (``rows[k]`` depends on ``dep_ids[k]``)."""
        self._dep_node.extend(np.asarray(rows, np.int64).tolist())
        self._dep_id.extend(np.asarray(dep_ids, np.int64).tolist())
        self._dep_kind.extend([int(kind)] * len(rows))

    def set_attr(self, row: int, name: str, value: Any, kind: str) -> None:
        """Attach attribute ``name`` (Chakra value field ``kind``) to node ``row``."""
        entry = self._attrs.get(name)
        if entry is None:
            entry = self._attrs[name] = (kind, [], [])
        entry[1].append(row)
        entry[2].append(value)

    def add_tensor(
        self,
        shape: Sequence[int],
        elem_bytes: int,
        dtype: str = "",
        device: str = "",
        tensor_id: int = -1,
        storage_id: int = -1,
        offset: int = 0,
        numel: int | None = None,
    ) -> int:
        """Add a tensor to the rank's table and return its row."""
        t = self._tensor_cols
        if numel is None:
            numel = int(np.prod(shape)) if len(shape) else 1
        t["tensor_id"].append(tensor_id)
        t["storage_id"].append(storage_id)
        t["offset"].append(offset)
        t["numel"].append(numel)
        t["elem_bytes"].append(elem_bytes)
        t["dtype"].append(self.strings.intern(dtype))
        t["device"].append(self.strings.intern(device))
        self._shape_lens.append(len(shape))
        self._dims.extend(shape)
        return len(t["tensor_id"]) - 1

    def add_io(self, row: int, inputs: Sequence[int] = (), outputs: Sequence[int] = ()) -> None:
        """Record tensor rows read (``inputs``) and written (``outputs``) by node ``row``."""
        for key, tensors in (("in", inputs), ("out", outputs)):
            owners, vals = self._io[key]
            owners.extend([row] * len(tensors))
            vals.extend(tensors)

    def build(self, meta: dict[str, Any] | None = None) -> RankGraph:
        """Freeze into a :class:`RankGraph`."""
        n = len(self)
        cols = {k: np.asarray(v, NODE_COLUMNS[k][0]) if v else np.zeros(0, NODE_COLUMNS[k][0])
                for k, v in self._cols.items()}
        dep_node = np.asarray(self._dep_node, np.int64)
        order = np.argsort(dep_node, kind="stable")
        dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(dep_node, minlength=n), out=dep_ptr[1:])
        dep_id = np.asarray(self._dep_id, np.uint64)[order]
        dep_kind = np.asarray(self._dep_kind, np.uint8)[order]
        attrs = {}
        for name, (kind, rows, values) in self._attrs.items():
            r = np.asarray(rows, np.int64)
            o = np.argsort(r, kind="stable")
            attrs[name] = AttrColumn(kind, r[o], [values[i] for i in o.tolist()])
        t = self._tensor_cols
        shape_ptr = np.zeros(len(self._shape_lens) + 1, np.int64)
        np.cumsum(self._shape_lens, out=shape_ptr[1:])
        tensors = TensorTable(
            tensor_id=np.asarray(t["tensor_id"], np.int64),
            storage_id=np.asarray(t["storage_id"], np.int64),
            offset=np.asarray(t["offset"], np.int64),
            numel=np.asarray(t["numel"], np.int64),
            elem_bytes=np.asarray(t["elem_bytes"], np.int32),
            dtype=np.asarray(t["dtype"], np.int32),
            device=np.asarray(t["device"], np.int32),
            shape_ptr=shape_ptr,
            dims=np.asarray(self._dims, np.int64),
        )
        io = {}
        for key, (owners, vals) in self._io.items():
            o_arr = np.asarray(owners, np.int64)
            o = np.argsort(o_arr, kind="stable")
            ptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(o_arr, minlength=n), out=ptr[1:])
            io[key] = (ptr, np.asarray(vals, np.int64)[o])
        m = dict(self.meta)
        if meta:
            m.update(meta)
        return RankGraph(
            self.rank, self.strings, cols, dep_ptr, dep_id, dep_kind, attrs, tensors,
            io["in"][0], io["in"][1], io["out"][0], io["out"][1], m,
        )
