"""ASTRA-sim's JSON workload format: read and write, one file per rank.

The format is what Chakra's feeder (``src/feeder/json_node.cpp``, used by ASTRA-sim) reads when
a workload file ends in ``.json``; ``../shared/traces/astrasim_json/small_workload.json`` is an
instance. One JSON object per rank::

    {"workload_graph": [{"Id": 216, "Name": "...", "NodeType": 4, "ctrlDeps": [3],
                         "data_deps": [], "runtime": 318, "is_cpu_op": true}, ...],
     "workload_name": "...", "ngpus": 8, "soc": "..."}

Node keys and value forms: ``Id`` (unsigned int), ``Name`` (string), ``NodeType`` (the Chakra
``NodeType`` *number*), ``data_deps`` and ``ctrlDeps`` (lists of ids), ``runtime`` (integer µs —
the feeder's ``duration_micros``), ``is_cpu_op`` (JSON bool). For COMM_SEND/RECV/COLL nodes the
feeder also reads ``tensor_size``, ``comm_type`` (``CollectiveCommType`` number), ``comm_priority``,
``comm_size`` (bytes, Chakra semantics), ``comm_src``, ``comm_dst`` and ``comm_tag`` (ints).

What the feeder does with them, and so what this writer does:

* It enforces **only** ``data_deps`` (``ctrlDeps`` is never read). So that a simulation keeps the
  trace's ordering, the writer lists every dependency in ``data_deps`` and the non-data ones
  again in ``ctrlDeps`` (``enforce_ctrl=True``, the default); the reader takes an id listed in
  ``ctrlDeps`` as a control dependency and the other ``data_deps`` as data dependencies, so a
  round trip keeps each edge and its data/control kind. Ids are listed once per list (the feeder
  hangs on a repeated id). A control dependency on an id absent from the rank (a foreign
  file's defect, e.g. ``small_workload.json``'s ``ctrlDeps``) stays in ``ctrlDeps`` only, where it is
  harmless; a dangling *data* dependency is written as it is (the feeder would never issue the
  node: :func:`ettools.checks.check_no_dangling` reports it).
* It has no process-group field: a collective runs on all ranks. The writer adds ``pg_name``
  (the group's name) on each COMM_COLL node and ``comm_groups`` (``{name: [global ranks]}``, the
  groups the file uses) at top level; the feeder ignores both, this reader restores them.
* ``comm_src``/``comm_dst`` are global ranks: a SEND's peer is its ``comm_dst``, a RECV's its
  ``comm_src``; the writer writes the file's own rank on the other side.

Lost on writing (the format has no place for them): start times, resources (threads and
streams), tensors and their shapes, attributes other than ``comm_priority``, the finer edge kinds
(ORDER, LAUNCH, SYNC, … all become control dependencies), sub-µs durations (``runtime`` is an
integer), and METADATA/INVALID nodes (left out, as ASTRA-sim cannot run them; dependencies on
them are dropped). ``num_ops`` is written for COMP nodes that have it (the feeder ignores it).
Keys this reader does not know are kept as attributes and written back.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.errors import TraceError
from ettools.graph import COMM_NODE_TYPES, EdgeKind, GraphBuilder, NodeType, ProcessGroup, Trace, new_trace
from ettools.io import OutputSet, load_json

_KNOWN = {"Id", "Name", "NodeType", "ctrlDeps", "data_deps", "runtime", "is_cpu_op", "tensor_size",
          "comm_type", "comm_priority", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name",
          "num_ops"}
_EXTRA_KEYS = "astrasim_json_keys"  # RankGraph.meta: attribute names read from unknown node keys
_SKIP_TYPES = (int(NodeType.METADATA_NODE), int(NodeType.INVALID_NODE))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _rank_of(path: Path) -> int:
    from ettools.formats import rank_from_name

    r = rank_from_name(path)
    return 0 if r is None else r


def read_astrasim_json(path: str | os.PathLike, rank: int | None = None) -> Trace:
    """Read one ASTRA-sim JSON workload file (plain or gzip) as a one-rank trace.

    The rank is ``rank`` if given, else the number in the file name (``trace.3.json`` → 3), else 0.
    Raises :class:`TraceError` naming the file and the node index on malformed input.
    """
    path = Path(path)
    doc = load_json(path)
    if not isinstance(doc, dict):
        raise TraceError(path, f"expected a JSON object with a 'workload_graph' list, got {type(doc).__name__}")
    nodes = doc.get("workload_graph")
    if not isinstance(nodes, list):
        raise TraceError(path, "no 'workload_graph' list: not an ASTRA-sim JSON workload")
    rank = _rank_of(path) if rank is None else int(rank)
    top = {k: v for k, v in doc.items() if k not in ("workload_graph", "comm_groups")}
    ngpus = doc.get("ngpus")
    world = max(ngpus if _is_int(ngpus) and ngpus > 0 else 1, rank + 1)
    trace, strings = new_trace(source="astrasim-json", world_size=world)
    trace.meta.extra["astrasim_json"] = top
    groups = doc.get("comm_groups")
    if groups is not None:
        if not isinstance(groups, dict):
            raise TraceError(path, "'comm_groups' must map group names to lists of ranks")
        for gname, ranks in groups.items():
            if not isinstance(ranks, list) or not all(_is_int(r) and r >= 0 for r in ranks):
                raise TraceError(path, f"comm_groups[{gname!r}] must be a list of ranks")
            trace.meta.add_group(ProcessGroup(str(gname), tuple(ranks)))
            trace.meta.world_size = max(trace.meta.world_size, max(ranks, default=-1) + 1)

    b = GraphBuilder(rank, strings)
    seen: set[int] = set()
    extra_keys: dict[str, str] = {}
    for i, nd in enumerate(nodes):
        where = f"workload_graph[{i}]"
        if not isinstance(nd, dict):
            raise TraceError(path, f"{where}: expected an object, got {type(nd).__name__}")
        nid = nd.get("Id")
        if nid is None:
            raise TraceError(path, f"{where}: node has no 'Id'")
        if not _is_int(nid) or nid < 0:
            raise TraceError(path, f"{where}: 'Id' must be a non-negative integer, got {nid!r}")
        if nid in seen:
            raise TraceError(path, f"{where}: duplicate node Id {nid}")
        seen.add(nid)
        ntype = nd.get("NodeType", int(NodeType.COMP_NODE))
        if isinstance(ntype, str) and ntype in NodeType.__members__:
            ntype = int(NodeType[ntype])
        if not _is_int(ntype) or ntype not in NodeType._value2member_map_:
            raise TraceError(path, f"{where} (Id {nid}): unknown NodeType {ntype!r}")
        name = nd.get("Name", "")
        if not isinstance(name, str):
            raise TraceError(path, f"{where} (Id {nid}): 'Name' must be a string")
        runtime = nd.get("runtime")
        if runtime is None:
            dur = math.nan
        elif isinstance(runtime, (int, float)) and not isinstance(runtime, bool) and runtime >= 0:
            dur = float(runtime)
        else:
            raise TraceError(path, f"{where} (Id {nid}): 'runtime' must be a non-negative number")
        cpu = nd.get("is_cpu_op")
        if cpu is None:
            is_cpu = -1
        elif isinstance(cpu, (bool, int)):
            is_cpu = 1 if cpu else 0
        else:
            raise TraceError(path, f"{where} (Id {nid}): 'is_cpu_op' must be a bool")
        here = f"{where} (Id {nid})"
        comm_src, comm_dst = _int_field(path, here, nd, "comm_src"), _int_field(path, here, nd, "comm_dst")
        peer = comm_dst if ntype == NodeType.COMM_SEND_NODE else (
            comm_src if ntype == NodeType.COMM_RECV_NODE else -1)
        pg = nd.get("pg_name")
        if pg is not None and not isinstance(pg, str):
            raise TraceError(path, f"{where} (Id {nid}): 'pg_name' must be a string")
        b.add_node(
            name, ntype, dur=dur, is_cpu_op=is_cpu, num_ops=_int_field(path, here, nd, "num_ops"),
            tensor_size=_int_field(path, here, nd, "tensor_size"), comm_type=_int_field(path, here, nd, "comm_type"),
            comm_bytes=_int_field(path, here, nd, "comm_size"), comm_group=pg, comm_peer=peer,
            comm_tag=_int_field(path, here, nd, "comm_tag"), node_id=nid,
        )
        row = b.last_row
        prio = _int_field(path, here, nd, "comm_priority", -(1 << 62))
        if prio != -(1 << 62):
            b.set_attr(row, "comm_priority", prio, "int32_val")
        ctrl = _id_list(path, where, nid, nd, "ctrlDeps")
        data = _id_list(path, where, nid, nd, "data_deps")
        ctrl_set = set(ctrl)
        for d in data:
            if d not in ctrl_set:
                b.add_dep(row, d, EdgeKind.DATA)
        for d in ctrl:
            b.add_dep(row, d, EdgeKind.CTRL)
        for k, v in nd.items():
            if k in _KNOWN:
                continue
            kind = _attr_kind(v)
            if kind is not None:
                b.set_attr(row, k, v, kind)
                extra_keys[k] = kind
    g = b.build(meta={_EXTRA_KEYS: sorted(extra_keys)} if extra_keys else None)
    trace.graphs[rank] = g
    return trace


def _int_field(path: Path, where: str, nd: dict, key: str, default: int = -1) -> int:
    v = nd.get(key)
    if v is None:
        return default
    if not _is_int(v):
        raise TraceError(path, f"{where}: {key!r} must be an integer, got {v!r}")
    return v


def _id_list(path: Path, where: str, nid: int, nd: dict, key: str) -> list[int]:
    v = nd.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(_is_int(x) and x >= 0 for x in v):
        raise TraceError(path, f"{where} (Id {nid}): {key!r} must be a list of node ids")
    return v


def _attr_kind(v: Any) -> str | None:
    """The Chakra attribute value field for a JSON value of an unknown key (None: not kept)."""
    if isinstance(v, bool):
        return "bool_val"
    if isinstance(v, int):
        return "int64_val"
    if isinstance(v, float):
        return "double_val"
    if isinstance(v, str):
        return "string_val"
    if isinstance(v, list) and v:
        if all(isinstance(x, bool) for x in v):
            return "bool_list"
        if all(_is_int(x) for x in v):
            return "int64_list"
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return "double_list"
        if all(isinstance(x, str) for x in v):
            return "string_list"
    return None


def _unique(seq: list[int]) -> list[int]:
    return list(dict.fromkeys(seq))


def _rank_doc(trace: Trace, rank: int, name: str, enforce_ctrl: bool) -> dict[str, Any]:
    g = trace.graphs[rank]
    c = g.columns
    types = c["type"]
    keep = ~np.isin(types, _SKIP_TYPES)
    kept_rows = np.flatnonzero(keep)
    src, _, kind = g.edge_rows()
    src_ok = (src >= 0)
    src_kept = np.zeros(len(src), bool)
    src_kept[src_ok] = keep[src[src_ok]]
    # an edge is written unless it points at a node left out (METADATA/INVALID)
    write_edge = ~src_ok | src_kept
    ptr = g.dep_ptr
    dep_ids = g.dep_id.tolist()
    kinds = kind.tolist()
    present = src_ok.tolist()
    write = write_edge.tolist()
    ids = c["id"].tolist()
    names = g.names()
    dur = c["dur"].tolist()
    cpu = c["is_cpu_op"].tolist()
    ctype = c["comm_type"].tolist()
    cbytes = c["comm_bytes"].tolist()
    cgroup = c["comm_group"].tolist()
    cpeer = c["comm_peer"].tolist()
    ctag = c["comm_tag"].tolist()
    tsize = c["tensor_size"].tolist()
    nops = c["num_ops"].tolist()
    tlist = types.tolist()
    prio = g.attr("comm_priority")
    prio_map = prio.as_dict() if prio is not None else {}
    extra_attrs = {k: g.attrs[k].as_dict() for k in g.meta.get(_EXTRA_KEYS, []) if k in g.attrs}
    comm_types = {int(t) for t in COMM_NODE_TYPES}
    used_groups: set[str] = set()
    out_nodes = []
    for r in kept_rows.tolist():
        data: list[int] = []
        ctrl: list[int] = []
        for e in range(ptr[r], ptr[r + 1]):
            if not write[e]:
                continue
            if kinds[e] == EdgeKind.DATA:
                data.append(dep_ids[e])
            else:
                ctrl.append(dep_ids[e])
                if enforce_ctrl and present[e]:
                    data.append(dep_ids[e])
        d = dur[r]
        ty = tlist[r]
        node: dict[str, Any] = {
            "Id": ids[r], "Name": names[r], "NodeType": ty, "ctrlDeps": _unique(ctrl),
            "data_deps": _unique(data), "runtime": int(round(d)) if math.isfinite(d) else 0,
            "is_cpu_op": cpu[r] == 1,
        }
        if ty in comm_types:
            if ty == NodeType.COMM_COLL_NODE:
                if ctype[r] >= 0:
                    node["comm_type"] = ctype[r]
                if cgroup[r] >= 0:
                    gname = g.strings[cgroup[r]]
                    node["pg_name"] = gname
                    used_groups.add(gname)
            else:
                send = ty == NodeType.COMM_SEND_NODE
                if cpeer[r] >= 0:
                    node["comm_src"] = rank if send else cpeer[r]
                    node["comm_dst"] = cpeer[r] if send else rank
                if ctag[r] >= 0:
                    node["comm_tag"] = ctag[r]
            if cbytes[r] >= 0:
                node["comm_size"] = cbytes[r]
            if r in prio_map:
                node["comm_priority"] = int(prio_map[r])
        elif nops[r] >= 0:
            node["num_ops"] = nops[r]
        if tsize[r] >= 0:
            node["tensor_size"] = tsize[r]
        for k, vals in extra_attrs.items():
            if r in vals:
                node[k] = vals[r]
        out_nodes.append(node)
    top = dict(trace.meta.extra.get("astrasim_json", {}))
    doc: dict[str, Any] = {"workload_graph": out_nodes}
    doc["workload_name"] = top.pop("workload_name", name)
    doc["ngpus"] = trace.meta.world_size
    top.pop("ngpus", None)
    doc.update(top)
    if used_groups:
        doc["comm_groups"] = {}
        for gname in sorted(used_groups):
            pg = trace.meta.process_groups.get(gname)
            if pg is not None:
                doc["comm_groups"][gname] = list(pg.ranks)
    return doc


def write_astrasim_json(trace: Trace, outdir: str | os.PathLike, name: str = "trace",
                        enforce_ctrl: bool = True) -> list[Path]:
    """Write one ``<name>.<rank>.json`` per rank into ``outdir``; returns the paths (rank order).

    ``enforce_ctrl`` (default) also lists control dependencies in ``data_deps``, the only list
    ASTRA-sim's JSON feeder enforces (see the module docstring). All files appear or none.
    """
    outdir = Path(outdir)
    with OutputSet() as out:
        for rank in trace.ranks:
            doc = _rank_doc(trace, rank, name, enforce_ctrl)
            f = out.open(outdir / f"{name}.{rank}.json")
            try:
                f.write(orjson.dumps(doc))
            finally:
                f.close()
    return [outdir / f"{name}.{r}.json" for r in trace.ranks]
