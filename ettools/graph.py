"""The one graph model of ettools: a multi-rank execution trace stored in columns.

A :class:`Trace` is the metadata of a run (:class:`TraceMeta`: world size, process groups
with their global ranks, device properties, source) plus one :class:`RankGraph` per rank.
All ranks share one :class:`StringTable` that interns every name to an ``int32``, so kernel
signatures hundreds of characters long are stored once however many nodes and ranks use them.

A :class:`RankGraph` holds ``n`` nodes as parallel numpy columns (row ``i`` is one node):

========== ======= ==================================================================
column     dtype   meaning (sentinel for "absent")
========== ======= ==================================================================
id         uint64  node id, unique within the rank (Chakra ``Node.id``)
name       int32   interned name
type       uint8   :class:`NodeType` (the Chakra ``NodeType`` numbers)
start      float64 start time, µs since the trace's time origin (NaN)
dur        float64 duration, µs (NaN)
resource   int32   interned name of what ran it: ``"thread 17"``, ``"stream 7"`` (-1)
is_cpu_op  int8    1 host op, 0 device op (-1)
num_ops    int64   FLOPs, for roofline timing (-1)
tensor_size int64  bytes moved (-1)
comm_type  int8    :class:`CollectiveType` of a COMM_COLL node (-1)
comm_bytes int64   bytes with Chakra's ``comm_size`` meaning: the per-rank buffer (-1)
comm_group int32   interned process-group name, a key of ``TraceMeta.process_groups`` (-1)
comm_peer  int32   global rank of the other side of a send/recv (-1)
comm_tag   int64   send/recv tag, equal on both sides of a pair (-1)
========== ======= ==================================================================

Dependencies form one CSR structure: the dependencies of row ``i`` are
``dep_id[dep_ptr[i]:dep_ptr[i+1]]`` (node *ids*, so a foreign file's dangling references survive
a round trip) with an :class:`EdgeKind` per edge in ``dep_kind``. Chakra's ``data_deps`` are
``DATA`` edges; other kinds are completion dependencies written as ``ctrl_deps``, except
``NEST``, which records containment (a child op inside its parent's span), not completion:
graphs read from nested sources (Kineto, PyTorch ET) pass through
:func:`ettools.replayable.to_replayable` before a completion-semantics writer (Chakra) sees them.
``SYNC_GUESSED`` marks an edge a reader inferred rather than read.

Tensors live in a per-rank :class:`TensorTable` (id, storage, offset, element count, element
bytes, dtype, device, shape); a node's inputs and outputs are CSR lists of rows of that table.
Everything else a source carries is kept in sparse typed attribute columns
(:class:`AttrColumn`): ``rows`` (sorted node rows), ``values`` and ``kind`` — the Chakra
``AttributeProto`` value field (``"int64_val"``, ``"bool_list"``, …) the value is written with.
Chakra's ``IOInfo`` strings are kept in the attribute columns ``"inputs"`` and ``"outputs"``
(kind ``"io"``, value a ``(values, shapes, types)`` tuple).

Graphs are immutable by convention: passes build new graphs with :class:`GraphBuilder` or
:meth:`RankGraph.replace`, and may share unchanged columns (ranks that differ only in group ids
share their arrays). Analysis results go in ``RankGraph.meta`` (a dict), not a second structure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from ettools.graph_algorithms import topological_sort


class NodeType(IntEnum):
    """Chakra ``NodeType`` numbers."""

    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CollectiveType(IntEnum):
    """Chakra ``CollectiveCommType`` numbers."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


class EdgeKind(IntEnum):
    """Why one node waits for another."""

    DATA = 0  # consumes a tensor the dependency produced (Chakra data_deps)
    CTRL = 1  # generic control dependency (Chakra ctrl_deps)
    ORDER = 2  # runs after the previous node on the same thread or stream
    NEST = 3  # containment: a child op inside its parent's span (not a completion dependency)
    LAUNCH = 4  # a device op after the runtime call that launched it
    SYNC = 5  # a wait read from a synchronization event
    SYNC_GUESSED = 6  # a wait inferred without the event naming its target


COMM_NODE_TYPES = (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)

# Node columns: name -> (dtype, absent value). Order is the documented order.
NODE_COLUMNS: dict[str, tuple[Any, Any]] = {
    "id": (np.uint64, 0),
    "name": (np.int32, -1),
    "type": (np.uint8, int(NodeType.COMP_NODE)),
    "start": (np.float64, math.nan),
    "dur": (np.float64, math.nan),
    "resource": (np.int32, -1),
    "is_cpu_op": (np.int8, -1),
    "num_ops": (np.int64, -1),
    "tensor_size": (np.int64, -1),
    "comm_type": (np.int8, -1),
    "comm_bytes": (np.int64, -1),
    "comm_group": (np.int32, -1),
    "comm_peer": (np.int32, -1),
    "comm_tag": (np.int64, -1),
}


class StringTable:
    """Interns strings to dense ``int32`` ids shared by every rank of a trace."""

    __slots__ = ("_index", "_strings")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._strings: list[str] = []
        self._index: dict[str, int] = {}
        for s in strings:
            self.intern(s)

    def intern(self, s: str) -> int:
        """Return the id of ``s``, adding it if new."""
        i = self._index.get(s)
        if i is None:
            i = len(self._strings)
            self._strings.append(s)
            self._index[s] = i
        return i

    def lookup(self, s: str) -> int:
        """Return the id of ``s`` or -1 if it was never interned."""
        return self._index.get(s, -1)

    def __getitem__(self, i: int) -> str:
        return self._strings[i]

    def __len__(self) -> int:
        return len(self._strings)

    def decode(self, ids: np.ndarray) -> list[str]:
        """Strings of an array of ids (``-1`` gives ``""``)."""
        s = self._strings
        return [s[i] if i >= 0 else "" for i in ids.tolist()]


# The most ranks a trace may name: above every real job (today's largest are ~10^5 GPUs), and low
# enough that a per-rank table of the world fits in memory. A rank or world size beyond it is bad input.
MAX_WORLD_SIZE = 2**22


@dataclass(frozen=True)
class ProcessGroup:
    """A communicator: its name, its members as global ranks (in group-rank order)."""

    name: str
    ranks: tuple[int, ...]
    desc: str = ""
    backend: str = ""

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)


@dataclass
class TraceMeta:
    """What is known of the run as a whole."""

    world_size: int = 1
    process_groups: dict[str, ProcessGroup] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    # Free-form facts a reader keeps (schema versions, Chakra GlobalMetadata attributes, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def add_group(self, group: ProcessGroup) -> ProcessGroup:
        """Register ``group`` (a group of the same name must have the same members)."""
        if group.ranks and (max(group.ranks) >= MAX_WORLD_SIZE or min(group.ranks) < 0):
            bad = max(group.ranks) if max(group.ranks) >= MAX_WORLD_SIZE else min(group.ranks)
            raise ValueError(f"process group {group.name!r} names rank {bad}: ranks must be in "
                             f"0..{MAX_WORLD_SIZE - 1}")
        old = self.process_groups.get(group.name)
        if old is not None and old.ranks != group.ranks:
            raise ValueError(
                f"process group {group.name!r} given twice with different ranks: "
                f"{list(old.ranks)} and {list(group.ranks)}"
            )
        self.process_groups.setdefault(group.name, group)
        return self.process_groups[group.name]


@dataclass
class AttrColumn:
    """A sparse, typed attribute: ``values[k]`` belongs to node row ``rows[k]``."""

    kind: str
    rows: np.ndarray
    values: list[Any]

    def get(self, row: int, default: Any = None) -> Any:
        """Value on node ``row`` or ``default``."""
        k = int(np.searchsorted(self.rows, row))
        if k < len(self.rows) and self.rows[k] == row:
            return self.values[k]
        return default

    def as_dict(self) -> dict[int, Any]:
        """``{row: value}``."""
        return dict(zip(self.rows.tolist(), self.values))


@dataclass
class TensorTable:
    """Tensors of one rank, in columns; ``shape`` of row ``t`` is ``dims[shape_ptr[t]:shape_ptr[t+1]]``."""

    tensor_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    storage_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    numel: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    elem_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    dtype: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    device: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    shape_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    dims: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.tensor_id)

    @property
    def nbytes(self) -> np.ndarray:
        """Bytes of each tensor (element count × element size)."""
        return self.numel * self.elem_bytes

    def shape(self, t: int) -> tuple[int, ...]:
        """Shape of tensor row ``t``."""
        return tuple(self.dims[self.shape_ptr[t] : self.shape_ptr[t + 1]].tolist())


@dataclass
class Node:
    """A read-only view of one node, for tests, debugging and small tools (slow path)."""

    id: int
    name: str
    type: NodeType
    start: float
    dur: float
    resource: str
    is_cpu_op: int
    num_ops: int
    tensor_size: int
    comm_type: int
    comm_bytes: int
    comm_group: str
    comm_peer: int
    comm_tag: int
    deps: list[tuple[int, EdgeKind]]
    attrs: dict[str, Any]
    inputs: list[int]
    outputs: list[int]

    @property
    def data_deps(self) -> list[int]:
        """Ids of DATA dependencies."""
        return [d for d, k in self.deps if k == EdgeKind.DATA]

    @property
    def ctrl_deps(self) -> list[int]:
        """Ids of all non-DATA dependencies."""
        return [d for d, k in self.deps if k != EdgeKind.DATA]


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
        return RankGraph(
            self.rank, self.strings, new, self.dep_ptr, self.dep_id, self.dep_kind, dict(self.attrs),
            self.tensors, self.in_ptr, self.in_tensor, self.out_ptr, self.out_tensor, dict(self.meta),
        )

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


_STRUCTURE_COLUMNS = ("id", "name", "type", "start", "dur", "resource", "is_cpu_op", "num_ops",
                      "tensor_size", "comm_type", "comm_bytes", "comm_tag")


def structure_identity(g: RankGraph) -> tuple:
    """Identity of a graph's arrays except its group and peer columns.

    Ranks stamped out from one graph (shared arrays, e.g. data-parallel replicas or the ranks of
    one pipeline stage) have equal identities, so per-structure work (conversion, encoding) is done
    once. Built from ``id()`` of the arrays: valid only while the graphs are alive.
    """
    return tuple(id(g.columns[c]) for c in _STRUCTURE_COLUMNS) + (
        id(g.dep_ptr), id(g.dep_id), id(g.dep_kind), id(g.attrs.get("cat")))


def content_identity(g: RankGraph) -> tuple:
    """:func:`structure_identity` plus the group/peer columns and every attribute column."""
    attrs = tuple((k, id(v)) for k, v in sorted(g.attrs.items()))
    return structure_identity(g) + (id(g.columns["comm_group"]), id(g.columns["comm_peer"]), attrs)


@dataclass
class Trace:
    """A multi-rank trace: metadata plus one :class:`RankGraph` per rank, sharing strings."""

    meta: TraceMeta
    graphs: dict[int, RankGraph]
    strings: StringTable

    @property
    def ranks(self) -> list[int]:
        """Ranks present, ascending."""
        return sorted(self.graphs)

    def __getitem__(self, rank: int) -> RankGraph:
        return self.graphs[rank]

    def __iter__(self) -> Iterator[RankGraph]:
        for r in self.ranks:
            yield self.graphs[r]

    @property
    def num_nodes(self) -> int:
        """Nodes over all ranks."""
        return sum(len(g) for g in self.graphs.values())

    def group(self, name: str) -> ProcessGroup | None:
        """The process group ``name``, if known."""
        return self.meta.process_groups.get(name)


def new_trace(source: str = "", world_size: int = 1) -> tuple[Trace, StringTable]:
    """An empty trace and its string table, ready for builders."""
    strings = StringTable()
    return Trace(TraceMeta(world_size=world_size, source=source), {}, strings), strings
