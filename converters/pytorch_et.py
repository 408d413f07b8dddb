"""Reader of PyTorch Execution Trace (ET) JSON files into the ettools graph model.

One ET file is one rank. :func:`read_pytorch_et` takes a file, several files or a directory of
rank files (plain or gzip) and returns a :class:`~ettools.graph.Trace`.

Schemas: ``1.0.1`` (flat node keys ``parent``, ``input_shapes``, …) and the ``-chakra.0.0.4``
family ``1.0.2``, ``1.0.3``, ``1.1.0``, ``1.1.1`` (``ctrl_deps``, ``inputs: {values, shapes,
types[, strides]}``, ``attrs: [{name, type, value}]``). Any other version is a
:class:`~ettools.errors.TraceError`.

What becomes of the ET nodes
----------------------------
* Every operator / record-function node becomes one graph node (same id, same name,
  ``is_cpu_op=1``, resource ``"thread <tid>"``, no times: ET has none, the linker adds them).
* Dropped, because they are containers or metadata rather than work: the process root
  ``[pytorch|profiler|execution_trace|process]``, the per-thread roots
  ``[pytorch|profiler|execution_trace|thread]`` (older files: ``execution_graph``) and
  ``## process_group:init ##`` (its content goes to ``TraceMeta.process_groups``). Their counts
  are in ``RankGraph.meta["et"]["dropped"]``; children of a thread root are *top-level* ops.
* Attributes keep their ET names as :class:`~ettools.graph.AttrColumn` (``rf_id``, ``fw_parent``,
  ``seq_id``, ``scope``, ``tid``, ``fw_tid`` → ``int64_val``; ``op_schema``, ``kernel_backend``,
  ``kernel_file``, ``collective_name``, ``pg_name``, … → ``string_val``).
* ``inputs``/``outputs`` are kept as Chakra ``IOInfo`` strings (attr columns ``"inputs"`` and
  ``"outputs"``, kind ``"io"``, value ``(values, shapes, types)`` written with Python ``str()``
  exactly as Chakra's converter writes them). ``strides`` (newer schemas) are not kept.
* Tensors (value ``[tensor_id, storage_id, offset, numel, itemsize, device]``, also nested in
  ``GenericList[...]``) go to the rank's :class:`~ettools.graph.TensorTable` (one row per distinct
  tensor value and shape) and are listed as node inputs/outputs.

Edges (``dst`` depends on ``src``; every edge points to a smaller ET id, so the graph is acyclic)
-------------------------------------------------------------------------------------------------
* ``NEST``: child → its ET parent (``ctrl_deps``/``parent``), when the parent is kept.
* ``ORDER``: each op → the previous op with the same parent on the same thread (for top-level
  ops: the previous top-level op of the thread). ET ids grow in start order.
* ``DATA``: an op → the last earlier op that wrote a tensor it reads, tensors identified by
  ``(tensor_id, storage_id)``. Writers are taken in id order; a writer that is an ancestor of
  the reader is skipped (it has not finished when the reader runs), so in-place chains link to
  the previous writer. Undefined tensors (storage 0, no elements) carry no dependency.

Communication
-------------
``record_param_comms`` nodes naming a collective become ``COMM_COLL_NODE`` (``COMM_SEND_NODE`` /
``COMM_RECV_NODE`` for send/recv); when a ``c10d::*`` op has no such child (gloo, older torch)
the ``c10d::*`` op itself is the communication node. Exactly one node per collective call is a
comm node. ``comm_bytes`` follows Chakra's ``comm_size`` (per-rank buffer): the bytes of the
input tensors (ALL_REDUCE full buffer, ALL_GATHER per-rank input, REDUCE_SCATTER full input,
ALL_TO_ALL per-rank total); SCATTER and RECV use the output. ``comm_group`` is the process-group
name (from the ``record_param_comms`` arguments / attributes, else the only or default group);
send/recv get ``comm_peer`` (global rank) and ``comm_tag`` from the enclosing ``c10d`` op.
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.converters.pytorch_et_nodes import (
    _ROOT_PREFIXES,
    PG_INIT_NAME,
    NodeRecord,
    _io_triplet,
    add_attrs,
    node_attrs,
    node_head,
    node_io,
    read_chunks,
    tensor_keys,
)
from ettools.errors import TraceError
from ettools.graph import (
    AttrColumn,
    CollectiveType,
    EdgeKind,
    GraphBuilder,
    NodeType,
    ProcessGroup,
    RankGraph,
    StringTable,
    Trace,
    TraceMeta,
)
from ettools.io import load_json
from ettools.json_chunks import load_chunked

SUPPORTED_SCHEMAS = (
    "1.0.1",
    "1.0.2-chakra.0.0.4",
    "1.0.3-chakra.0.0.4",
    "1.1.0-chakra.0.0.4",
    "1.1.1-chakra.0.0.4",
)

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

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing builds millions of small containers, and
    collections triggered by their allocation cost 2-5x the parse itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


class _EtRank:
    """State of reading one rank file."""

    def __init__(self, path: Path, rank: int, strings: StringTable) -> None:
        self.path = path
        self.rank = rank
        self.strings = strings
        self.builder = GraphBuilder(rank, strings)
        self._tensor_rows: dict[tuple, int] = {}
        self._checked: dict[tuple, tuple] = {}  # tensor keys checked (tensor_keys)

    # ---- tensors ----------------------------------------------------------------------
    def tensors_of(self, values: list, shapes: list, types: list) -> list[tuple[int, tuple[int, int], int]]:
        """Tensor rows in an IOInfo, with their (tensor_id, storage_id) key and bytes."""
        return self.rows_of(tensor_keys(self.path, values, shapes, types, self._checked))

    def rows_of(self, keys: list[tuple]) -> list[tuple[int, tuple[int, int], int]]:
        """(tensor row, (tensor_id, storage_id), bytes) of each tensor key of :func:`tensor_keys`,
        a row added for each key not seen before (rows in the order tensors are first met)."""
        out: list[tuple[int, tuple[int, int], int]] = []
        row_of = self._tensor_rows
        for key in keys:
            row = row_of.get(key)
            if row is None:
                row = self._new_tensor(key[:6], key[7], key[6][7:-1], key[6])
            out.append((row, (key[0], key[1]), key[3] * key[4]))
        return out

    def _new_tensor(self, tv: tuple, shp: tuple, dtype: str, tkey: str) -> int:
        tid, sid, off, numel, itemsize, dev = tv  # checked by tensor_keys
        if not all(type(x) is int for x in shp):
            shp = ()
        row = self.builder.add_tensor(
            shp, int(itemsize), dtype=dtype, device=dev, tensor_id=int(tid),
            storage_id=int(sid), offset=int(off), numel=int(numel),
        )
        self._tensor_rows[(*tv, tkey, shp)] = row
        return row


def _parse_groups(node: dict, values: list, path: Path, index: int) -> list[dict]:
    """The list of group descriptions in a ``## process_group:init ##`` node."""
    if not values or type(values[0]) is not str:
        raise TraceError(path, f"node {index} ({PG_INIT_NAME}): no process-group JSON string in inputs")
    try:
        groups = orjson.loads(values[0])
    except orjson.JSONDecodeError as e:
        raise TraceError(path, f"node {index} ({PG_INIT_NAME}): process-group string is not JSON: {e}") from None
    if type(groups) is not list or not all(type(g) is dict for g in groups):
        raise TraceError(path, f"node {index} ({PG_INIT_NAME}): expected a JSON list of objects")
    return groups


def read_et_rank(
    path: str | Path, strings: StringTable, rank: int | None = None, data: Any = None
) -> tuple[RankGraph, list[ProcessGroup], dict[str, Any]]:
    """Read one ET file into a :class:`RankGraph`.

    Returns the graph, the process groups the file declares and facts about the file
    (``schema``, ``rank`` as found in the file's communication records or None, …). ``rank``
    labels the graph (default 0, or the rank found in the file); ``data`` is the already parsed
    JSON, if the caller has it.
    """
    path = Path(path)
    chunks = None
    if data is None:  # the nodes parsed a slice at a time (issue 26: memory ≤ 4x the input)
        doc, chunks = load_chunked(path, "nodes")
    else:
        doc = data
    if type(doc) is not dict:
        raise TraceError(path, "not a PyTorch ET file: top level is not a JSON object")
    if "nodes" not in doc:
        raise TraceError(path, "not a PyTorch ET file: no 'nodes' list")
    schema = doc.get("schema")
    if schema not in SUPPORTED_SCHEMAS:
        raise TraceError(
            path, f"unsupported ET schema version {schema!r} (supported: {', '.join(SUPPORTED_SCHEMAS)})"
        )
    raw_nodes = doc["nodes"]
    if type(raw_nodes) is not list:
        raise TraceError(path, "'nodes' is not a list")
    flat = schema == "1.0.1"
    if chunks is not None:
        try:  # each node read into a compact record as its slice is parsed, in file order
            nodes, count = read_chunks(path, chunks, flat)
            return _read_nodes(path, strings, rank, doc, nodes, count, flat)
        except Exception:  # noqa: BLE001  any problem: the whole parse, which names it as before
            doc = chunks.full()
            raw_nodes = doc["nodes"]
        finally:
            chunks.close()
    # Pass 1: validate, normalise (ids grow in start order: sorted by id below).
    nodes = [(*node_head(path, n, i, flat), n) for i, n in enumerate(raw_nodes)]
    return _read_nodes(path, strings, rank, doc, nodes, len(raw_nodes), flat)


def _read_nodes(
    path: Path, strings: StringTable, rank: int | None, doc: dict, nodes: list[tuple], count: int, flat: bool
) -> tuple[RankGraph, list[ProcessGroup], dict[str, Any]]:
    """:func:`read_et_rank` from its nodes: (id, file index, name, parent, node dict or the
    :class:`NodeRecord` read from it) in file order; ``count`` nodes in the file."""
    nodes.sort(key=lambda x: x[0])
    for k in range(1, len(nodes)):
        if nodes[k][0] == nodes[k - 1][0]:
            raise TraceError(path, f"node {nodes[k][1]}: duplicate id {nodes[k][0]}")

    st = _EtRank(path, 0 if rank is None else rank, strings)
    b = st.builder
    dropped: dict[str, int] = {}
    dropped_ids: set[int] = set()
    groups_raw: list[dict] = []
    for nid, i, name, _parent, n in nodes:
        if name.startswith(_ROOT_PREFIXES):
            dropped_ids.add(nid)
            dropped[name] = dropped.get(name, 0) + 1
        elif name == PG_INIT_NAME:
            dropped_ids.add(nid)
            dropped[name] = dropped.get(name, 0) + 1
            values, _, _ = _io_triplet(n, "inputs", flat, path, i)
            groups_raw.extend(_parse_groups(n, values, path, i))

    groups: list[ProcessGroup] = []
    backend_ids: dict[int, str] = {}
    for g in groups_raw:
        name = str(g.get("pg_name", ""))
        ranks = g.get("ranks") or []
        size = g.get("group_size")
        if not ranks and type(size) is int and size > 0:
            ranks = list(range(size))
        groups.append(ProcessGroup(name, tuple(int(r) for r in ranks), str(g.get("pg_desc", "")),
                                   str(g.get("backend_config", ""))))
        if type(g.get("backend_id")) is int:
            backend_ids[g["backend_id"]] = name

    # Pass 2: nodes, attributes, tensors, in id order (attribute kinds are taken from the first node
    # that has the attribute and checked per column at the end). What a node holds is read by
    # node_attrs/node_io, here or before (a NodeRecord, read as the file's slices were parsed);
    # what depends on the order (rows, columns, tensor rows) is made here.
    kept: list[tuple[int, int, int, int, dict]] = []  # (row, id, parent id or -1, tid, node)
    reads: list[list[tuple[int, int]]] = []
    writes: list[list[tuple[int, int]]] = []
    comm_info: list[tuple] = []
    acols: dict[str, tuple[str, list[int], list[Any]]] = {}
    in_rows: list[int] = []
    in_vals: list[tuple[str, str, str]] = []
    out_vals: list[tuple[str, str, str]] = []
    thread_res: dict[int, str] = {}
    add_node = b.add_node
    for nid, i, name, parent, n in nodes:
        if nid in dropped_ids:
            continue
        row = len(b)
        rec = n if type(n) is NodeRecord else None
        items = rec.attrs if rec is not None else node_attrs(path, n, i, nid, flat)
        add_attrs(path, acols, items, row, i, nid, flat)
        attr_vals = dict(zip(items[0::3], items[2::3]))
        tid = attr_vals.get("tid", 0)
        if type(tid) is not int:
            tid = 0
        res = thread_res.get(tid)
        if res is None:
            res = thread_res[tid] = f"thread {tid}"
        add_node(name, NodeType.COMP_NODE, resource=res, is_cpu_op=1, node_id=nid)
        # inputs / outputs: Chakra IOInfo strings, and tensors
        io = rec.io if rec is not None else node_io(path, n, i, nid, flat, st._checked)
        ins, outs, tin_keys, tout_keys, iv, ity = io
        in_rows.append(row)
        in_vals.append(ins)
        out_vals.append(outs)
        tin, tout = st.rows_of(tin_keys), st.rows_of(tout_keys)
        if tin or tout:
            b.add_io(row, [t[0] for t in tin], [t[0] for t in tout])
            reads.append([t[1] for t in tin if t[2] > 0 or t[1][1] != 0])
            writes.append([t[1] for t in tout if t[2] > 0 or t[1][1] != 0])
        else:
            reads.append(tin)
            writes.append(tout)
        kept.append((row, nid, -1 if parent in dropped_ids or parent == nid else parent, tid,
                     n if rec is None else rec.node))
        if name == "record_param_comms":
            cname = _rpc_collective_name(attr_vals, iv, ity)
            if cname and _comm_kind(cname) is not None:
                comm_info.append((row, nid, name, attr_vals, iv, ity, tin, tout))
        elif name.startswith("c10d::") and _comm_kind(name) is not None:
            comm_info.append((row, nid, name, attr_vals, iv, ity, tin, tout))
    acols["inputs"] = ("io", in_rows, in_vals)
    acols["outputs"] = ("io", in_rows, out_vals)

    id_to_row = {k[1]: k[0] for k in kept}
    _add_structure_edges(b, kept, id_to_row)
    _add_data_edges(b, kept, reads, writes)
    rank_found = _add_comm(st, kept, comm_info, id_to_row, groups, backend_ids, flat)

    info = {
        "schema": doc.get("schema"),
        "path": str(path),
        "pid": doc.get("pid"),
        "time": doc.get("time"),
        "start_ts": doc.get("start_ts"),
        "finish_ts": doc.get("finish_ts"),
        "dropped": dropped,
        "nodes_in_file": count,
        "rank_in_file": rank_found,
    }
    graph = b.build(meta={"et": info})
    for name, (kind, rows, values) in acols.items():
        kind, values = _checked_kind(kind, values)
        graph.attrs[name] = AttrColumn(kind, np.asarray(rows, np.int64), values)
    return graph, groups, info


def _checked_kind(kind: str, values: list) -> tuple[str, list]:
    """``(kind, values)`` with ``kind`` valid for every value, else everything as ``string_val``."""
    if kind == "int64_val":
        ok = all(type(v) is int for v in values)
    elif kind == "string_val":
        ok = all(type(v) is str for v in values)
    elif kind == "bool_val":
        ok = all(type(v) is bool for v in values)
    elif kind == "double_val":
        ok = all(type(v) is float or type(v) is int for v in values)
    elif kind == "io":
        ok = True
    else:
        ok = False
    if ok:
        return kind, values
    return "string_val", [v if type(v) is str else str(v) for v in values]


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


def _add_structure_edges(b: GraphBuilder, kept: list, id_to_row: dict[int, int]) -> None:
    """NEST edges to the parent and ORDER edges between consecutive siblings of one thread."""
    last_child: dict[tuple[int, int], int] = {}
    nest_rows, nest_ids, order_rows, order_ids = [], [], [], []
    for row, nid, parent, tid, _n in kept:
        if parent >= 0 and parent in id_to_row:
            nest_rows.append(row)
            nest_ids.append(parent)
        elif parent >= 0:
            parent = -1  # parent not in the file: treat as top-level (kept as a dangling-free graph)
        key = (parent, tid)
        prev = last_child.get(key)
        if prev is not None:
            order_rows.append(row)
            order_ids.append(prev)
        last_child[key] = nid
    b.add_deps(nest_rows, nest_ids, EdgeKind.NEST)
    b.add_deps(order_rows, order_ids, EdgeKind.ORDER)


def _add_data_edges(b: GraphBuilder, kept: list, reads: list, writes: list) -> None:
    """DATA edges: each op depends on the last earlier non-ancestor writer of what it reads.

    Work is linear in tensor mentions, plus the nesting depth when the last writer of a tensor
    is an ancestor of the reader (in-place ops nested in in-place ops).
    """
    parent_of = {nid: parent for _row, nid, parent, _tid, _n in kept}
    writers: dict[tuple[int, int], list[int]] = {}
    rows, ids = [], []
    for k, (row, nid, _parent, _tid, _n) in enumerate(kept):
        rd = reads[k]
        if rd:
            deps: set[int] = set()
            anc: set[int] | None = None
            for key in rd:
                wl = writers.get(key)
                if not wl:
                    continue
                j = len(wl) - 1
                w = wl[j]
                if anc is None and parent_of.get(nid, -1) >= 0:
                    anc = set()
                    p = parent_of[nid]
                    while p >= 0 and p not in anc:
                        anc.add(p)
                        p = parent_of.get(p, -1)
                if anc:
                    while j >= 0 and wl[j] in anc:
                        j -= 1
                    if j < 0:
                        continue
                    w = wl[j]
                deps.add(w)
            for d in sorted(deps):
                rows.append(row)
                ids.append(d)
        for key in writes[k]:
            wl = writers.get(key)
            if wl is None:
                writers[key] = [nid]
            elif wl[-1] != nid:
                wl.append(nid)
    b.add_deps(rows, ids, EdgeKind.DATA)


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


# ---- files and ranks ------------------------------------------------------------------------
def et_rank_files(paths: list[Path] | Path | str) -> list[tuple[int | None, Path]]:
    """The ET files named by ``paths`` (files and/or directories), with the rank their name gives.

    A directory contributes its ``*.json`` / ``*.json.gz`` files. With one file, only a
    ``rank<N>`` in its name counts; with several, ``rank<N>``, else the last number of each name
    when those are distinct. ``None`` where the name gives no rank.
    """
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(x for x in p.iterdir() if x.is_file() and x.name.endswith((".json", ".json.gz")))
            if not found:
                raise TraceError(p, "directory holds no .json or .json.gz ET files")
            files.extend(found)
        else:
            files.append(p)
    ranks: list[int | None] = []
    for f in files:
        m = _RANK_IN_NAME.findall(f.name)
        ranks.append(int(m[-1]) if m else None)
    if len(files) > 1 and any(r is None for r in ranks):
        nums = [(_NUMBER.findall(f.name.split(".")[0]) or [None])[-1] for f in files]
        if all(x is not None for x in nums) and len({int(x) for x in nums}) == len(nums):  # type: ignore[arg-type]
            ranks = [int(x) for x in nums]  # type: ignore[arg-type]
    return list(zip(ranks, files))


def read_pytorch_et(paths: list[Path] | Path | str) -> Trace:
    """Read one ET file, several rank files, or a directory of them, into a :class:`Trace`.

    Ranks come from a number in each file name (see :func:`et_rank_files`), else from the rank
    the file's ``record_param_comms`` records carry, else 0; two files of one rank are an error.
    ``send``/``recv`` peers are converted from group ranks to global ranks.
    """
    strings = StringTable()
    meta = TraceMeta(source="pytorch_et")
    graphs: dict[int, RankGraph] = {}
    schemas: dict[int, str] = {}
    entries = et_rank_files(paths)
    for named_rank, f in entries:
        with no_gc():
            g, groups, info = read_et_rank(f, strings, rank=named_rank)
        rank = named_rank
        if rank is None:
            rank = info["rank_in_file"] if info["rank_in_file"] is not None else 0
            if rank != g.rank:
                g = g.with_rank(rank)
        if rank in graphs:
            raise TraceError(f, f"rank {rank} given twice (also {graphs[rank].meta['et']['path']})")
        for grp in groups:
            try:
                meta.add_group(grp)
            except ValueError as e:
                raise TraceError(f, str(e)) from None
        graphs[rank] = g
        schemas[rank] = info["schema"]
    world = max([max(graphs) + 1 if graphs else 1, len(graphs)]
                + [max(gr.ranks) + 1 for gr in meta.process_groups.values() if gr.ranks])
    meta.world_size = world
    _ensure_default_group(meta, graphs, strings)
    for rank, g in list(graphs.items()):
        graphs[rank] = _globalize_peers(g, meta)
    meta.extra["et_schema"] = schemas
    return Trace(meta, dict(sorted(graphs.items())), strings)


def _ensure_default_group(meta: TraceMeta, graphs: dict[int, RankGraph], strings: StringTable) -> None:
    """Give comm nodes with no known group the default group "0" (all ranks), declared in meta; in
    a one-rank trace, a group its nodes name without a ``process_group:init`` record is the world
    (rank 0 alone: there is no other group it can be)."""
    if meta.world_size == 1:
        for g in graphs.values():
            comm = (g.type >= NodeType.COMM_SEND_NODE) & (g.comm_group >= 0)
            for gid in np.unique(g.comm_group[comm]).tolist():
                name = strings[int(gid)]
                if name not in meta.process_groups:
                    meta.add_group(ProcessGroup(name, (0,), "world of a one-rank trace (assumed)", ""))
    need = False
    for g in graphs.values():
        comm = g.type >= NodeType.COMM_SEND_NODE
        if (comm & (g.comm_group < 0)).any():
            need = True
            break
    if not need:
        return
    if "0" not in meta.process_groups:
        meta.add_group(ProcessGroup("0", tuple(range(meta.world_size)), "default_pg (assumed)", ""))
    gid = strings.intern("0")
    for rank, g in list(graphs.items()):
        comm = (g.type >= NodeType.COMM_SEND_NODE) & (g.comm_group < 0)
        if comm.any():
            cg = g.comm_group.copy()
            cg[comm] = gid
            graphs[rank] = g.replace(comm_group=cg)


def _globalize_peers(g: RankGraph, meta: TraceMeta) -> RankGraph:
    """Turn send/recv peers from group ranks into global ranks."""
    rows = [int(r) for r in (g.comm_peer >= 0).nonzero()[0]]
    if not rows:
        return g
    peer = g.comm_peer.copy()
    for r in rows:
        grp = meta.process_groups.get(g.group_name(r))
        if grp is not None and 0 <= peer[r] < len(grp.ranks):
            peer[r] = grp.ranks[peer[r]]
    return g.replace(comm_peer=peer)


def iter_et_nodes(path: str | Path) -> Iterable[dict]:
    """The raw node objects of an ET file (for tests and tools that want the JSON)."""
    doc = load_json(path)
    if type(doc) is not dict or type(doc.get("nodes")) is not list:
        raise TraceError(path, "not a PyTorch ET file: no 'nodes' list")
    return doc["nodes"]
