"""Regenerate ``sample_traces/validate_example.png``: the report overview of a sample capture validated
against an edited copy of itself (one reduce-scatter dropped on rank 1, every all-gather's size
doubled on rank 0). Run from the repository root: ``python sample_traces/validate_example.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ettools.formats import load_trace
from ettools.graph import CollectiveType, NodeType, Trace
from ettools.io import atomic_write
from ettools.validate import validate
from ettools.validate_report import overview_png

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Build the edited candidate, validate, write the PNG."""
    ref = load_trace([ROOT / "sample_traces" / "tp_sp"]).trace
    graphs = dict(ref.graphs)
    g1 = graphs[1]
    rs = np.flatnonzero((g1.type == NodeType.COMM_COLL_NODE) & (g1.comm_type == CollectiveType.REDUCE_SCATTER))
    keep = np.ones(len(g1), bool)
    keep[rs[3]] = False
    graphs[1] = g1.select(keep)
    g0 = graphs[0]
    ag = (g0.comm_type == CollectiveType.ALL_GATHER) & (g0.comm_bytes >= 0)
    graphs[0] = g0.replace(comm_bytes=np.where(ag, 2 * g0.comm_bytes, g0.comm_bytes))
    cand = Trace(ref.meta, graphs, ref.strings)
    res = validate(ref, cand, reference_name="sample_traces/tp_sp", candidate_name="edited copy")
    png = overview_png(res, dpi=80)
    assert png is not None, "matplotlib is needed: pip install matplotlib"
    out = ROOT / "sample_traces" / "validate_example.png"
    with atomic_write(out) as f:
        f.write(png)
    print(f"{out}: {len(png):,} bytes; errors {res.errors}")


if __name__ == "__main__":
    main()
