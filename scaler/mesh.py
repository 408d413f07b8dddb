"""Ranks of a rewritten trace: each pass adds one mesh axis as the slowest-varying rank digit.

A pass turns every rank ``r`` of a ``W``-rank input into ``n`` ranks ``d·W + r`` (``d`` the index
along the new axis) with :func:`replicate`. Consequences, relied on by every pass and by
:func:`ettools.scaler.reshard.reshard`:

* composing ``tensor_parallel`` → ``pipeline_parallel`` → ``data_parallel`` numbers ranks
  ``((d·pp) + p)·tp + t`` (TP neighbours adjacent, DP slowest);
* the new axis's process group of input rank ``r`` is named ``"<axis>"`` when the input has one
  rank, else ``"<axis><r>"``; it is the same for every replica, so template graphs name it
  directly;
* a process group ``G`` of the input appears once per replica: ``G`` for ``d = 0``, ``G@<axis><d>``
  for the others (only groups that some communication node uses are replicated); send/recv peers
  ``p`` become ``d·W + p``;
* ``TraceMeta.extra["scaler"]["axes"]`` lists ``[axis, size]`` pairs, fastest first.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ettools.graph import COMM_NODE_TYPES, ProcessGroup, RankGraph, Trace, TraceMeta
from ettools.scaler.edit import Stamper


def axis_group_name(axis: str, rank: int, world: int) -> str:
    """Name of the new axis's group containing input rank ``rank`` of a ``world``-rank input."""
    return axis if world == 1 else f"{axis}{rank}"


def used_groups(graphs: Mapping[int, RankGraph]) -> set[str]:
    """Names of the process groups some communication node of ``graphs`` uses."""
    seen: set[int] = set()
    done: set[int] = set()
    names: set[str] = set()
    for g in graphs.values():
        if id(g.comm_group) in done:
            continue
        done.add(id(g.comm_group))
        ids = np.unique(g.comm_group[np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])])
        for i in ids.tolist():
            if i >= 0 and i not in seen:
                seen.add(i)
                names.add(g.strings[i])
    return names


def shift_groups(meta: TraceMeta, new_meta: TraceMeta, used: set[str], axis: str, d: int, W: int,
                 skip: set[str] = frozenset()) -> dict[str, str]:
    """Register the input's groups for copy ``d`` of ``W`` ranks along ``axis``; returns old → new names.

    Copy 0 keeps the groups as they are; copy ``d > 0`` gets ``<name>@<axis><d>`` with every member
    shifted by ``d·W`` (only groups some template uses). Groups in ``skip`` are left out.
    """
    gmap: dict[str, str] = {}
    for name, pg in meta.process_groups.items():
        if name in skip:
            continue
        if d == 0:
            new_meta.add_group(pg)
            continue
        if name not in used:
            continue
        nm = f"{name}@{axis}{d}"
        new_meta.add_group(ProcessGroup(nm, tuple(d * W + r for r in pg.ranks), pg.desc, pg.backend))
        gmap[name] = nm
    return gmap


def replicate(templates: Mapping[int, RankGraph], meta: TraceMeta, strings, n: int, axis: str,
              world: int | None = None) -> Trace:
    """``n`` replicas of the ``W`` template ranks along a new slowest axis ``axis`` (see the module doc).

    ``templates`` maps input rank → graph (already containing the new axis's communication, named
    with :func:`axis_group_name`); ``meta`` is the input's metadata. Arrays are shared: replica
    ``d`` of rank ``r`` differs from the template only in the group/peer columns it must re-map.
    """
    W = world if world is not None else max(meta.world_size, max(templates, default=-1) + 1)
    if sorted(templates) != list(range(W)):
        raise ValueError(f"replicate needs ranks 0..{W - 1}, got {sorted(templates)[:8]}")
    new_meta = TraceMeta(world_size=W * n, device_properties=list(meta.device_properties),
                         source=meta.source, extra=dict(meta.extra))
    used = used_groups(templates)
    axis_groups = {axis_group_name(axis, r, W) for r in range(W)}
    stamper = Stamper()
    graphs: dict[int, RankGraph] = {}
    for d in range(n):
        gmap = shift_groups(meta, new_meta, used, axis, d, W, skip=axis_groups)
        pmap = {p: d * W + p for p in range(W)} if d else None
        for r, t in templates.items():
            graphs[d * W + r] = stamper.stamp(t, d * W + r, gmap or None, pmap)
    for r in range(W):
        name = axis_group_name(axis, r, W)
        new_meta.process_groups.pop(name, None)
        new_meta.add_group(ProcessGroup(name, tuple(d * W + r for d in range(n)), axis, ""))
    info = dict(new_meta.extra.get("scaler", {}))
    info["axes"] = [*info.get("axes", []), [axis, n]]
    new_meta.extra["scaler"] = info
    return Trace(new_meta, graphs, strings)


def axes_of(meta: TraceMeta) -> list[tuple[str, int]]:
    """The mesh axes recorded by earlier passes, fastest first (``[]`` for a captured trace)."""
    return [(a, int(s)) for a, s in meta.extra.get("scaler", {}).get("axes", [])]


__all__ = ["axes_of", "axis_group_name", "replicate", "used_groups"]
