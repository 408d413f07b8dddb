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

This module holds :class:`Trace` and the identities of shared arrays; the parts live beside it and
are imported from here: :mod:`ettools.graph_schema` (enums, node columns), :mod:`ettools.graph_tables`
(strings, attributes, tensors, the node view), :mod:`ettools.trace_meta` (run metadata, process
groups), :mod:`ettools.rank_graph` (:class:`RankGraph`) and :mod:`ettools.graph_builder`
(:class:`GraphBuilder`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ettools.graph_builder import GraphBuilder  # noqa: F401  (re-exported)
from ettools.graph_schema import (  # noqa: F401  (re-exported)
    COMM_NODE_TYPES,
    NODE_COLUMNS,
    CollectiveType,
    EdgeKind,
    NodeType,
)
from ettools.graph_tables import AttrColumn, Node, StringTable, TensorTable  # noqa: F401  (re-exported)
from ettools.rank_graph import RankGraph
from ettools.trace_meta import MAX_WORLD_SIZE, ProcessGroup, TraceMeta  # noqa: F401  (re-exported)

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
