"""Per-rank summary of a trace: node counts by type, communication by collective type, time span.

This is the analysis behind ``ettools info`` (and the ``ranks`` object other commands print with
``--json``). All counting is vectorized over the graph's columns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ettools.graph import CollectiveType, NodeType, RankGraph, Trace

COMM_KEYS = [c.name for c in CollectiveType] + ["SEND", "RECV"]


def comm_table(g: RankGraph) -> dict[str, dict[str, int]]:
    """``{"ALL_REDUCE": {"count", "bytes"}, …, "SEND": …, "RECV": …}`` for one rank.

    Bytes are Chakra ``comm_size`` bytes (the per-rank buffer); nodes whose size is unknown add no
    bytes (they are counted in ``comm_unknown_size`` of :func:`rank_summary`). Types with no node are
    left out.
    """
    types = g.type
    sizes = np.where(g.comm_bytes >= 0, g.comm_bytes, 0)
    out: dict[str, dict[str, int]] = {}
    coll = types == NodeType.COMM_COLL_NODE
    if coll.any():
        ctype = g.comm_type[coll].astype(np.int64)
        csize = sizes[coll]
        known = ctype >= 0
        counts = np.bincount(ctype[known], minlength=len(CollectiveType))
        nbytes = np.bincount(ctype[known], weights=csize[known], minlength=len(CollectiveType))
        for c in CollectiveType:
            if counts[c]:
                out[c.name] = {"count": int(counts[c]), "bytes": int(nbytes[c])}
        if (~known).any():
            out["UNKNOWN"] = {"count": int((~known).sum()), "bytes": int(csize[~known].sum())}
    for key, t in (("SEND", NodeType.COMM_SEND_NODE), ("RECV", NodeType.COMM_RECV_NODE)):
        m = types == t
        if m.any():
            out[key] = {"count": int(m.sum()), "bytes": int(sizes[m].sum())}
    return out


def comm_missing_attrs(g: RankGraph) -> dict[str, int]:
    """How many comm nodes lack each attribute a consumer needs (a foreign file's defects).

    COMM_COLL nodes need ``comm_type``, ``comm_size`` and ``pg_name``; SEND/RECV need
    ``comm_size``, a peer and a tag. Attributes nobody lacks are left out.
    """
    t = g.type
    coll = t == NodeType.COMM_COLL_NODE
    p2p = (t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)
    counts = {
        "comm_type": int((coll & (g.comm_type < 0)).sum()),
        "comm_size": int(((coll | p2p) & (g.comm_bytes < 0)).sum()),
        "pg_name": int((coll & (g.comm_group < 0)).sum()),
        "peer": int((p2p & (g.comm_peer < 0)).sum()),
        "comm_tag": int((p2p & (g.comm_tag < 0)).sum()),
    }
    return {k: v for k, v in counts.items() if v}


def time_span(g: RankGraph) -> tuple[float, float] | None:
    """(first start, last end) in µs over nodes with times, or None when the graph has none."""
    start = g.start
    ok = ~np.isnan(start)
    if not ok.any():
        return None
    end = start + np.where(np.isnan(g.dur), 0.0, g.dur)
    return float(start[ok].min()), float(end[ok].max())


def rank_summary(g: RankGraph) -> dict[str, Any]:
    """The summary of one rank (see :func:`summarize`)."""
    counts = np.bincount(g.type, minlength=len(NodeType))
    by_type = {t.name: int(counts[t]) for t in NodeType if counts[t]}
    span = time_span(g)
    out: dict[str, Any] = {
        "nodes": len(g),
        "edges": g.num_edges,
        "dangling_deps": g.dangling_edges(),
        "by_type": by_type,
        # every collective type and SEND/RECV, zeros included, so scripts can index any key
        "comm": {k: {"count": 0, "bytes": 0} for k in COMM_KEYS} | comm_table(g),
        "comm_missing_attrs": comm_missing_attrs(g),
        # collectives and sends/recvs whose size the trace does not give (never counted as 0 bytes)
        "comm_unknown_size": int((np.isin(g.type, [NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE,
                                                  NodeType.COMM_RECV_NODE]) & (g.comm_bytes < 0)).sum()),
        "host_ops": int((g.is_cpu_op == 1).sum()),
        "device_ops": int((g.is_cpu_op == 0).sum()),
    }
    if span is not None:
        out["start_us"], out["end_us"] = span
        out["span_us"] = span[1] - span[0]
    steps = g.meta.get("steps")
    if steps:
        out["steps"] = [{"name": s[0], "start_us": float(s[1]), "end_us": float(s[2])} for s in steps]
    return out


def summarize(trace: Trace) -> dict[str, Any]:
    """Machine-readable summary: ``{"world_size", "process_groups", "ranks": {"<rank>": …}, "totals"}``."""
    ranks = {str(g.rank): rank_summary(g) for g in trace}
    totals: dict[str, Any] = {"nodes": 0, "by_type": {}, "comm": {}}
    for r in ranks.values():
        totals["nodes"] += r["nodes"]
        for k, v in r["by_type"].items():
            totals["by_type"][k] = totals["by_type"].get(k, 0) + v
        for k, v in r["comm"].items():
            t = totals["comm"].setdefault(k, {"count": 0, "bytes": 0})
            t["count"] += v["count"]
            t["bytes"] += v["bytes"]
    timed = {str(g.meta.get("durations", "")) for g in trace.graphs.values() if isinstance(getattr(g, "meta", None), dict)}
    gpus = sorted({str(g.meta.get("emulated_gpu") or "") for g in trace.graphs.values()
                   if isinstance(getattr(g, "meta", None), dict) and g.meta.get("emulated_gpu")})
    durations = "modelled" if "modelled" in timed else "rewritten" if "rewritten" in timed else "measured"
    return {
        "source": trace.meta.source,
        # what the node times are: measured by a profiler, modelled (emulated capture), rewritten (scale)
        "durations": durations,
        **({"emulated_gpu": gpus[0]} if gpus else {}),
        "world_size": trace.meta.world_size,
        "ranks_present": len(trace.graphs),
        "process_groups": {
            name: list(pg.ranks) for name, pg in sorted(trace.meta.process_groups.items())
        },
        "ranks": ranks,
        "totals": totals,
    }


def human_bytes(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
