"""The communication nodes of a PyTorch ET rank: which ``record_param_comms`` / ``c10d::*`` ops are
collectives or send/recv (:func:`_comm_kind`), and their type, bytes, group, peer and tag
(:func:`_add_comm`), as described in :mod:`ettools.converters.pytorch_et`."""

from __future__ import annotations

from ettools.converters.pytorch_et_state import _EtRank
from ettools.graph import CollectiveType, NodeType, ProcessGroup

# Collective names (record_param_comms / c10d op names, lower-cased, without "c10d::" and
# trailing "_") -> (node type, collective type).
_COLL = {
    "allreduce": CollectiveType.ALL_REDUCE,
    "all_reduce": CollectiveType.ALL_REDUCE,
    "allreduce_coalesced": CollectiveType.ALL_REDUCE,
    "allreduce_sparse": CollectiveType.ALL_REDUCE,
    "reduce": CollectiveType.REDUCE,
    "broadcast": CollectiveType.BROADCAST,
    "allgather": CollectiveType.ALL_GATHER,
    "all_gather": CollectiveType.ALL_GATHER,
    "_allgather_base": CollectiveType.ALL_GATHER,
    "allgather_base": CollectiveType.ALL_GATHER,
    "all_gather_into_tensor": CollectiveType.ALL_GATHER,
    "allgather_into_tensor_coalesced": CollectiveType.ALL_GATHER,
    "allgather_coalesced": CollectiveType.ALL_GATHER,
    "gather": CollectiveType.GATHER,
    "scatter": CollectiveType.SCATTER,
    "reduce_scatter": CollectiveType.REDUCE_SCATTER,
    "_reduce_scatter_base": CollectiveType.REDUCE_SCATTER,
    "reduce_scatter_base": CollectiveType.REDUCE_SCATTER,
    "reduce_scatter_tensor": CollectiveType.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": CollectiveType.REDUCE_SCATTER,
    "alltoall": CollectiveType.ALL_TO_ALL,
    "all_to_all": CollectiveType.ALL_TO_ALL,
    "alltoall_base": CollectiveType.ALL_TO_ALL,
    "all_to_allv": CollectiveType.ALL_TO_ALL,
    "alltoallv": CollectiveType.ALL_TO_ALL,
    "barrier": CollectiveType.BARRIER,
    "monitored_barrier": CollectiveType.BARRIER,
}
_P2P = {"send": NodeType.COMM_SEND_NODE, "recv": NodeType.COMM_RECV_NODE,
        "recv_any_source": NodeType.COMM_RECV_NODE, "recvanysource": NodeType.COMM_RECV_NODE}
# For c10d ops (no record_param_comms): which positional input holds the per-rank buffer.
_C10D_BUFFER_ARG = {
    CollectiveType.ALL_GATHER: 1, CollectiveType.GATHER: 1, CollectiveType.REDUCE_SCATTER: 1,
    CollectiveType.ALL_TO_ALL: 1, CollectiveType.SCATTER: 0,
}


def _comm_kind(raw_name: str) -> tuple[NodeType, int] | None:
    """(node type, collective type or -1) of a collective name, or None if not a collective."""
    n = raw_name.lower()
    if n.startswith("c10d::"):
        n = n[6:]
    if n.endswith("_"):
        n = n[:-1]
    if n in _P2P:
        return _P2P[n], -1
    c = _COLL.get(n)
    if c is None:
        return None
    return NodeType.COMM_COLL_NODE, int(c)


def _rpc_collective_name(attr_vals: dict, values: list, types: list) -> str:
    """Collective name of a ``record_param_comms`` node (attribute, else the String input)."""
    v = attr_vals.get("collective_name")
    if type(v) is str:
        return v
    k = _rpc_name_index(values, types)
    return values[k] if k >= 0 else ""


def _rpc_name_index(values: list, types: list) -> int:
    """Index of the collective-name string among ``record_param_comms`` inputs (-1 if none)."""
    for k, t in enumerate(types):
        if t == "String" and k < len(values) and type(values[k]) is str:
            return k
    return -1


def _add_comm(
    st: _EtRank, kept: list, comm_info: list, id_to_row: dict[int, int],
    groups: list[ProcessGroup], backend_ids: dict[int, str], flat: bool,
) -> int | None:
    """Mark communication nodes; returns the rank named in the file's comm records, if any."""
    b = st.builder
    by_row = {row: (nid, parent, n) for row, nid, parent, _tid, n in kept}
    rpc_parents: set[int] = set()
    for row, _nid, name, _a, _iv, _ity, _tin, _tout in comm_info:
        if name == "record_param_comms":
            p = by_row[row][1]
            if p >= 0:
                rpc_parents.add(p)
    group_names = {g.name for g in groups}
    default_group = groups[0].name if len(groups) == 1 else ("0" if "0" in group_names else None)
    rank_found: int | None = None
    for row, nid, name, attrs, iv, ity, tin, tout in comm_info:
        peer = tag = -1
        group: str | None = None
        if name == "record_param_comms":
            cname = _rpc_collective_name(attrs, iv, ity)
            ntype, ctype = _comm_kind(cname)  # type: ignore[misc]
            k = _rpc_name_index(iv, ity)
            pg = attrs.get("pg_name")
            if pg is None and k >= 2:
                g = iv[k - 2]
                if type(g) is list and g and type(g[0]) is str and g[0]:
                    pg = g[0]
                elif type(g) is int and g in backend_ids:
                    pg = backend_ids[g]
            group = pg if pg else None
            if k >= 1 and type(iv[k - 1]) is int and rank_found is None and iv[k - 1] >= 0:
                rank_found = iv[k - 1]
            nbytes = _bytes(tin)
            if ctype == CollectiveType.SCATTER or ntype == NodeType.COMM_RECV_NODE:
                nbytes = _bytes(tout) or nbytes
            # peer and tag from the enclosing c10d op of a send/recv
            parent = by_row[row][1]
            if ntype != NodeType.COMM_COLL_NODE and parent in id_to_row:
                peer, tag = _p2p_peer_tag(by_row[id_to_row[parent]][2], flat)
        else:
            if nid in rpc_parents:
                continue  # its record_param_comms child is the comm node
            ntype, ctype = _comm_kind(name)  # type: ignore[misc]
            arg = _C10D_BUFFER_ARG.get(CollectiveType(ctype), 0) if ctype >= 0 else 0
            nbytes = _bytes(st.tensors_of(iv[arg:arg + 1], _shapes_of(by_row[row][2], flat)[arg:arg + 1],
                                          ity[arg:arg + 1])) if len(iv) > arg else 0
            if ctype == CollectiveType.BARRIER:
                nbytes = 0
            if ntype != NodeType.COMM_COLL_NODE:
                peer, tag = _p2p_peer_tag(by_row[row][2], flat)
        if group is None:
            group = default_group
        b.set(row, "type", int(ntype))
        b.set(row, "comm_type", int(ctype) if ctype >= 0 else -1)
        b.set(row, "comm_bytes", int(nbytes))
        b.set(row, "comm_group", group)
        if peer >= 0:
            b.set(row, "comm_peer", peer)  # group rank for now; made global by the caller
        if tag >= 0:
            b.set(row, "comm_tag", tag)
    return rank_found


def _shapes_of(n: dict, flat: bool) -> list:
    return n.get("input_shapes", []) if flat else (n.get("inputs") or {}).get("shapes", [])


def _bytes(tensors: list[tuple[int, tuple[int, int], int]]) -> int:
    """Total bytes of distinct tensors."""
    seen: dict[tuple[int, int], int] = {}
    for _row, key, nb in tensors:
        seen[key] = max(seen.get(key, 0), nb)
    return sum(seen.values())


def _p2p_peer_tag(c10d_node: dict, flat: bool) -> tuple[int, int]:
    """(group rank of the peer, tag) from a ``c10d::send``/``recv_`` node's inputs."""
    values = c10d_node.get("inputs", []) if flat else (c10d_node.get("inputs") or {}).get("values", [])
    name = c10d_node.get("name", "")
    if not name.startswith("c10d::") or _comm_kind(name) is None or len(values) < 4:
        return -1, -1
    peer, tag = values[2], values[3]
    return (peer if type(peer) is int else -1), (tag if type(tag) is int else -1)
