"""Compute model (issue 12): per-class leave-one-model-out MAPE and per-model total error of the
op cost models on every GPU with data, cross-GPU transfer on the hardware pairs, and the MFU of a
synthesized 1.7B GPT data-parallel step on A100 (fitted vs roofline). Run: python tests/bench/bench_compute_model.py [--cross-gpu]"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ettools.replay.calibrate import fit_op_model, report_lines
from ettools.replay.compute import load_hardware
from ettools.replay.data.make_op_models import SOURCES
from ettools.replay.opsamples import OP_CLASSES, kineto_op_samples

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def cross_gpu() -> None:
    """Cross-GPU transfer on the hardware pairs: fit on one GPU's trace of a model, predict the
    same model's trace on the other GPU (each GPU's prior fit leaves the model out)."""
    print("cross-GPU (fit on one GPU's trace of a model, predict the same model's trace on the other GPU):\n"
          "  datasheet: efficiency (achieved/peak) kept, target's peaks; term-wise: floor, FLOP rate and bandwidth each\n"
          "  scaled by the ratio the two GPUs' own fits on the other models measure (OpModel.transfer_to, the replay's;\n"
          "  GEMM rate: the two fits' shaped GEMM forms on the same reference shapes);\n"
          "  target's own fit: the target's fit on the other models. Error of the total over the ops each predicts\n"
          "  (coverage: share of the measured op time predicted)")
    pairs = SHARED / "traces" / "hardware_pairs"
    key = {"h100": "H100", "mi300x": "MI300X"}
    for m in sorted(p.name for p in pairs.iterdir()):
        # each GPU's fit without this model (no leak of the predicted trace into the prior)
        prior = {}
        for g, gk in key.items():
            files = sorted(f for pat in SOURCES[gk] for f in SHARED.glob(pat) if m not in str(f))
            prior[g] = fit_op_model(files, gk, cv=False)[0]
        for src, dst in (("h100", "mi300x"), ("mi300x", "h100")):
            fit, _ = fit_op_model([pairs / m / f"{src}.json.gz"], key[src], cv=False)
            t = load_hardware(key[dst])
            sms = int(t["match"]["sms"])
            s, _ = kineto_op_samples(pairs / m / f"{dst}.json.gz")
            c = s.arrays()
            ok = c["cls"] <= 4
            cc = {k: v[ok] for k, v in c.items()}
            out = []
            for mv in (fit.transfer_to(key[dst], t, sms), fit.transfer_to(key[dst], t, sms, prior[dst], prior[src]),
                       prior[dst]):
                p = mv.predict(cc)
                f = np.isfinite(p)
                out.append(f"{100 * (p[f].sum() / cc['dur'][f].sum() - 1):+6.1f} % ({100 * cc['dur'][f].sum() / cc['dur'].sum():.0f} %)")
                if len(out) == 2:  # the term-wise transfer's error by class
                    by = [f"{OP_CLASSES[k]} {cc['dur'][cc['cls'] == k].sum():.0f}/{np.nansum(p[cc['cls'] == k]):.0f}"
                          for k in range(len(OP_CLASSES)) if (cc["cls"] == k).any()]
            print(f"  {m:<16} {src}->{dst} (measured {cc['dur'].sum() / 1e3:.2f} ms): datasheet {out[0]}   "
                  f"term-wise {out[1]}   target's own fit {out[2]}")
            print(f"    term-wise by class, measured/predicted us: {', '.join(by)}")


def main() -> None:
    """Print the tables (``--cross-gpu``: only the cross-GPU figures)."""
    import sys

    if "--cross-gpu" in sys.argv:
        cross_gpu()
        return
    for gpu, pats in SOURCES.items():
        files = sorted({p for pat in pats for p in SHARED.glob(pat)})
        if files:
            model, res = fit_op_model(files, gpu)
            print("\n".join(report_lines(model, res)), "\n")
    cross_gpu()
    from ettools.replay.netfit import fit_nccl_tables, read_nccl_tables

    for sub in ("a100_dgx", "h100_dgx"):
        d = Path(__file__).resolve().parents[3] / "shared" / "data" / "vidur_profiling" / "network" / sub
        if not d.is_dir():
            continue
        tab = read_nccl_tables(d)
        test = np.arange(len(tab.t_us)) % 5 == 2
        for label, curves in (("curves", True), ("ring only", False)):
            fit = fit_nccl_tables(tab, keep=~test)
            if not curves:
                fit.curves = {}
            p = np.array([fit.predict_us(k, int(n), b, int(no)) for k, n, no, b in
                          zip(tab.kind[test], tab.n[test], tab.nodes[test], tab.nbytes[test])])
            print(f"NCCL table fit {sub} ({label}): held-out MAPE {100 * np.mean(np.abs(p / tab.t_us[test] - 1)):.1f} %")
    from ettools.converters.symbolic import synthesize
    from ettools.replay import replay_trace

    for after in (False, True):
        res_v = synthesize("gpt3-1.3b", dims={"H": 2304, "F": 9216, "L": 24}, dp=8, batch=64, micro_batch=8,
                           ranks=list(range(8)), dp_after_backward=after)
        for timing in ("measured", "roofline"):
            r = replay_trace(res_v.trace, system="A100", timing=timing, symmetric=True)
            rr = r.ranks[0]
            print(f"synth GPT 1.7B dp8 mb8 on A100 ({'dp after backward' if after else 'dp overlapped'}), "
                  f"--timing {timing}: step {rr.step_time_us / 1e3:.1f} ms, MFU {100 * rr.mfu:.1f} % "
                  f"({rr.mfu_flops} FLOPs; node FLOPs {100 * rr.mfu * (rr.flops or 0) / res_v.trace.graphs[0].meta['model_flops']:.1f} %), "
                  f"by model {dict((k, round(v / 1e3, 1)) for k, v in r.time_by_source_us.items())} ms")
        if not after:
            res = res_v
    from ettools.replay.compute import node_features, shipped_op_models
    from ettools.replay.opmodel import graph_cols
    from ettools.replay.opsamples import ATTENTION

    g = res.trace.graphs[0]
    _, cols = graph_cols(g, *node_features(g), load_hardware("A100"))
    att = cols["cls"] == ATTENTION
    p = shipped_op_models()["A100"].predict(cols)
    print(f"  attention (A100 fit, {int((cols['m'][att] > 0).sum())}/{int(att.sum())} ops shaped): "
          f"{p[att].sum() / 1e3:.1f} ms of {np.nansum(p) / 1e3:.1f} ms compute, "
          f"{cols['flops'][att].sum() / p[att].sum() / 1e6:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
