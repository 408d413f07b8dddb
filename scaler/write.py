"""Writing rewritten traces fast: work once per distinct graph, not once per rank.

Rewritten traces of many ranks are mostly copies: 1,024 data-parallel replicas share every array
(:mod:`ettools.scaler.mesh`), ranks of one pipeline stage differ only in their communication
columns. :func:`replayable` converts to completion semantics once per distinct graph structure
and patches the communication columns of the ranks that differ; :func:`write_chakra_shared`
encodes each distinct graph once with the strict Chakra encoder and writes the same bytes to every
rank sharing it (so writing is I/O-bound). Both give exactly what :func:`ettools.convert.replayable_trace`
and :func:`ettools.converters.chakra.write_chakra` give rank by rank (tested byte for byte).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ettools.convert import has_containment
from ettools.graph import COMM_NODE_TYPES, RankGraph, Trace

_STRUCT_COLS = ("id", "name", "type", "start", "dur", "resource", "is_cpu_op", "num_ops", "tensor_size",
                "comm_type", "comm_bytes", "comm_tag")


_CACHE_BYTES = 1 << 29  # encodings kept for ranks that share a graph


def _structure(g: RankGraph) -> tuple:
    """Identity of everything but the group/peer columns (valid while the graphs live)."""
    return tuple(id(g.columns[c]) for c in _STRUCT_COLS) + (id(g.dep_ptr), id(g.dep_id), id(g.dep_kind),
                                                            id(g.attrs.get("cat")))


def _full(g: RankGraph) -> tuple:
    attrs = tuple((k, id(v)) for k, v in sorted(g.attrs.items()))
    return _structure(g) + (id(g.comm_group), id(g.comm_peer), attrs, id(g.meta.get("chakra_metadata")))


def replayable(trace: Trace) -> Trace:
    """Every rank in completion semantics (:func:`ettools.replayable.to_replayable`), once per structure."""
    if not has_containment(trace):
        return trace
    from ettools.replayable import to_replayable

    by_struct: dict[tuple, tuple[RankGraph, RankGraph]] = {}
    by_full: dict[tuple, RankGraph] = {}
    graphs: dict[int, RankGraph] = {}
    for r in trace.ranks:
        g = trace.graphs[r]
        fk = _full(g)
        hit = by_full.get(fk)
        if hit is not None:
            graphs[r] = hit.with_rank(r)
            continue
        sk = _structure(g)
        base = by_struct.get(sk)
        if base is None:
            out = to_replayable(g)
            by_struct[sk] = (g, out)
        else:
            src, conv = base
            out = _patch_comm(conv, src, g)
        out.rank = r
        by_full[fk] = out
        graphs[r] = out
    return Trace(trace.meta, graphs, trace.strings)


def _patch_comm(conv: RankGraph, src: RankGraph, g: RankGraph) -> RankGraph:
    """``conv`` (the replayable form of ``src``) with the group/peer columns of ``g`` (same structure as ``src``)."""
    rows_g = np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES]))
    rows_c = conv.rows_of(g.id[rows_g])
    ok = rows_c >= 0
    cg = conv.comm_group
    cp = conv.comm_peer
    if g.comm_group is not src.comm_group:
        cg = cg.copy()
        cg[rows_c[ok]] = g.comm_group[rows_g[ok]]
    if g.comm_peer is not src.comm_peer:
        cp = cp.copy()
        cp[rows_c[ok]] = g.comm_peer[rows_g[ok]]
    return conv.replace(comm_group=cg, comm_peer=cp)


def write_chakra_shared(trace: Trace, outdir: Path, name: str = "trace") -> list[Path]:
    """Strict Chakra files (``<name>.<rank>.et`` + ``comm_group.json``), each distinct graph encoded once.

    The trace must already be in completion semantics (see :func:`replayable`) and have passed the
    structural proof (group membership is not re-checked per rank). All files appear or none.
    """
    from ettools.converters import chakra_wire as w
    from ettools.converters.chakra import (
        COMM_GROUP_FILE,
        WriteStats,
        _StringField,
        comm_group_json,
        encode_rank,
        group_keys,
    )
    from ettools.io import OutputSet
    from ettools.progress import progress

    outdir = Path(outdir)
    keys = group_keys(trace.meta, True)
    stats = WriteStats()
    name_field = _StringField(trace.strings, w.tag(2, w.WT_LEN))
    cache: dict[tuple, bytes] = {}
    out = OutputSet()
    try:
        for r in progress(trace.ranks, "writing Chakra", total=len(trace.ranks), unit="rank"):
            g = trace.graphs[r]
            k = _full(g)
            data = cache.get(k)
            if data is None:
                parts = encode_rank(g, trace.meta, keys, True, stats, name_field)
                data = b"".join(p.tobytes() if isinstance(p, np.ndarray) else bytes(p) for p in parts)
                if sum(len(v) for v in cache.values()) > _CACHE_BYTES:
                    cache.clear()
                cache[k] = data
            f = out.open(outdir / f"{name}.{r}.et", compress=False)
            try:
                f.write(data)
            finally:
                f.close()
        f = out.open(outdir / COMM_GROUP_FILE, compress=False)
        try:
            f.write(comm_group_json(trace.meta, keys))
        finally:
            f.close()
        return out.commit()
    except BaseException:
        out.abort()
        raise


__all__ = ["replayable", "write_chakra_shared"]
