"""One PyTorch ET file → one :class:`~ettools.graph.RankGraph` (:func:`read_et_rank`): the schema
checked, the container and ``process_group:init`` nodes dropped (the groups they declare
returned), every other node with its attributes, inputs/outputs and tensors, then the edges
(:mod:`~ettools.converters.pytorch_et_edges`) and communication nodes
(:mod:`~ettools.converters.pytorch_et_comm`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.converters.pytorch_et_comm import _add_comm, _comm_kind, _rpc_collective_name
from ettools.converters.pytorch_et_edges import _add_data_edges, _add_structure_edges
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
)
from ettools.converters.pytorch_et_state import _EtRank
from ettools.errors import TraceError
from ettools.graph import AttrColumn, NodeType, ProcessGroup, RankGraph, StringTable
from ettools.json_chunks import load_chunked

SUPPORTED_SCHEMAS = (
    "1.0.1",
    "1.0.2-chakra.0.0.4",
    "1.0.3-chakra.0.0.4",
    "1.1.0-chakra.0.0.4",
    "1.1.1-chakra.0.0.4",
)


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
