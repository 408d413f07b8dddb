"""Measure each GPU's kernel-to-kernel gap (``kernel_gaps.json``) from real Kineto traces.

A GPU does not start a stream's next kernel the instant the previous one ends: even with the
queue full (eager launches ahead of the device, or a CUDA-graph replay) a small gap separates
back-to-back kernels. The Kineto reader measures it per trace (``stream_gap_us``: the median gap
between back-to-back ops of a stream whose next op was already queued). The op models predict
kernel durations without it, so the replay adds the target GPU's gap to every device op whose
duration it predicted (see ``replay/prepare.py``).

This script reads the real traces below (the project's own H100/H200 captures and the shared
real traces), identifies each one's GPU from its device properties, and writes the median of the
per-trace gaps per GPU preset. GPUs without a trace borrow the gap of the nearest measured GPU of
the same vendor (by preset order), and the file says which; presets of one architecture (the
A100 80GB and 40GB) pool their traces.

Run: ``python -m ettools.replay.data.make_kernel_gaps`` (from the repository root, with
``../shared`` beside it).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
GLOBS = [(ROOT / "sample_traces", "hf_h100/*.json.gz"), (ROOT / "sample_traces", "hf_h200/*.json.gz"),
         (ROOT / "sample_traces", "gpu_h100/*.json.gz"), (ROOT / "sample_traces", "gpu_h200/*.json.gz"),
         (SHARED, "hardware_pairs/*/*.json.gz"), (SHARED, "inference/*/*.json.gz"),
         (SHARED, "kineto/*/rank0.json.gz")]


def measure() -> dict:
    """Per-preset median kernel gap over the traces of :data:`GLOBS` that name their GPU."""
    from ettools.formats import load_trace
    from ettools.replay.devices import hardware_from_trace, presets

    per: dict[str, list[tuple[str, float]]] = {}
    for base, pattern in GLOBS:
        for f in sorted(base.glob(pattern)):
            try:
                loaded = load_trace([f])
            except Exception as e:  # noqa: BLE001 - a trace this reader refuses is skipped, and said
                print(f"skip {f}: {e}", file=sys.stderr)
                continue
            trace = getattr(loaded, "trace", loaded)
            hw = hardware_from_trace(trace)
            if "default" in str(hw.detected or "") or not hw.preset:
                continue
            key = hw.preset
            gaps = [g.meta.get("stream_gap_us") for g in trace.graphs.values()]
            gaps = [float(x) for x in gaps if x is not None]
            if gaps:
                per.setdefault(str(key), []).append((str(f.relative_to(base.parent)), statistics.median(gaps)))
    table = presets()
    out: dict = {"source": "median over real Kineto traces of the per-trace stream_gap_us (median gap between "
                           "back-to-back device ops of a stream whose next op was already queued); "
                           "make_kernel_gaps.py", "gpus": {}}
    # one chip, one gap: presets of one architecture (A100 80GB and 40GB) pool their traces
    def arch(k: str) -> tuple:
        m = table[k].get("match", {})
        return (str(m.get("vendor", "")), tuple(m.get("compute", ())) or k)

    for key in table:
        if key.startswith("_"):
            continue
        pooled = [item for k in per if arch(k) == arch(key) for item in per[k]]
        if pooled:
            vals = [v for _, v in pooled]
            out["gpus"][key] = {"gap_us": round(statistics.median(vals), 4), "traces": [t for t, _ in pooled],
                                "per_trace_us": [round(v, 4) for v in vals]}
    vendor = {k: str(table[k].get("match", {}).get("vendor", "")) for k in table if not k.startswith("_")}
    order = [k for k in table if not k.startswith("_")]
    for key in order:
        if key in out["gpus"]:
            continue
        same = [k for k in order if k in out["gpus"] and "borrowed_from" not in out["gpus"][k]
                and vendor[k] == vendor[key]]
        if not same:
            continue
        near = min(same, key=lambda k: abs(order.index(k) - order.index(key)))
        out["gpus"][key] = {"gap_us": out["gpus"][near]["gap_us"], "borrowed_from": near}
    return out


def main() -> None:
    """Write ``kernel_gaps.json`` beside this script."""
    data = measure()
    path = Path(__file__).with_name("kernel_gaps.json")
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    for k, v in data["gpus"].items():
        print(f"{k:>10}: {v['gap_us']:.4f} us " + (f"(borrowed from {v['borrowed_from']})" if "borrowed_from" in v
                                                  else f"({len(v['traces'])} traces)"))


if __name__ == "__main__":
    main()
