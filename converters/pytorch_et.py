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

import re
from pathlib import Path

import numpy as np

from ettools.converters.pytorch_et_rank import SUPPORTED_SCHEMAS, read_et_rank  # noqa: F401  (re-exported)
from ettools.errors import TraceError
from ettools.gcpause import no_gc
from ettools.graph import NodeType, ProcessGroup, RankGraph, StringTable, Trace, TraceMeta

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


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

