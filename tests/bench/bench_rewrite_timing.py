"""Fidelity benchmark of the rewriter's timing: rewrites of the single-process sample captures to
2-rank plans, replayed, against the real 2-rank captures of the same model and plan.

Run: ``python tests/bench/bench_rewrite_timing.py [--recapture N] [--readme]``.

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

``--readme`` (which recaptures ``--recapture`` times, 5 unless given: the README's "fastest of 30")
also prints the sentence and table of ``scaler/README.md`` (the block
``<!-- bench:rewrite_timing -->`` in the section *Rewrite timing against real 2-rank captures*)
between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``, and the fidelity line *Rewrites* of
``README.md`` (its block ``<!-- bench:rewrite_timing -->`` there) between
``<!-- readme:begin README.md -->`` and ``<!-- readme:end -->``:
``python tests/bench/run_all.py --update-readme rewrite_timing`` puts them there. The figures are
real 2-rank gloo captures and collectives timed on this machine: run it on a quiet machine (any
other load slows the captures and the measured network unevenly). ``--readme --recapture 1`` is
the quickest run that prints every column (its figures are not the README's: fastest of 6).
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
             measured: dict | None = None) -> dict[str, dict[str, float]]:
    """Print the rewrite-vs-capture table: rewrites of ``sources`` (default: the bundled single
    captures) against ``refs`` step times (default: the bundled 2-rank captures, replayed);
    ``measured``: a network measured on this machine, a fourth column. Returns per plan its
    reference step ``ref`` and the rewrite's replayed step (µs) under each network model
    (``default``, ``loo``, ``own``, ``measured``: those computed)."""
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
    out: dict[str, dict[str, float]] = {}
    for name, (src, kw) in CASES.items():
        ref = refs.get(name)
        if ref is None:
            continue
        rw = scale_trace(src_of[src], **kw)
        cells = {"default": replay_trace(rw).step_time_us}
        if name in samples:
            cells["loo"] = replay_trace(rw, network=CommFit.from_samples(_pool(samples, name)).to_dict()).step_time_us
            cells["own"] = replay_trace(rw, network=CommFit.from_samples(samples[name]).to_dict()).step_time_us
            if measured:
                cells["measured"] = replay_trace(rw, network=measured).step_time_us
        text = "".join(f" {c / 1000:7.2f} ({100 * (c - ref) / ref:+6.1f}%)" for c in cells.values())
        print(f"{name:11s} {ref / 1000:8.2f}{text}", flush=True)
        out[name] = {"ref": ref, **cells}
    return out


FIRST, LAST = 3, 8  # steps recorded per recapture (1-2 warm up)


def recapture(n: int, tmp: Path) -> tuple[dict, dict[str, float], dict[str, dict[str, float]]]:
    """Capture every scenario ``n`` times (steps FIRST..LAST each), print the spread of the real
    step times, and return the fastest step of the single-process scenarios (as traces of that
    one step), the fastest step time (µs) of every scenario, and per scenario its ``min``,
    ``median``, ``max`` step (µs), the number of ``steps`` and the ``bundled`` capture's step."""
    from ettools.capture import capture
    from ettools.formats import load_trace

    names = ["single", "single_b16", "moe_single", *MULTI]
    k = LAST - FIRST + 1
    fastest_trace: dict = {}
    fastest: dict[str, float] = {}
    spread: dict[str, dict[str, float]] = {}
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
              f"{max(times) / 1000:6.2f}; {statistics.median(means) / 1000:6.2f}", flush=True)
        spread[name] = {"min": min(times), "median": statistics.median(times), "max": max(times),
                        "steps": len(times), "bundled": bundled}
    return fastest_trace, fastest, spread


# README rows: plan, label; the plans a rewrite prices communication for have every network column
README_ROWS = [("ddp", "DDP"), ("pp_gpipe", "GPipe, 2 stages"), ("pp_1f1b", "1F1B, 2 stages"),
               ("single_b16", "batch 8 → 16"), ("moe_ep", "MoE EP"), ("tp_sp", "TP + SP")]
SHORT = {"ddp": "DDP", "pp_gpipe": "GPipe", "pp_1f1b": "1F1B", "single_b16": "batch 16", "moe_ep": "MoE-EP",
         "tp_sp": "TP+SP"}  # the plans' names in the README.md line
CLOSE = 10.0  # % error with the measured network (the default where none): bold, and "close" in the README line


def _pct(x: float) -> str:
    """A signed percentage with a typographic minus, as the README's prose writes it."""
    return f"{x:+.1f} %".replace("-", "\u2212")


def _num(x: float) -> str:
    return _pct(x)[:-2]


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _err(row: dict[str, float] | None, key: str) -> float | None:
    if row is None or key not in row:
        return None
    return 100 * (row[key] - row["ref"]) / row["ref"]


def _headline(row: dict[str, float] | None) -> float | None:
    """The error the README leads with: the measured network's, the default's where there is none."""
    e = _err(row, "measured")
    return _err(row, "default") if e is None else e


def readme_blocks(bundled: dict[str, dict[str, float]], fastest: dict[str, dict[str, float]],
                  spread: dict[str, dict[str, float]], n: int) -> tuple[str, str]:
    """The ``scaler/README.md`` block (the sentence on this machine's speed and the table) and the
    ``README.md`` fidelity line, from :func:`fidelity` against the bundled captures (``bundled``)
    and against the fastest of ``n`` recaptures (``fastest``), and :func:`recapture`'s ``spread``."""
    steps = n * (LAST - FIRST + 1)

    def cell(row: dict[str, float] | None, key: str) -> str:
        e = _err(row, key)
        if e is None:
            return ""
        bold = abs(e) <= CLOSE and e == _headline(row)
        return f"**{_pct(e)}**" if bold else _pct(e)

    md = [f"| plan | bundled capture | default | leave-one-out fit | own fit | measured | fastest of {steps} | default "
          f"| own fit | measured | {steps} steps min / median / max |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, label in README_ROWS:
        b, f, sp = bundled.get(name), fastest.get(name), spread.get(name)
        if b is None:
            continue
        cells = [label, f"{b['ref'] / 1e3:.2f} ms", *(cell(b, k) for k in ("default", "loo", "own", "measured")),
                 f"{f['ref'] / 1e3:.2f} ms" if f else "", *(cell(f, k) for k in ("default", "own", "measured")),
                 f"{sp['min'] / 1e3:.1f} / {sp['median'] / 1e3:.1f} / {sp['max'] / 1e3:.1f} ms" if sp else ""]
        md.append("|" + "|".join(f" {c} " if c else " " for c in cells) + "|")
    intro = "One run"
    single = spread.get("single")
    if single:
        ratio = single["min"] / single["bundled"]
        how = f"about {ratio:.1f}× slower" if ratio >= 1 else f"about {1 / ratio:.1f}× faster"
        intro += (f" (this session's machine ran the same script {how} than the one that made the bundled captures: "
                  f"fastest single-process step {single['min'] / 1e3:.1f} ms against {single['bundled'] / 1e3:.1f} ms "
                  "bundled)")
        ddp = spread.get("ddp")
        if ddp:
            # two processes on this machine's CPUs: DDP's step is the single step plus one all-reduce,
            # so its ratio to the single step shows how much two ranks slow each other here
            intro += (f"; two ranks ran a DDP step {ddp['min'] / single['min']:.2f}× as long as one process ran its step "
                      f"({ddp['bundled'] / single['bundled']:.2f}× in the bundled captures), so the fresh-capture columns "
                      "measure this machine's contention between two ranks as much as the rewrites")
    block = f"{intro}:\n\n" + "\n".join(md)

    plans = [p for p, _ in README_ROWS if p in bundled and "loo" in bundled[p]]  # 2-rank plans
    close = [p for p in plans if abs(_headline(bundled[p]) or 0) <= CLOSE]
    far = [p for p in plans if p not in close]
    net = "measured" if all("measured" in bundled[p] for p in plans) else "default"
    net_words = ("the network measured by `calibrate --network --measure gloo`" if net == "measured"
                 else "the rewriter's default network")

    def span(rows: dict, names: list[str], key: str) -> str:
        es = [_err(rows.get(p), key) for p in names]
        es = [e for e in es if e is not None]
        if len(es) == 1:
            return _pct(es[0])
        return f"{_num(min(es))} … {_pct(max(es))}" if len(names) > 2 else f"{' / '.join(map(_num, es))} %"

    parts = []
    if close:
        text = f"{_and([SHORT[p] for p in close])} {span(bundled, close, 'default')} of the bundled captures"
        if net == "measured":
            text += f" ({span(bundled, close, 'measured')} with {net_words})"
        parts.append(text)
    if "single_b16" in bundled:
        text = f"{SHORT['single_b16']} {span(bundled, ['single_b16'], 'default')}"
        if "single_b16" in fastest:
            text += f" ({span(fastest, ['single_b16'], 'default')} against the fastest of {steps} fresh steps)"
        parts.append(text)
    line = ", ".join(parts)
    if far:
        short = all((_headline(bundled[p]) or 0) < -CLOSE for p in far)
        text = f"{_and([SHORT[p] for p in far])} {'short, ' if short else ''}{span(bundled, far, net)} with the {net} network"
        if all(p in fastest for p in far):
            text += f" ({span(fastest, far, net)} against the fastest steps)"
        if short:
            text += ": their collectives slowed in place by two ranks sharing two vCPUs, which no network model here holds"
        line += f"; {text}"
    summary = (f"- **Rewrites** (prediction against real 2-rank gloo captures): {line} — "
               "[scaler/README.md](scaler/README.md#rewrite-timing-against-real-2-rank-captures-gloo-on-this-2-core-machine).")
    return block, summary


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recapture", type=int, default=None, metavar="N",
                    help="also capture every scenario N times and print the spread of real step times "
                         "(default 0; 5 with --readme)")
    ap.add_argument("--readme", action="store_true",
                    help="also print the README blocks (run on a quiet machine: real captures and collectives)")
    args = ap.parse_args()
    n = args.recapture if args.recapture is not None else (5 if args.readme else 0)
    if args.readme and n < 1:
        ap.error("--readme needs --recapture N >= 1 (the README's fastest-step columns); 5 by default")
    measured = measured_network()
    if args.readme and measured is None:
        ap.error("--readme needs torch (the capture extra): the README's figures are real captures")
    bundled = fidelity(measured=measured)
    fastest: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, float]] = {}
    if n > 0:
        with tempfile.TemporaryDirectory() as tmp:
            sources, fastest_steps, spread = recapture(n, Path(tmp))
        if {"single", "moe_single"} <= set(sources):
            fastest = fidelity(sources, fastest_steps, f"the fastest of {n} x {LAST - FIRST + 1} captured steps "
                               "(the fastest single-process step rewritten)", measured)
    if args.readme:
        if not fastest:
            print("no recapture: README blocks not printed", file=sys.stderr)
            return 1
        block, summary = readme_blocks(bundled, fastest, spread, n)
        print("<!-- readme:begin -->")
        print(block)
        print("<!-- readme:end -->")
        print("<!-- readme:begin README.md -->")
        print(summary)
        print("<!-- readme:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
