"""Fidelity benchmark of the rewriter's timing: rewrites of the single-process sample captures to
2-rank plans, replayed, against the real 2-rank captures of the same model and plan.

Run: ``python tests/bench/bench_rewrite_timing.py [--recapture N]``.

Per plan (DDP, TP+SP, GPipe, 1F1B, MoE-EP; and batch 16 of the single capture) it prints the
replayed step time of the rewrite and its error against the bundled capture's replayed step time,
with three network models for the inserted communication:

* ``default``: the rewriter's first-order durations (gloo-like bus, :func:`ettools.scaler.edit.comm_time_us`);
* ``loo fit``: a network fitted (``ettools calibrate --network``) on every *other* bundled 2-rank
  capture — leave-one-out, so the plan's own collectives never inform its prediction;
* ``own fit``: a network fitted on the plan's own capture — the best a collective-cost model can do;
  what remains is host work the single-process capture does not contain.

``--recapture N`` (needs the ``capture`` extra, torch) first captures every scenario ``N`` more
times into a temporary folder, prints the spread (min / median / max) of the real step times
next to the bundled capture's — the noise floor any prediction is judged against on this machine —
and adds the errors against the median of those runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
CASES = {
    "ddp": ("single", {"dp": 2, "bucket_mb": 100}),
    "tp_sp": ("single", {"tp": 2, "sp": True}),
    "pp_gpipe": ("single", {"pp": 2, "schedule": "gpipe", "micro_batches": 4}),
    "pp_1f1b": ("single", {"pp": 2, "schedule": "1f1b", "micro_batches": 4}),
    "moe_ep": ("moe_single", {"ep": 2}),
    "single_b16": ("single", {"batch": 16}),
}
MULTI = ["ddp", "tp_sp", "pp_gpipe", "pp_1f1b", "moe_ep", "fsdp"]


def _pool(samples: dict, leave_out: str):
    from ettools.replay.netfit import CommSamples

    pool = CommSamples()
    for name, s in samples.items():
        if name == leave_out:
            continue
        for f in ("kinds", "steps", "volume", "time_us"):
            getattr(pool, f).extend(getattr(s, f))
    return pool


def fidelity(medians: dict[str, float] | None = None) -> None:
    """Print the rewrite-vs-capture table for the bundled captures (and, given ``medians`` of
    recaptured step times, the errors against those too)."""
    from ettools.formats import load_trace
    from ettools.replay import CommFit, replay_trace
    from ettools.replay.netfit import comm_samples
    from ettools.scaler import scale_trace

    traces = {n: load_trace([SAMPLES / n]).trace for n in {*CASES, *MULTI, "single", "moe_single"}}
    samples = {n: comm_samples(traces[n]) for n in MULTI}
    refs = {"bundled capture": {n: replay_trace(traces[n]).step_time_us for n in CASES}}
    if medians:
        refs[f"median of recaptures (x{RUNS[0]})"] = {n: medians[n] for n in CASES if n in medians}
    rows = {}
    for name, (src, kw) in CASES.items():
        rw = scale_trace(traces[src], **kw)
        cells = [replay_trace(rw).step_time_us]
        if name in samples:
            cells.append(replay_trace(rw, network=CommFit.from_samples(_pool(samples, name)).to_dict()).step_time_us)
            cells.append(replay_trace(rw, network=CommFit.from_samples(samples[name]).to_dict()).step_time_us)
        rows[name] = cells
    for label, ref_of in refs.items():
        print(f"\nrewrite of the single capture vs {label}")
        print(f"{'plan':11s} {'ref ms':>8s} {'default':>16s} {'loo fit':>16s} {'own fit':>16s}")
        for name, cells in rows.items():
            ref = ref_of.get(name)
            if ref is None:
                continue
            text = "".join(f" {c / 1000:7.2f} ({100 * (c - ref) / ref:+6.1f}%)" for c in cells)
            print(f"{name:11s} {ref / 1000:8.2f}{text}")


RUNS = [0]


def spread(n: int) -> dict[str, float]:
    """Capture every scenario ``n`` times, print the spread of the real step times and return
    their medians (µs) per scenario."""
    from ettools.capture import capture
    from ettools.formats import load_trace

    names = ["single", "single_b16", "moe_single", *MULTI]
    RUNS[0] = n
    medians: dict[str, float] = {}
    print(f"\n{'scenario':11s} {'bundled':>8s}   runs: min / median / max (ms), {n} captures each")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            times = []
            for i in range(n):
                out = Path(tmp) / f"{name}_{i}"
                res = capture([sys.executable, "-m", "sample_traces.train", name, "--steps", "6"], out,
                              steps=(6, 6), memory=True, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                if res.returncode != 0:
                    print(f"{name}: capture failed (exit {res.returncode})", file=sys.stderr)
                    break
                t = load_trace([out]).trace
                times.append(max(t.graphs[r].meta["steps"][0][2] - t.graphs[r].meta["steps"][0][1] for r in t.ranks))
            b = load_trace([SAMPLES / name]).trace
            bundled = max(b.graphs[r].meta["steps"][0][2] - b.graphs[r].meta["steps"][0][1] for r in b.ranks)
            if times:
                medians[name] = statistics.median(times)
                print(f"{name:11s} {bundled / 1000:8.2f}   {min(times) / 1000:6.2f} / "
                      f"{statistics.median(times) / 1000:6.2f} / {max(times) / 1000:6.2f}")
    return medians


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recapture", type=int, default=0, metavar="N",
                    help="also capture every scenario N times and print the spread of real step times")
    args = ap.parse_args()
    medians = spread(args.recapture) if args.recapture > 0 else None
    fidelity(medians)
    return 0


if __name__ == "__main__":
    sys.exit(main())
