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
  what remains is host work the single-process capture does not contain;
* ``measured``: this machine's gloo collectives measured in the same run
  (``ettools calibrate --network --measure gloo --ranks 2``: every kind at 1 KiB – 16 MiB, like
  nccl-tests) — a network that owes nothing to any capture.

``--recapture N`` (needs the ``capture`` extra, torch) then captures every scenario ``N`` more
times, six steps each, into a temporary folder and prints the spread (min / median / max) of the
real step times next to the bundled capture's — the noise floor any prediction is judged against
on this machine. Interference only ever adds time, so it then compares like with like at the low
end: the fastest captured step of the single-process run, rewritten, against the fastest captured
step of each 2-rank plan.
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


def _step_times(trace) -> list[float]:
    """Per captured step: its time (µs) on the slowest rank."""
    per = [[e - b for _, b, e in trace.graphs[r].meta["steps"]] for r in trace.ranks]
    return [max(col) for col in zip(*per)]


def measured_network() -> dict | None:
    """This machine's gloo collectives on 2 processes, fitted like measured NCCL tables (None
    without torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from ettools.collbench import measure_collectives
    from ettools.replay.netfit import fit_nccl_tables, read_nccl_tables

    with tempfile.TemporaryDirectory() as tmp:
        measure_collectives("gloo", 2, Path(tmp), reps=20)
        return fit_nccl_tables(read_nccl_tables(tmp), source="gloo, 2 processes, this machine").to_dict()


def fidelity(sources: dict | None = None, refs: dict[str, float] | None = None, label: str = "",
             measured: dict | None = None) -> None:
    """Print the rewrite-vs-capture table: rewrites of ``sources`` (default: the bundled single
    captures) against ``refs`` step times (default: the bundled 2-rank captures, replayed);
    ``measured``: a network measured on this machine, a fourth column."""
    from ettools.formats import load_trace
    from ettools.replay import CommFit, replay_trace
    from ettools.replay.netfit import comm_samples
    from ettools.scaler import scale_trace

    traces = {n: load_trace([SAMPLES / n]).trace for n in {*CASES, *MULTI, "single", "moe_single"}}
    samples = {n: comm_samples(traces[n]) for n in MULTI}
    if refs is None:
        refs = {n: replay_trace(traces[n]).step_time_us for n in CASES}
        label = "the bundled captures"
    src_of = sources or {n: traces[n] for n in ("single", "moe_single")}
    print(f"\nrewrite of the single-process capture vs {label}")
    print(f"{'plan':11s} {'ref ms':>8s} {'default':>16s} {'loo fit':>16s} {'own fit':>16s}"
          + (f" {'measured':>16s}" if measured else ""))
    for name, (src, kw) in CASES.items():
        ref = refs.get(name)
        if ref is None:
            continue
        rw = scale_trace(src_of[src], **kw)
        cells = [replay_trace(rw).step_time_us]
        if name in samples:
            cells.append(replay_trace(rw, network=CommFit.from_samples(_pool(samples, name)).to_dict()).step_time_us)
            cells.append(replay_trace(rw, network=CommFit.from_samples(samples[name]).to_dict()).step_time_us)
            if measured:
                cells.append(replay_trace(rw, network=measured).step_time_us)
        text = "".join(f" {c / 1000:7.2f} ({100 * (c - ref) / ref:+6.1f}%)" for c in cells)
        print(f"{name:11s} {ref / 1000:8.2f}{text}")


FIRST, LAST = 3, 8  # steps recorded per recapture (1-2 warm up)


def recapture(n: int, tmp: Path) -> tuple[dict, dict[str, float]]:
    """Capture every scenario ``n`` times (steps FIRST..LAST each), print the spread of the real
    step times, and return the fastest step of the single-process scenarios (as traces of that
    one step) and the fastest step time (µs) of every scenario."""
    from ettools.capture import capture
    from ettools.formats import load_trace

    names = ["single", "single_b16", "moe_single", *MULTI]
    k = LAST - FIRST + 1
    fastest_trace: dict = {}
    fastest: dict[str, float] = {}
    print(f"\n{'scenario':11s} {'bundled':>8s}   {n} runs x {k} steps (ms): min / median / max; median of run means")
    for name in names:
        times: list[float] = []
        best = (float("inf"), None, 0)
        means = []
        for i in range(n):
            out = tmp / f"{name}_{i}"
            res = capture([sys.executable, "-m", "sample_traces.train", name, "--steps", str(LAST)], out,
                          steps=(FIRST, LAST), memory=True, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if res.returncode != 0:
                print(f"{name}: capture failed (exit {res.returncode})", file=sys.stderr)
                break
            st = _step_times(load_trace([out]).trace)
            times.extend(st)
            means.append(statistics.mean(st))
            j = min(range(len(st)), key=st.__getitem__)
            if st[j] < best[0]:
                best = (st[j], out, FIRST + j)
        if not times:
            continue
        fastest[name] = best[0]
        if name in ("single", "moe_single"):
            fastest_trace[name] = load_trace([best[1]], steps=str(best[2])).trace
        bundled = max(_step_times(load_trace([SAMPLES / name]).trace))
        print(f"{name:11s} {bundled / 1000:8.2f}   {min(times) / 1000:6.2f} / {statistics.median(times) / 1000:6.2f} / "
              f"{max(times) / 1000:6.2f}; {statistics.median(means) / 1000:6.2f}")
    return fastest_trace, fastest


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recapture", type=int, default=0, metavar="N",
                    help="also capture every scenario N times and print the spread of real step times")
    args = ap.parse_args()
    measured = measured_network()
    fidelity(measured=measured)
    if args.recapture > 0:
        with tempfile.TemporaryDirectory() as tmp:
            sources, fastest = recapture(args.recapture, Path(tmp))
        if {"single", "moe_single"} <= set(sources):
            fidelity(sources, fastest, f"the fastest of {args.recapture} x {LAST - FIRST + 1} captured steps "
                     "(the fastest single-process step rewritten)", measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
