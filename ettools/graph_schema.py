"""The vocabulary of the graph model: the Chakra numbers of node types (:class:`NodeType`) and
collectives (:class:`CollectiveType`), the kinds of dependency edges (:class:`EdgeKind`), and the
node columns with their dtypes and absent values (:data:`NODE_COLUMNS`). See :mod:`ettools.graph`."""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

import numpy as np


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
