"""Re-measure the host-cost table (``host_costs.json``) that emulated capture lays host time out
with: ``python -m ettools.replay.data.make_host_costs [--shared DIR]``.

From each real GPU Kineto trace below, on the main host thread: the leaf ``cpu_op`` events (no
other op inside them) that contain a kernel-launch call (their duration: dispatch + launch, as the
profiler measured it), the leaf ops without one, and the launch calls themselves. The table holds
the median over traces of each trace's median, and names the traces.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
from pathlib import Path

import numpy as np
import orjson

SOURCES = ["traces/hardware_pairs/*/h100.json.gz", "traces/hardware_pairs/*/mi300x.json.gz"]
_LAUNCH = ("cudaLaunchKernel", "cudaLaunchKernelExC", "hipLaunchKernel", "hipExtModuleLaunchKernel",
           "hipModuleLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")


def trace_medians(path: str) -> tuple[float, float, float]:
    """``(launching op µs, other op µs, launch call µs)`` medians of one trace."""
    d = orjson.loads(gzip.open(path).read())
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and e.get("tid") == e.get("pid")), key=lambda e: e["ts"])
    launches = sorted(e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and e.get("name") in _LAUNCH)
    lts = np.array(launches)
    launching, other = [], []
    for i, e in enumerate(ops):
        end = e["ts"] + e["dur"]
        if i + 1 < len(ops) and ops[i + 1]["ts"] < end:
            continue  # not a leaf
        n = np.searchsorted(lts, e["ts"])
        m = np.searchsorted(lts, end)
        (launching if m > n else other).append(e["dur"])
    calls = [e["dur"] for e in ev if e.get("cat") == "cuda_runtime" and e.get("name") in _LAUNCH]
    return float(np.median(launching)), float(np.median(other)), float(np.median(calls))


def main(argv: list[str] | None = None) -> int:
    """Measure and write the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    args = ap.parse_args(argv)
    files = sorted(f for pat in SOURCES for f in glob.glob(str(args.shared / pat)))
    if not files:
        print(f"no traces under {args.shared}")
        return 1
    per = np.array([trace_medians(f) for f in files])
    med = np.median(per, axis=0)
    table = {"launching_op_us": round(float(med[0]), 2), "other_op_us": round(float(med[1]), 2),
             "launch_call_us": round(float(med[2]), 2), "sync_us": round(float(med[2]), 2),
             "source": "medians over traces of each trace's median leaf cpu_op (with / without a kernel launch) and "
                       "launch call, main host thread, profiled with record_shapes",
             "traces": [str(Path(f).relative_to(args.shared)) for f in files]}
    out = Path(__file__).with_name("host_costs.json")
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
