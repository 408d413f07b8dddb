"""Resharding: change the size of a process group whose members all run the same program.

:func:`reshard` stamps out new ranks from existing ones (graph arrays shared, see
:mod:`ettools.scaler.mesh`) and resizes the group, for the two cases where "the same program on
more ranks" is well defined:

* the last axis a pass of this package added (``data_parallel``'s ``"dp"``, recorded in
  ``TraceMeta.extra["scaler"]["axes"]``): the ranks of replica 0 are the templates and the axis
  is rebuilt at the new size (DP 8 → 1,024);
* a captured trace whose collectives all use one group spanning every rank (a data-parallel
  capture, or a single rank): rank ``i`` of the result is a copy of input rank ``i mod W``.

Collective bytes per rank follow each collective's semantics with the global tensor fixed
(Chakra ``comm_size``, the per-rank buffer): ``ALL_REDUCE``, ``REDUCE_SCATTER`` (the full input),
``BROADCAST``, ``REDUCE`` and ``ALL_TO_ALL`` (the per-rank total) keep their size; ``ALL_GATHER``
and ``GATHER`` (the per-rank input of a fixed result) scale by ``old / new``; ``SCATTER`` likewise.
Tensor- and pipeline-parallel axes change the work of every rank: re-run those passes instead.
"""

from __future__ import annotations

import numpy as np

from ettools.graph import CollectiveType, NodeType, ProcessGroup, RankGraph, Trace, TraceMeta
from ettools.scaler.mesh import axes_of, axis_group_name, replicate, used_groups
from ettools.scaler.model import ScaleError
from ettools.scaler.proof import prove

_PER_RANK_SHARE = (int(CollectiveType.ALL_GATHER), int(CollectiveType.GATHER), int(CollectiveType.SCATTER))


def _resize_bytes(g: RankGraph, groups: set[str], old: int, new: int) -> RankGraph:
    """``g`` with the per-rank share of collectives in ``groups`` scaled by ``old / new``."""
    if old == new:
        return g
    ids = [g.strings.lookup(x) for x in groups]
    sel = (g.type == NodeType.COMM_COLL_NODE) & np.isin(g.comm_group, [i for i in ids if i >= 0]) & \
        np.isin(g.comm_type, _PER_RANK_SHARE) & (g.comm_bytes >= 0)
    if not sel.any():
        return g
    cb = g.comm_bytes.copy()
    cb[sel] = np.rint(cb[sel] * old / new).astype(np.int64)
    return g.replace(comm_bytes=cb)


def reshard(trace: Trace, size: int, group: str | None = None, check: bool = True) -> Trace:
    """``trace`` with its replicated axis (default: the last ``dp`` axis, else the world group) at ``size`` ranks."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    W = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)
    axes = axes_of(trace.meta)
    if axes and (group is None or group == axes[-1][0]):
        axis, old = axes[-1]
        if axis != "dp":
            raise ScaleError(f"the last axis is {axis!r}: reshard resizes data-parallel axes; re-run the "
                             f"{axis} pass at the new size instead")
        out = _reshard_axis(trace, axis, old, size, W)
    else:
        out = _reshard_world(trace, size, group, W)
    return prove(out, "reshard") if check else out


def _reshard_axis(trace: Trace, axis: str, old: int, size: int, W: int) -> Trace:
    inner = W // old
    templates: dict[int, RankGraph] = {}
    axis_groups = {axis_group_name(axis, r, inner) for r in range(inner)}
    done: dict[int, RankGraph] = {}
    for r in range(inner):
        g = trace.graphs.get(r)
        if g is None:
            raise ScaleError(f"rank {r} (a template of axis {axis!r}) is missing")
        t = done.get(id(g.columns["id"]))
        if t is None or t.comm_group is not g.comm_group:
            t = _resize_bytes(g, axis_groups, old, size)
            done[id(g.columns["id"])] = t
        templates[r] = t if t.rank == r else t.with_rank(r)
    meta = TraceMeta(world_size=inner, device_properties=list(trace.meta.device_properties),
                     source=trace.meta.source, extra=dict(trace.meta.extra))
    info = dict(meta.extra.get("scaler", {}))
    info["axes"] = list(info.get("axes", []))[:-1]
    meta.extra["scaler"] = info
    suffix = f"@{axis}"
    for name, pg in trace.meta.process_groups.items():
        if name in axis_groups or suffix in name:
            continue
        if all(x < inner for x in pg.ranks):
            meta.add_group(pg)
    return replicate(templates, meta, trace.strings, size, axis, inner)


def _reshard_world(trace: Trace, size: int, group: str | None, W: int) -> Trace:
    used = used_groups(trace.graphs)
    world = [n for n, pg in trace.meta.process_groups.items() if sorted(pg.ranks) == list(range(W))]
    if group is not None:
        pg = trace.meta.process_groups.get(group)
        if pg is None:
            raise ScaleError(f"process group {group!r} is not in the trace (groups: "
                             f"{', '.join(sorted(trace.meta.process_groups)) or 'none'})")
        if group not in world:
            raise ScaleError(f"process group {group!r} ({len(pg.ranks)} of {W} ranks) does not span the world: "
                             "only a group every rank belongs to can be resized by copying ranks")
        world = [group]
    others = used - set(world)
    if others:
        raise ScaleError(f"collectives use groups {sorted(others)} besides the world group: this trace is not "
                         "a pure data-parallel one; reshard cannot copy its ranks")
    for g in trace.graphs.values():
        if (np.isin(g.type, [int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE)])).any():
            raise ScaleError(f"rank {g.rank} has send/recv nodes: reshard copies ranks of a data-parallel trace only")
    missing = [r for r in range(W) if r not in trace.graphs]
    if missing:
        raise ScaleError(f"ranks {missing[:8]} of {W} are missing: reshard copies every rank")
    meta = TraceMeta(world_size=size, device_properties=list(trace.meta.device_properties),
                     source=trace.meta.source, extra=dict(trace.meta.extra))
    for name, pg in trace.meta.process_groups.items():
        if name in world or sorted(pg.ranks) == list(range(W)):
            meta.add_group(ProcessGroup(name, tuple(range(size)), pg.desc, pg.backend))
    templates = {r: _resize_bytes(trace.graphs[r], set(world), W, size) for r in range(W)}
    graphs = {i: templates[i % W].with_rank(i) for i in range(size)}
    return Trace(meta, graphs, trace.strings)


__all__ = ["reshard"]
