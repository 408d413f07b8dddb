"""Leave-one-model-out of the op cost model on one GPU's data (issue 12), faster than
bench_compute_model.py: per held-out model the predicted vs measured total, and the GEMM MAPE of
the shaped and the shape-free form per source, side by side. The total is over all rows, those
that ran beside a collective kernel predicted with the fitted contention; "alone rows" is the same
over the rows that ran alone (less than 10 % of their kernel time beside a collective). Each fold
borrows the unaligned-GEMM rate from the other GPUs' shipped fits where its kernels do not measure
it, as the shipped fit does.
Run: python tests/bench/bench_compute_loo.py [GPU ...]   (default A100 H100)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ettools.replay.calibrate import op_samples_from
from ettools.replay.compute import load_hardware, shipped_op_models
from ettools.replay.data.make_op_models import SOURCES
from ettools.replay.opmodel import cross_validate, mape
from ettools.replay.opsamples import GEMM

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def main() -> None:
    """Print the tables of each GPU named on the command line."""
    for gpu in sys.argv[1:] or ["A100", "H100"]:
        files = sorted({p for pat in SOURCES[gpu] for p in SHARED.glob(pat)})
        if not files:
            continue
        cols = op_samples_from(files)[0].arrays()
        hw = load_hardware(gpu)
        sms = int(hw["match"]["sms"])
        # each fold borrows what its kernels do not measure (the unaligned-GEMM rate) from the
        # other GPUs' shipped fits, as the shipped fit of this GPU does
        donors = [m for g, m in shipped_op_models().items() if g != gpu]
        shaped = cross_validate(cols, gpu, hw, sms, donors)
        free_cols = {**cols, **{k: np.full(len(cols["dur"]), -1.0) for k in ("m", "n", "k")}}
        free = cross_validate(free_cols, gpu, hw, sms)
        print(f"{gpu}: GEMM CV MAPE shaped {shaped['per_class']['gemm']['mape_pct']:.1f} %, "
              f"shape-free {free['per_class']['gemm']['mape_pct']:.1f} %")
        for g in shaped["groups"]:
            v = shaped["per_group"][g]
            sel = (cols["group"] == g) & (cols["cls"] == GEMM)
            gm = (f"GEMM MAPE shaped {mape(shaped['pred'][sel], cols['dur'][sel]):5.1f} % "
                  f"free {mape(free['pred'][sel], cols['dur'][sel]):5.1f} % (n={int(sel.sum())})") if sel.any() else ""
            # the prediction of a row that ran beside a collective kernel includes the fitted
            # contention (t·(1 + c·overlap), as the replay applies it); the rows that ran alone
            # compare the alone prediction with an uncontended measurement
            al = (cols["group"] == g) & np.isfinite(shaped["pred"]) & (cols["overlap"] < 0.1)
            alone = 100.0 * (shaped["pred"][al].sum() / cols["dur"][al].sum() - 1.0) if al.any() else float("nan")
            print(f"  {g:<40} total (all rows, with contention) {v['error_pct']:+6.1f} % "
                  f"(coverage {100 * v['coverage']:.0f} %), alone rows {alone:+6.1f} % "
                  f"({100 * al.sum() / max((cols['group'] == g).sum(), 1):.0f} % of rows)  {gm}")


if __name__ == "__main__":
    main()
