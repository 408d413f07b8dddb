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

import itertools
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.filenames import rank_from_name
from ettools.graph import (
    AttrColumn,
    EdgeKind,
    GraphBuilder,
    NodeType,
    ProcessGroup,
    RankGraph,
    Trace,
    new_trace,
)
from ettools.io import OutputSet, json_bytes, load_json

_KNOWN = {"Id", "Name", "NodeType", "ctrlDeps", "data_deps", "runtime", "is_cpu_op", "tensor_size",
          "comm_type", "comm_priority", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name",
          "num_ops"}
_EXTRA_KEYS = "astrasim_json_keys"  # RankGraph.meta: attribute names read from unknown node keys
_SKIP_TYPES = (int(NodeType.METADATA_NODE), int(NodeType.INVALID_NODE))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _rank_of(path: Path) -> int:
    r = rank_from_name(path)
    return 0 if r is None else r


def read_astrasim_json(path: str | os.PathLike, rank: int | None = None) -> Trace:
    """Read one ASTRA-sim JSON workload file (plain or gzip) as a one-rank trace.

    The rank is ``rank`` if given, else the number in the file name (``trace.3.json`` → 3), else 0.
    Raises :class:`TraceError` naming the file and the node index on malformed input.
    """
    path = Path(path)
    doc = load_json(path, items_of="workload_graph")
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

    g = _fast_graph(rank, strings, nodes)
    if g is None:
        g = _checked_graph(path, rank, strings, nodes)  # names the first bad node
    trace.graphs[rank] = g
    return trace


_INT_FIELDS = ("num_ops", "tensor_size", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag",
               "comm_priority")


def _types(vals: list) -> set:
    return set(map(type, vals))


def _fast_graph(rank: int, strings: Any, nodes: list) -> RankGraph | None:
    """Columns straight from the node list when every node is well formed; None otherwise.

    Checks the same things as :func:`_checked_graph`, a column at a time with C-level idioms
    (``map(type, …)``, ``min``); anything unusual (a string NodeType, a bad value) returns None so
    the checked path reports or handles it.
    """
    n = len(nodes)
    if not n or _types(nodes) != {dict}:
        return None
    keys = set().union(*nodes)
    none = type(None)

    def get(k: str, default: Any = None) -> list:
        return [nd.get(k, default) for nd in nodes] if k in keys else [default] * n

    ids = get("Id")
    if _types(ids) != {int} or min(ids) < 0 or len(set(ids)) != n:
        return None
    types = get("NodeType", 4)
    if _types(types) != {int} or min(types) < 0 or max(types) > 7:
        return None
    names = get("Name", "")
    if _types(names) != {str}:
        return None
    runtime = get("runtime")
    if not _types(runtime) <= {int, float, none}:
        return None
    dur = np.array([np.nan if x is None else x for x in runtime], np.float64)
    if (dur < 0).any():
        return None
    cpu = get("is_cpu_op")
    if not _types(cpu) <= {bool, int, none}:
        return None
    pg = get("pg_name")
    if not _types(pg) <= {str, none}:
        return None
    ints: dict[str, list] = {}
    for k in _INT_FIELDS:
        if k in keys:
            vals = get(k)
            if not _types(vals) <= {int, none}:
                return None
            ints[k] = vals
    dep_lists = {}
    for k in ("data_deps", "ctrlDeps"):
        vals = get(k)
        if not _types(vals) <= {list, none}:
            return None
        flat = list(itertools.chain.from_iterable(v for v in vals if v))
        if flat and (_types(flat) != {int} or min(flat) < 0):
            return None
        dep_lists[k] = vals
    extra = keys - _KNOWN

    intern = strings.intern
    cols: dict[str, np.ndarray] = {
        "id": np.array(ids, np.uint64),
        "name": np.array([intern(x) for x in names], np.int32),
        "type": np.array(types, np.uint8),
        "dur": dur,
        "is_cpu_op": np.array([-1 if x is None else (1 if x else 0) for x in cpu], np.int8),
        "comm_group": np.array([-1 if x is None else intern(x) for x in pg], np.int32),
    }

    def col(k: str) -> np.ndarray:
        v = ints.get(k)
        return np.full(n, -1, np.int64) if v is None else np.array([-1 if x is None else x for x in v], np.int64)

    cols["num_ops"], cols["tensor_size"], cols["comm_type"] = col("num_ops"), col("tensor_size"), col("comm_type")
    cols["comm_bytes"], cols["comm_tag"] = col("comm_size"), col("comm_tag")
    t = cols["type"]
    cols["comm_peer"] = np.where(t == NodeType.COMM_SEND_NODE, col("comm_dst"),
                                 np.where(t == NodeType.COMM_RECV_NODE, col("comm_src"), -1))
    # dependencies: data_deps not also in ctrlDeps are DATA, then ctrlDeps as CTRL
    counts = np.zeros(n, np.int64)
    dep_id: list[int] = []
    dep_kind: list[int] = []
    for i, (dl, cl) in enumerate(zip(dep_lists["data_deps"], dep_lists["ctrlDeps"])):
        if dl:
            if cl:
                cs = set(cl)
                dl = [d for d in dl if d not in cs]
            dep_id += dl
            dep_kind += [0] * len(dl)
        if cl:
            dep_id += cl
            dep_kind += [int(EdgeKind.CTRL)] * len(cl)
        counts[i] = (len(dl) if dl else 0) + (len(cl) if cl else 0)
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=dep_ptr[1:])
    attrs: dict[str, AttrColumn] = {}
    prio = ints.get("comm_priority")
    if prio is not None:
        rows = [i for i, x in enumerate(prio) if x is not None]
        attrs["comm_priority"] = AttrColumn("int32_val", np.array(rows, np.int64), [prio[i] for i in rows])
    extra_keys = []
    for k in sorted(extra):
        rows, vals, kinds = [], [], set()
        for i, nd in enumerate(nodes):
            if k in nd:
                kind = _attr_kind(nd[k])
                if kind is not None:
                    rows.append(i)
                    vals.append(nd[k])
                    kinds.add(kind)
        if len(kinds) > 1:
            return None  # mixed value types under one key: let the checked path decide
        if rows:
            attrs[k] = AttrColumn(kinds.pop(), np.array(rows, np.int64), vals)
            extra_keys.append(k)
    return RankGraph(rank, strings, cols, dep_ptr, np.array(dep_id, np.uint64), np.array(dep_kind, np.uint8),
                     attrs, meta={_EXTRA_KEYS: extra_keys} if extra_keys else {})


def _checked_graph(path: Path, rank: int, strings: Any, nodes: list) -> RankGraph:
    """The node list read one node at a time, raising :class:`TraceError` at the first bad node."""
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
    return b.build(meta={_EXTRA_KEYS: sorted(extra_keys)} if extra_keys else None)


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


def _csr_lists(owner: np.ndarray, values: np.ndarray, rows: np.ndarray, n: int) -> list[list[int]]:
    """Per row in ``rows``, the ``values`` whose ``owner`` is that row (stable), once each."""
    o = np.argsort(owner, kind="stable")
    owner, values = owner[o], values[o]
    # drop repeats of the same id on the same row (the feeder waits for each listed id once)
    if len(owner) > 1:
        key = np.lexsort((values, owner))
        dup_sorted = np.zeros(len(owner), bool)
        dup_sorted[1:] = (owner[key][1:] == owner[key][:-1]) & (values[key][1:] == values[key][:-1])
        if dup_sorted.any():
            # keep the first occurrence in stored order: among equal (owner, value), the smallest index
            first = np.ones(len(owner), bool)
            k2 = np.lexsort((np.arange(len(owner)), values, owner))
            same = np.zeros(len(owner), bool)
            same[1:] = (owner[k2][1:] == owner[k2][:-1]) & (values[k2][1:] == values[k2][:-1])
            first[k2[same]] = False
            owner, values = owner[first], values[first]
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    vals = values.tolist()
    p = ptr.tolist()
    return [vals[p[r]:p[r + 1]] for r in rows.tolist()]


def _rank_doc(trace: Trace, rank: int, name: str, enforce_ctrl: bool) -> dict[str, Any]:
    g = trace.graphs[rank]
    c = g.columns
    n = len(g)
    types = c["type"]
    keep = ~np.isin(types, _SKIP_TYPES)
    rows = np.flatnonzero(keep)
    src, dst, kind = g.edge_rows()
    present = src >= 0
    # an edge is written unless it points at a node left out (METADATA/INVALID)
    write = ~present | keep[np.maximum(src, 0)]
    is_data = kind == EdgeKind.DATA
    in_data = write & (is_data | (enforce_ctrl & present))
    in_ctrl = write & ~is_data
    dep_id = g.dep_id
    data = _csr_lists(dst[in_data], dep_id[in_data], rows, n)
    ctrl = _csr_lists(dst[in_ctrl], dep_id[in_ctrl], rows, n)
    dur = c["dur"][rows]
    runtime = np.where(np.isfinite(dur), np.round(np.nan_to_num(dur)), 0).astype(np.int64)
    nodes: list[dict[str, Any]] = [
        {"Id": i, "Name": nm, "NodeType": t, "ctrlDeps": cl, "data_deps": dl, "runtime": rt, "is_cpu_op": cp}
        for i, nm, t, cl, dl, rt, cp in zip(
            c["id"][rows].tolist(), [g.names()[r] for r in rows.tolist()] if len(rows) < n else g.names(),
            types[rows].tolist(), ctrl, data, runtime.tolist(), (c["is_cpu_op"][rows] == 1).tolist())
    ]
    # optional fields, each over the rows that carry it (positions k index ``nodes``)
    t = types[rows]
    coll = t == NodeType.COMM_COLL_NODE
    send = t == NodeType.COMM_SEND_NODE
    recv = t == NodeType.COMM_RECV_NODE
    comm = coll | send | recv

    def put(key: str, mask: np.ndarray, values: np.ndarray) -> None:
        ks = np.flatnonzero(mask)
        for k, v in zip(ks.tolist(), values[ks].tolist()):
            nodes[k][key] = v

    ctype, cbytes = c["comm_type"][rows], c["comm_bytes"][rows]
    peer, tag = c["comm_peer"][rows], c["comm_tag"][rows]
    put("comm_type", coll & (ctype >= 0), ctype)
    gid = c["comm_group"][rows]
    used_groups: set[str] = set()
    for k in np.flatnonzero(coll & (gid >= 0)).tolist():
        gname = g.strings[int(gid[k])]
        nodes[k]["pg_name"] = gname
        used_groups.add(gname)
    me = np.full(len(rows), rank, np.int64)
    has_peer = (send | recv) & (peer >= 0)
    put("comm_src", has_peer, np.where(send, me, peer))
    put("comm_dst", has_peer, np.where(send, peer, me))
    put("comm_tag", (send | recv) & (tag >= 0), tag)
    put("comm_size", comm & (cbytes >= 0), cbytes)
    pos = np.full(n, -1, np.int64)
    pos[rows] = np.arange(len(rows))
    prio = g.attr("comm_priority")
    if prio is not None:
        for r, v in zip(prio.rows.tolist(), prio.values):
            k = int(pos[r])
            if k >= 0 and comm[k]:
                nodes[k]["comm_priority"] = int(v)
    nops = c["num_ops"][rows]
    put("num_ops", ~comm & (nops >= 0), nops)
    tsize = c["tensor_size"][rows]
    put("tensor_size", tsize >= 0, tsize)
    for key in g.meta.get(_EXTRA_KEYS, []):
        col = g.attrs.get(key)
        if col is None:
            continue
        for r, v in zip(col.rows.tolist(), col.values):
            k = int(pos[r])
            if k >= 0:
                nodes[k][key] = v
    top = dict(trace.meta.extra.get("astrasim_json", {}))
    doc: dict[str, Any] = {"workload_graph": nodes}
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
                f.write(json_bytes(doc, outdir / f"{name}.{rank}.json"))
            finally:
                f.close()
    return [outdir / f"{name}.{r}.json" for r in trace.ranks]
