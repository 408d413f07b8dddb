"""Cross-GPU prediction through ``ettools replay`` (issue 22): each GPU's trace of a
``hardware_pairs`` run replayed with ``--system <the other GPU>``, against the other GPU's measured
step. Every device op is re-timed (``replay/retime.py``); host work is the source machine's.

Held out: each GPU's op model is fitted on its other sources (``make_op_models.SOURCES``) without
the model being predicted, so neither trace of the pair is in either fit (``--shipped``: the
shipped fits, which hold both). Prints per pair and direction: measured step of the target GPU,
the predicted step, the error, the device time measured on the source / predicted / measured on
the target, and the shares of device time re-timed by shape, by class transfer and kept.

Run: python tests/bench/bench_cross_gpu_replay.py [--shipped | --readme]. ``--readme`` (held-out
fits only) also prints the table of ``replay/README.md`` and the device-time line under it (the
block ``<!-- bench:cross_gpu_replay -->`` in the section *Predicting another GPU from a measured
trace*) between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``, and the fidelity line
*Another GPU from a measured trace* of ``README.md`` (its block ``<!-- bench:cross_gpu_replay -->``
there) between ``<!-- readme:begin README.md -->`` and ``<!-- readme:end -->``:
``python tests/bench/run_all.py --update-readme cross_gpu_replay`` puts them there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
KEY = {"h100": "H100", "mi300x": "MI300X"}
CLOSE = 5.0  # % device-time error both ways: the pairs the README lines group as predicted closely


def _held_out_fit(gpu: str, model: str):
    from ettools.replay.calibrate import fit_op_model
    from ettools.replay.data.make_op_models import SOURCES

    files = sorted(f for pat in SOURCES[gpu] for f in SHARED.glob(pat) if model not in str(f))
    return fit_op_model(files, gpu, cv=False)[0]


def _pct(x: float, signed: bool = True) -> str:
    """A percentage with a typographic minus, as the README's prose writes it."""
    return (f"{x:+.1f} %" if signed else f"{x:.1f} %").replace("-", "\u2212")


def _num(x: float) -> str:
    """A signed percentage without its unit (``+10.4``, ``−9.7``)."""
    return _pct(x)[:-2]


def _range(xs: list[float]) -> str:
    """``lo … hi %`` of signed percentages (the README's ranges)."""
    return f"{_num(min(xs))} … {_pct(max(xs))}"


def _both(xs: list[float]) -> str:
    """The two directions of one pair: ``a / b %``."""
    return f"{' / '.join(_num(x) for x in xs)} %"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def readme_blocks(rows: list[dict]) -> tuple[str, str]:
    """The ``replay/README.md`` block (table and device-time line) and the ``README.md`` fidelity
    line, from the per-direction ``rows`` :func:`main` measured."""
    md = ["| pair | direction | measured step | predicted | error | device ms: source / predicted / target measured "
          "| by shape | by class | kept | target GPU busy |",
          "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        md.append(f"| {r['pair']} | {KEY[r['src']]} → {KEY[r['dst']]} | {r['meas'] / 1e3:.2f} ms | "
                  f"{r['pred'] / 1e3:.2f} ms | {_pct(r['err'])} | {r['dev_src'] / 1e3:.2f} / {r['dev_pred'] / 1e3:.2f} / "
                  f"{r['dev_dst'] / 1e3:.2f} | {_pct(100 * r['by shape'], False)} | "
                  f"{_pct(100 * r['by class transfer'], False)} | {_pct(100 * r['kept as measured'], False)} | "
                  f"{_pct(100 * r['busy'], False)} |")
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    dev = {p: [r["dev_err"] for r in rows if r["pair"] == p] for p in pairs}
    copy = {p: [r["copy_err"] for r in rows if r["pair"] == p] for p in pairs}
    close = [p for p in pairs if max(map(abs, dev[p])) <= CLOSE]
    far = [p for p in pairs if p not in close]

    def far_name(p: str) -> str:
        r = next(r for r in rows if r["pair"] == p)  # the first direction's source
        return f"{p} ({r['kernels']:,} kernels of {r['dev_src'] / r['kernels']:.1f} µs mean on {KEY[r['src']]})"

    pred = [f"{_range([e for p in close for e in dev[p]])} for {_and(close)}"] if close else []
    pred += [f"{_both(dev[p])} for {far_name(p)}" for p in far]
    copied = [f"{_range([e for p in close for e in copy[p]])}"] if close else []
    copied += [_both(copy[p]) for p in far]
    line = (f"Device time, predicted against the target's measured: {', '.join(pred)}; copying the source GPU's "
            f"device time instead: {_and(copied)}{' respectively' if len(copied) > 1 else ''}.")
    steps = [r["err"] for r in rows]
    summary = [f"{_range([e for p in close for e in dev[p]])} for {_and(close)}"] if close else []
    summary += [f"{_both(dev[p])} for {p}" for p in far]
    fidelity = (f"- **Another GPU from a measured trace** (prediction; op models fitted without either trace): "
                f"{' ↔ '.join(KEY.values())} Hugging Face steps {_range(steps)} over {len(steps)} directions, "
                f"device time {', '.join(summary)} — "
                "[replay/README.md](replay/README.md#predicting-another-gpu-from-a-measured-trace).")
    return "\n".join(md) + "\n\n" + line, fidelity


def main() -> int:
    """Print the table (and with ``--readme`` the README blocks); exit 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shipped", action="store_true", help="the shipped fits (which hold both traces)")
    ap.add_argument("--readme", action="store_true", help="also print the README blocks (held-out fits only)")
    args = ap.parse_args()
    if args.shipped and args.readme:
        ap.error("--readme prints the held-out figures the READMEs state; not with --shipped")

    from ettools.formats import load_trace
    from ettools.replay.api import replay_trace

    shipped = args.shipped
    pairs = SHARED / "traces" / "hardware_pairs"
    print(f"cross-GPU replay ({'shipped fits' if shipped else 'fits held out: neither trace of the pair in either fit'})")
    print(f"{'pair':<14} {'direction':<15} {'measured ms':>11} {'predicted':>10} {'error':>8} "
          f"{'device ms src/pred/target':>26} {'by shape':>9} {'by class':>9} {'kept':>6} {'GPU busy':>9}")
    errs, rows = [], []
    t0 = time.perf_counter()
    for m in sorted(p.name for p in pairs.iterdir() if p.is_dir()):
        traces = {g: load_trace([str(pairs / m / f"{g}.json.gz")]).trace for g in KEY}
        selfs = {g: replay_trace(t, memory=False) for g, t in traces.items()}
        fits = {} if shipped else {g: _held_out_fit(KEY[g], m) for g in KEY}
        for src, dst in (("h100", "mi300x"), ("mi300x", "h100")):
            om = None if shipped else (fits[src], fits[dst])
            r = replay_trace(traces[src], system=KEY[dst], memory=False, op_models=om)
            rt = r.options["retiming"]
            meas = selfs[dst].measured_step_time_us
            err = 100 * (r.step_time_us / meas - 1)
            errs.append(abs(err))
            sh = rt["share_of_device_time"]
            dst_dev = _device_us(selfs[dst])[0]
            busy = dst_dev / max(selfs[dst].span_us, 1.0)
            dev_src, dev_pred = float(rt["device_us_measured"]), float(rt["device_us_retimed"])
            rows.append({"pair": m, "src": src, "dst": dst, "meas": meas, "pred": r.step_time_us, "err": err,
                         "dev_src": dev_src, "dev_pred": dev_pred, "dev_dst": dst_dev, "busy": busy,
                         "dev_err": 100 * (dev_pred / dst_dev - 1), "copy_err": 100 * (dev_src / dst_dev - 1),
                         "kernels": _device_us(selfs[src])[1], **sh})
            print(f"{m:<14} {src + '->' + dst:<15} {meas / 1e3:>11.2f} {r.step_time_us / 1e3:>10.2f} {err:>+7.1f}% "
                  f"{dev_src / 1e3:>8.2f}/{dev_pred / 1e3:.2f}/{dst_dev / 1e3:.2f}"
                  f"{'':>4} {100 * sh['by shape']:>8.1f}% {100 * sh['by class transfer']:>8.1f}% "
                  f"{100 * sh['kept as measured']:>5.1f}% {100 * busy:>8.1f}%", flush=True)
    print(f"mean |error| {sum(errs) / len(errs):.1f} %, worst {max(errs):.1f} %; {time.perf_counter() - t0:.1f} s")
    if args.readme and rows:
        table, fidelity = readme_blocks(rows)
        print("<!-- readme:begin -->")
        print(table)
        print("<!-- readme:end -->")
        print("<!-- readme:begin README.md -->")
        print(fidelity)
        print("<!-- readme:end -->")
    return 0


def _device_us(res) -> tuple[float, int]:
    """Measured device compute µs of a self-replay's rank 0, and its number of device ops."""
    import numpy as np

    g = res.trace.graphs[min(res.trace.graphs)]
    from ettools.graph import COMM_NODE_TYPES

    dev = (g.is_cpu_op != 1) & ~np.isin(g.type, [int(x) for x in COMM_NODE_TYPES]) & np.isfinite(g.dur)
    hold = g.strings.lookup("device_hold")
    if hold >= 0:
        dev &= g.name != hold
    return float(np.nansum(g.dur[dev])), int(dev.sum())


if __name__ == "__main__":
    raise SystemExit(main())
