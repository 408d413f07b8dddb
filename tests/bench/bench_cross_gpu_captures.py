"""Cross-GPU prediction on the project's own real captures: each size of the sample decoder and
each Hugging Face forward captured on an H100 (``sample_traces/gpu_h100``, ``hf_h100``) and on an
H200 (``gpu_h200``, ``hf_h200``), replayed with ``--system <the other GPU>``.

Held out by construction: no shipped op model was fitted on these files (the H100 fit comes from
``../shared``; the H200 has no fit of its own and borrows the H100's moved by the data sheet).
Prints per case and direction the target's measured device time and the predicted one, and where
the device ran past the step annotations (GPU-bound: ``large``) the step between device-activity
boundaries, measured and predicted. Host-bound steps are not compared: the two machines' CPUs
differ and the replay keeps the source's host work (its output says so).

Beside each prediction, the error of copying the source GPU's measured figure unchanged (what a
prediction has to beat).

Run: python tests/bench/bench_cross_gpu_captures.py [--readme]. ``--readme`` also prints the table
of ``replay/README.md`` (the block ``<!-- bench:cross_gpu_captures -->``) between
``<!-- readme:begin -->`` and ``<!-- readme:end -->``, and the fidelity line of ``README.md``
(its block ``<!-- bench:cross_gpu_captures -->`` there) between ``<!-- readme:begin README.md -->``
and ``<!-- readme:end -->``: ``python tests/bench/run_all.py --update-readme cross_gpu_captures``
puts them there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
GPUS = {"h100": "H100", "h200": "H200"}


def _cases() -> list[tuple[str, str]]:
    out = []
    for kind in ("gpu", "hf"):
        a, b = SAMPLES / f"{kind}_h100", SAMPLES / f"{kind}_h200"
        if not (a.is_dir() and b.is_dir()):
            continue
        names = sorted({p.name for p in a.iterdir() if p.name != "manifest.json" and not p.name.endswith("manifest.json")}
                       & {p.name for p in b.iterdir()})
        out += [(kind, n) for n in names]
    return out


def _pct(x: float) -> str:
    """A signed percentage with a typographic minus, as the README's prose writes it."""
    return f"{x:+.1f} %".replace("-", "\u2212")


def _span(xs: list[float]) -> str:
    """``lo … hi`` of signed percentages (the README's ranges)."""
    return f"{_pct(min(xs))[:-2]} … {_pct(max(xs))}"


def main() -> int:
    """Print the table (and with ``--readme`` the README blocks); exit 0."""
    from ettools.formats import load_trace
    from ettools.replay.api import replay_trace

    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", action="store_true", help="also print the README blocks")
    args = ap.parse_args()
    print(f"{'case':<26} {'direction':<13} {'device ms: measured':>20} {'predicted':>10} {'error':>8} {'copy src':>8}"
          f" {'step (device-bound) ms: measured':>33} {'predicted':>10} {'error':>8} {'copy src':>8} {'by shape':>9}")
    md = ["| case | direction | device ms: measured | predicted | error | copying the source's | "
          "GPU-bound step ms: measured | predicted | error | copying the source's | timed by shape |",
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    t0 = time.perf_counter()
    errs, copy_errs, step_errs, step_copy_errs = [], [], [], []
    for kind, name in _cases():
        traces = {g: load_trace([str(SAMPLES / f"{kind}_{g}" / name)]).trace for g in GPUS}
        meas = {g: replay_trace(t) for g, t in traces.items()}
        dev = {g: sum(float(v) for gr in t.graphs.values() for v in gr.dur[gr.is_cpu_op != 1])
               for g, t in traces.items()}
        for src, dst in (("h100", "h200"), ("h200", "h100")):
            pred = replay_trace(traces[src], system=GPUS[dst])
            rt = pred.options["retiming"]
            dev_meas, dev_pred = dev[dst], float(rt["device_us_retimed"])
            e, ce = (100 * (x - dev_meas) / dev_meas for x in (dev_pred, dev[src]))
            errs.append(e)
            copy_errs.append(ce)
            line = (f"{kind + '/' + name:<26} {src + '->' + dst:<13} {dev_meas / 1e3:>20.2f} {dev_pred / 1e3:>10.2f}"
                    f" {e:>+7.1f}% {ce:>+7.1f}%")
            row = (f"| {kind}/{name} | {GPUS[src]} → {GPUS[dst]} | {dev_meas / 1e3:.2f} | {dev_pred / 1e3:.2f} | "
                   f"{_pct(e)} | {_pct(ce)} |")
            m_db, m_ann = meas[dst].device_bound_step_us(), meas[dst].measured_step_time_us
            if m_db and m_ann and m_db > 1.05 * m_ann:
                p_db = pred.device_bound_step_us(replayed=True)
                s_db = meas[src].device_bound_step_us()
                se = 100 * (p_db - m_db) / m_db
                step_errs.append(se)
                sce = 100 * (s_db - m_db) / m_db if s_db else float("nan")
                step_copy_errs.append(sce)
                line += f" {m_db / 1e3:>33.2f} {p_db / 1e3:>10.2f} {se:>+7.1f}% {sce:>+7.1f}%"
                row += f" {m_db / 1e3:.2f} | {p_db / 1e3:.2f} | {_pct(se)} | {_pct(sce)} |"
            else:
                line += f" {'host-bound: not compared':>33} {'':>10} {'':>8} {'':>8}"
                row += " host-bound: not compared | | | |"
            share = 100 * rt["share_of_device_time"]["by shape"]
            line += f" {share:>8.1f}%"
            row += f" {share:.1f} % |"
            print(line, flush=True)
            md.append(row)
    dev_line = step_line = ""
    if errs:
        mean = sum(map(abs, errs)) / len(errs)
        print(f"device time: mean |error| {mean:.1f} %, worst {max(map(abs, errs)):.1f} % over {len(errs)} directions "
              f"(copying the source's: mean |error| {sum(map(abs, copy_errs)) / len(copy_errs):.1f} %)")
        dev_line = (f"Device time within {_span(errs)} (mean |error| {mean:.1f} % over {len(errs)} directions; "
                    f"copying the source GPU's: {_span(copy_errs)}, mean |error| "
                    f"{sum(map(abs, copy_errs)) / len(copy_errs):.1f} %).")
    if step_errs:
        print(f"GPU-bound step: mean |error| {sum(map(abs, step_errs)) / len(step_errs):.1f} %, "
              f"worst {max(map(abs, step_errs)):.1f} %")
        step_line = (f" The GPU-bound step, measured between device-activity boundaries: {_span(step_errs)} "
                     f"(copying the source GPU's: {' / '.join(_pct(x)[:-2] for x in step_copy_errs)} %).")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.readme and errs:
        print("<!-- readme:begin -->")
        print("\n".join(md))
        print()
        print(dev_line + step_line)
        print("<!-- readme:end -->")
        print("<!-- readme:begin README.md -->")
        print(f"- **Our own H100 ↔ H200 captures** (prediction; no op model fitted on them): device time "
              f"{_span(errs)} over {len(errs)} directions (mean |error| {sum(map(abs, errs)) / len(errs):.1f} %) — "
              "[replay/README.md](replay/README.md#predicting-another-gpu-from-a-measured-trace).")
        print("<!-- readme:end -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
