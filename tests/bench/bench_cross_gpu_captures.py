"""Cross-GPU prediction on the project's own real captures: each size of the sample decoder and
each Hugging Face forward captured on an H100 (``sample_traces/gpu_h100``, ``hf_h100``) and on an
H200 (``gpu_h200``, ``hf_h200``), replayed with ``--system <the other GPU>``.

Held out by construction: no shipped op model was fitted on these files (the H100 fit comes from
``../shared``; the H200 has no fit of its own and borrows the H100's moved by the data sheet).
Prints per case and direction the target's measured device time and the predicted one, and where
the device ran past the step annotations (GPU-bound: ``large``) the step between device-activity
boundaries, measured and predicted. Host-bound steps are not compared: the two machines' CPUs
differ and the replay keeps the source's host work (its output says so).

Run: python tests/bench/bench_cross_gpu_captures.py
"""

from __future__ import annotations

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


def main() -> int:
    """Print the table; exit 0."""
    from ettools.formats import load_trace
    from ettools.replay.api import replay_trace

    print(f"{'case':<26} {'direction':<13} {'device ms: measured':>20} {'predicted':>10} {'error':>8}"
          f" {'step (device-bound) ms: measured':>33} {'predicted':>10} {'error':>8} {'by shape':>9}")
    t0 = time.perf_counter()
    errs, step_errs = [], []
    for kind, name in _cases():
        for src, dst in (("h100", "h200"), ("h200", "h100")):
            s = load_trace([str(SAMPLES / f"{kind}_{src}" / name)]).trace
            d = load_trace([str(SAMPLES / f"{kind}_{dst}" / name)]).trace
            pred = replay_trace(s, system=GPUS[dst])
            meas = replay_trace(d)
            rt = pred.options["retiming"]
            dev_meas = sum(float(v) for g in d.graphs.values() for v in g.dur[g.is_cpu_op != 1])
            dev_pred = float(rt["device_us_retimed"])
            e = 100 * (dev_pred - dev_meas) / dev_meas
            errs.append(abs(e))
            line = (f"{kind + '/' + name:<26} {src + '->' + dst:<13} {dev_meas / 1e3:>20.2f} {dev_pred / 1e3:>10.2f}"
                    f" {e:>+7.1f}%")
            m_db, m_ann = meas.device_bound_step_us(), meas.measured_step_time_us
            if m_db and m_ann and m_db > 1.05 * m_ann:
                p_db = pred.device_bound_step_us(replayed=True)
                se = 100 * (p_db - m_db) / m_db
                step_errs.append(abs(se))
                line += f" {m_db / 1e3:>33.2f} {p_db / 1e3:>10.2f} {se:>+7.1f}%"
            else:
                line += f" {'host-bound: not compared':>33} {'':>10} {'':>8}"
            line += f" {100 * rt['share_of_device_time']['by shape']:>8.1f}%"
            print(line, flush=True)
    if errs:
        print(f"device time: mean |error| {sum(errs) / len(errs):.1f} %, worst {max(errs):.1f} % over {len(errs)} directions")
    if step_errs:
        print(f"GPU-bound step: mean |error| {sum(step_errs) / len(step_errs):.1f} %, worst {max(step_errs):.1f} %")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
