"""Self-replay fidelity and speed on every GPU trace of ``../shared/traces`` (issue 11).

Run: ``python tests/bench/bench_selfreplay.py [--repeat N] [NAME...]``. For each trace (found by
reading the files, so new traces are picked up): the replayed mean step against the measured one
(worst rank), the worst single step, the share of the replayed span that is a delay kept as measured
(unexplained device holds: what self-replay agreement does not prove), the replay wall time, and the Kineto load time against a plain
``orjson.loads`` of the same bytes (read, gunzip, parse and free; best of N each, CPU time of this
process so that other work on a shared machine does not count; target ≤ 1.5×), with both absolute
times (a tiny file's load is a fixed cost of about a millisecond). Prints a Markdown table and the
worst figures.

``--readme`` skips the load timing and prints the table of ``replay/README.md`` (the block
``<!-- bench:selfreplay -->``) between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``, and the
fidelity line of ``README.md`` (its block ``<!-- bench:selfreplay -->`` there) between
``<!-- readme:begin README.md -->`` and ``<!-- readme:end -->``: ``python tests/bench/run_all.py
--update-readme selfreplay`` puts them there.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from shared_kineto import SHARED, gpu_traces, trace_files  # noqa: E402

from ettools.converters.kineto import read_kineto  # noqa: E402
from ettools.io import read_bytes  # noqa: E402
from ettools.replay import replay_trace  # noqa: E402


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def _parse_all(files: list[Path]) -> None:
    for f in files:
        orjson.loads(read_bytes(f))


def _errors(res) -> tuple[float, float, str]:
    """(worst mean-step error %, worst single-step error %, what was compared)."""
    worst_mean = worst_step = 0.0
    what = "span"
    for rr in res.ranks.values():
        if rr.measured_step_time_us:
            e = (rr.step_time_us - rr.measured_step_time_us) / rr.measured_step_time_us * 100
            what = f"{len(rr.measured_steps_us)} step(s)" if rr.measured_steps_us else "span"
        elif rr.measured_span_us:
            e = (rr.span_us - rr.measured_span_us) / rr.measured_span_us * 100
        else:
            e = float("nan")
        worst_mean = e if abs(e) > abs(worst_mean) or worst_mean != worst_mean else worst_mean
        for got, want in zip(rr.steps_us, rr.measured_steps_us):
            s = (got - want) / want * 100 if want else 0.0
            worst_step = s if abs(s) > abs(worst_step) else worst_step
    return worst_mean, worst_step, what


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--readme", action="store_true", help="no load timing; print the README block")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    names = args.names or gpu_traces()
    rows, readme = [], []
    holds: list[tuple[float, str]] = []  # (kept-as-measured share of the span %, trace)
    worst_step = (0.0, "")
    worst_ratio = (0.0, "")
    worst_err = (0.0, "")
    worst_abs = (0.0, "")
    for name in names:
        files = trace_files(name)
        try:
            if args.readme:
                parse_s = load_s = float("nan")
            else:
                parse_s = _best(lambda f=files: _parse_all(f), args.repeat)
                load_s = _best(lambda f=files: read_kineto(f if len(f) > 1 else f[0]), args.repeat)
            trace = read_kineto(files if len(files) > 1 else files[0])
            t = time.perf_counter()
            res = replay_trace(trace)
            replay_s = time.perf_counter() - t
        except Exception as e:  # a bench reports every trace, even a failing one
            rows.append(f"| {name} | — | error: {type(e).__name__}: {e} | | | | | | |")
            readme.append(f"| {name} | — | error: {type(e).__name__}: {e} | | | | |")
            worst_err = (float("inf"), name)
            continue
        mean_e, step_e, what = _errors(res)
        ratio = load_s / parse_s
        worst_ratio = max(worst_ratio, (ratio, name))
        if load_s > worst_abs[0]:
            worst_abs = (load_s, name)
        if abs(mean_e) > abs(worst_err[0]):
            worst_err = (mean_e, name)
        if abs(step_e) > abs(worst_step[0]):
            worst_step = (step_e, name)
        held = 100 * res.measured_kept()["device_hold_share_of_span"]
        rows.append(f"| {name} | {len(files)} | {what} | {mean_e:+.2f} % | {step_e:+.2f} % | {held:.1f} % | "
                    f"{replay_s:.2f} s | {load_s * 1e3:.1f} ms | {parse_s * 1e3:.1f} ms | {ratio:.2f}× |")
        readme.append(f"| {name} | {len(files)} | {what} | {mean_e:+.2f} % | {step_e:+.2f} % | {held:.1f} % | "
                      f"{replay_s:.2f} s |")
        holds.append((held, name))
        print(readme[-1] if args.readme else rows[-1], file=sys.stderr, flush=True)
    if args.readme:
        _print_readme(readme, worst_err, worst_step, sorted(holds, reverse=True))
        return 0
    print("| trace | ranks | compared | mean step error (worst rank) | worst single step | kept-as-measured delay "
          "(share of span) | replay | load | orjson | load / orjson |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\nworst mean-step error: {worst_err[0]:+.2f} % ({worst_err[1]})")
    print(f"worst Kineto load ratio: {worst_ratio[0]:.2f}× plain orjson.loads ({worst_ratio[1]}); target ≤ 1.5×")
    print(f"slowest Kineto load: {worst_abs[0] * 1e3:.0f} ms ({worst_abs[1]})")
    print(f"traces: {len(names)} under {SHARED}")
    return 0


def _print_readme(rows: list[str], worst_err: tuple[float, str], worst_step: tuple[float, str],
                  holds: list[tuple[float, str]]) -> None:
    """The README blocks: the table, the worst errors and the largest kept-as-measured shares, and the
    line of the top-level README, between the markers run_all.py reads."""
    print("<!-- readme:begin -->")
    print("| trace | ranks | compared | mean step error (worst rank) | worst single step | kept-as-measured delay "
          "(share of span) | replay wall |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    print()
    print(f"Worst mean-step error {_signed(worst_err[0])} % (`{worst_err[1]}`), worst single step "
          f"{_signed(worst_step[0])} % (`{worst_step[1]}`); {len(rows)} traces. The largest kept-as-measured "
          "shares: " + ", ".join(f"{h:.1f} % of `{n}`" for h, n in holds[:3]) + ".")
    print("<!-- readme:end -->")
    print("<!-- readme:begin README.md -->")
    print(f"- **Self-replay of {len(rows)} real Kineto traces** (reproduction): mean step within "
          f"{abs(worst_err[0]):.2f} % of the measured one, worst single step {abs(worst_step[0]):.2f} %, with the share "
          "of the span replayed as an unexplained measured delay stated per trace — "
          "[replay/README.md](replay/README.md#what-the-replay-assumes-self-replay-of-real-traces).")
    print("<!-- readme:end -->")


def _signed(x: float) -> str:
    """``x`` with two decimals and a typographic minus (the README's prose)."""
    return f"{x:+.2f}".replace("-", "\u2212")


if __name__ == "__main__":
    sys.exit(main())
