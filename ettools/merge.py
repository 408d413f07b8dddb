"""Combine traces read separately (one file per rank) into one trace with one string table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ettools.graph import RankGraph, StringTable, TensorTable, Trace, TraceMeta


def reintern(g: RankGraph, strings: StringTable) -> RankGraph:
    """``g`` with every interned column translated into ``strings`` (arrays copied only if needed)."""
    if g.strings is strings:
        return g
    table = np.array([strings.intern(s) for s in g.strings._strings] + [-1], np.int32)

    def tr(ids: np.ndarray) -> np.ndarray:
        # -1 (absent) maps to the sentinel slot at the end of the table
        return table[np.where(ids < 0, len(table) - 1, ids)]

    cols = dict(g.columns)
    for c in ("name", "resource", "comm_group"):
        cols[c] = tr(cols[c])
    t = g.tensors
    tensors = replace(t, dtype=tr(t.dtype), device=tr(t.device)) if len(t) else TensorTable()
    out = RankGraph(
        g.rank, strings, cols, g.dep_ptr, g.dep_id, g.dep_kind, dict(g.attrs), tensors,
        g.in_ptr, g.in_tensor, g.out_ptr, g.out_tensor, dict(g.meta),
    )
    return out


def merge_ranks(parts: list[tuple[int, Trace]]) -> Trace:
    """One trace from ``(rank, trace)`` pairs, each holding a single rank graph.

    The rank given overrides the one the part was read with. Process groups are united (the
    same name with other members is an error); the world size is the largest known.
    """
    strings = StringTable()
    meta = TraceMeta(world_size=1)
    graphs: dict[int, RankGraph] = {}
    sources = []
    for rank, part in parts:
        if len(part.graphs) != 1:
            raise ValueError(f"merge_ranks expects one rank per part, got {len(part.graphs)}")
        (g,) = part.graphs.values()
        if rank in graphs:
            raise ValueError(f"rank {rank} given twice")
        g = reintern(g, strings)
        g.rank = rank
        graphs[rank] = g
        for pg in part.meta.process_groups.values():
            meta.add_group(pg)
        meta.world_size = max(meta.world_size, part.meta.world_size, rank + 1)
        if not meta.device_properties and part.meta.device_properties:
            meta.device_properties = part.meta.device_properties
        sources.append(part.meta.source)
        for k, v in part.meta.extra.items():
            meta.extra.setdefault(k, v)
    meta.source = sources[0] if len(set(sources)) == 1 else ",".join(sorted(set(sources)))
    return Trace(meta, graphs, strings)
