"""Cross-GPU prediction through ``ettools replay`` (issue 22): each GPU's trace of a
``hardware_pairs`` run replayed with ``--system <the other GPU>``, against the other GPU's measured
step. Every device op is re-timed (``replay/retime.py``); host work is the source machine's.

Held out: each GPU's op model is fitted on its other sources (``make_op_models.SOURCES``) without
the model being predicted, so neither trace of the pair is in either fit (``--shipped``: the
shipped fits, which hold both). Prints per pair and direction: measured step of the target GPU,
the predicted step, the error, the device time measured on the source / predicted / measured on
the target, and the shares of device time re-timed by shape, by class transfer and kept.

Run: python tests/bench/bench_cross_gpu_replay.py [--shipped]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
KEY = {"h100": "H100", "mi300x": "MI300X"}


def _held_out_fit(gpu: str, model: str):
    from ettools.replay.calibrate import fit_op_model
    from ettools.replay.data.make_op_models import SOURCES

    files = sorted(f for pat in SOURCES[gpu] for f in SHARED.glob(pat) if model not in str(f))
    return fit_op_model(files, gpu, cv=False)[0]


def main() -> int:
    """Print the table; exit 0."""
    from ettools.formats import load_trace
    from ettools.replay.api import replay_trace

    shipped = "--shipped" in sys.argv
    pairs = SHARED / "traces" / "hardware_pairs"
    print(f"cross-GPU replay ({'shipped fits' if shipped else 'fits held out: neither trace of the pair in either fit'})")
    print(f"{'pair':<14} {'direction':<15} {'measured ms':>11} {'predicted':>10} {'error':>8} "
          f"{'device ms src/pred/target':>26} {'by shape':>9} {'by class':>9} {'kept':>6} {'GPU busy':>9}")
    errs = []
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
            dst_dev = _device_us(selfs[dst])
            busy = _device_us(selfs[dst]) / max(selfs[dst].span_us, 1.0)
            print(f"{m:<14} {src + '->' + dst:<15} {meas / 1e3:>11.2f} {r.step_time_us / 1e3:>10.2f} {err:>+7.1f}% "
                  f"{rt['device_us_measured'] / 1e3:>8.2f}/{rt['device_us_retimed'] / 1e3:.2f}/{dst_dev / 1e3:.2f}"
                  f"{'':>4} {100 * sh['by shape']:>8.1f}% {100 * sh['by class transfer']:>8.1f}% "
                  f"{100 * sh['kept as measured']:>5.1f}% {100 * busy:>8.1f}%")
    print(f"mean |error| {sum(errs) / len(errs):.1f} %, worst {max(errs):.1f} %; {time.perf_counter() - t0:.1f} s")
    return 0


def _device_us(res) -> float:
    """Measured device compute µs of a self-replay's rank 0."""
    import numpy as np

    g = res.trace.graphs[min(res.trace.graphs)]
    from ettools.graph import COMM_NODE_TYPES

    dev = (g.is_cpu_op != 1) & ~np.isin(g.type, [int(x) for x in COMM_NODE_TYPES]) & np.isfinite(g.dur)
    hold = g.strings.lookup("device_hold")
    if hold >= 0:
        dev &= g.name != hold
    return float(np.nansum(g.dur[dev]))


if __name__ == "__main__":
    raise SystemExit(main())
