"""A minimal Kineto reader following the graph contract of ``ettools.converters.kineto``.

Only for tests and the link bench while the real reader is not there: one node per complete
event; attrs ``cat``, ``ext_id``, ``rf_id`` (non-zero), ``correlation``, ``seq``; NEST edges child
→ direct parent per host thread, LAUNCH device op → runtime call (same correlation), ORDER per
thread/stream. No steps, no syncs, no communication metadata.
"""

from __future__ import annotations

from pathlib import Path

from ettools.graph import EdgeKind, GraphBuilder, NodeType, StringTable, Trace, TraceMeta
from ettools.io import load_json

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def read_kineto_standin(path: str | Path) -> Trace:
    """Read one Kineto JSON file (rank 0) into a Trace (see the module docstring)."""
    doc = load_json(path)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    t0 = min(e["ts"] for e in events)
    strings = StringTable()
    b = GraphBuilder(0, strings)
    events.sort(key=lambda e: (e["ts"], -e["dur"]))
    stacks: dict[tuple, list[tuple[float, int]]] = {}
    last: dict[str, int] = {}
    runtime_by_corr: dict[int, int] = {}
    launches: list[tuple[int, int]] = []
    for e in events:
        cat = e.get("cat", "")
        args = e.get("args") or {}
        device = cat in DEVICE_CATS
        res = f"stream {args.get('stream', e.get('tid'))}" if device else f"thread {e.get('tid')}"
        row = len(b)
        nid = b.add_node(e["name"], NodeType.COMP_NODE, start=e["ts"] - t0, dur=float(e["dur"]),
                         resource=res, is_cpu_op=0 if device else 1)
        b.set_attr(row, "cat", cat, "string_val")
        if "External id" in args:
            b.set_attr(row, "ext_id", int(args["External id"]), "int64_val")
        if args.get("Record function id"):
            b.set_attr(row, "rf_id", int(args["Record function id"]), "int64_val")
        if "correlation" in args:
            b.set_attr(row, "correlation", int(args["correlation"]), "int64_val")
            if cat == "cuda_runtime" or cat == "cuda_driver":
                runtime_by_corr[int(args["correlation"])] = nid
            elif device:
                launches.append((row, int(args["correlation"])))
        if "Sequence number" in args:
            b.set_attr(row, "seq", int(args["Sequence number"]), "int64_val")
        if res in last:
            b.add_dep(row, last[res], EdgeKind.ORDER)
        if not device:
            key = (e.get("pid"), e.get("tid"))
            st = stacks.setdefault(key, [])
            end = e["ts"] + e["dur"]
            while st and st[-1][0] <= e["ts"]:
                st.pop()
            if st:
                b.add_dep(row, st[-1][1], EdgeKind.NEST)
            st.append((end, nid))
            last[res] = nid
        else:
            last[res] = nid
    for row, corr in launches:
        r = runtime_by_corr.get(corr)
        if r is not None:
            b.add_dep(row, r, EdgeKind.LAUNCH)
    meta = TraceMeta(source="kineto-standin", device_properties=doc.get("deviceProperties") or [])
    return Trace(meta, {0: b.build()}, strings)
