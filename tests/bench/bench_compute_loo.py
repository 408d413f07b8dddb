"""Leave-one-model-out of the op cost model on one GPU's data (issue 12), faster than
bench_compute_model.py: per held-out model the predicted vs measured total, and the GEMM MAPE of
the shaped and the shape-free form per source, side by side. The total is over all rows, those
that ran beside a collective kernel predicted with the fitted contention; "alone rows" is the same
over the rows that ran alone (less than 10 % of their kernel time beside a collective). Each fold
borrows the unaligned-GEMM rate from the other GPUs' shipped fits where its kernels do not measure
it, as the shipped fit does.
Run: python tests/bench/bench_compute_loo.py [--readme] [GPU ...]   (default A100 H100)

``--readme`` also prints the tables of ``replay/README.md`` (the block ``<!-- bench:compute_loo -->``)
between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``, and the fidelity line of ``README.md``
(its block ``<!-- bench:compute_loo -->`` there) between ``<!-- readme:begin README.md -->`` and
``<!-- readme:end -->``: ``python tests/bench/run_all.py --update-readme compute_loo`` puts them there
(A100 and H100)."""

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


def _pct(x: float) -> str:
    """A signed percentage with a typographic minus, as the README's prose writes it."""
    return f"{x:+.1f} %".replace("-", "\u2212")


def _span(xs: list[float]) -> str:
    """``lo … hi`` of signed percentages (the README's ranges)."""
    return f"{_pct(min(xs))[:-2]} … {_pct(max(xs))}"


def main() -> None:
    """Print the tables of each GPU named on the command line (and with ``--readme`` the README
    blocks)."""
    readme = "--readme" in sys.argv[1:]
    md: list[str] = []
    totals: dict[str, dict[str, float]] = {}
    for gpu in [a for a in sys.argv[1:] if a != "--readme"] or ["A100", "H100"]:
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
        gemm_shaped, gemm_free = (x["per_class"]["gemm"]["mape_pct"] for x in (shaped, free))
        print(f"{gpu}: GEMM CV MAPE shaped {gemm_shaped:.1f} %, shape-free {gemm_free:.1f} %")
        md += [f"**{gpu}** ({len(files)} files; GEMM MAPE over all held-out folds: shaped {gemm_shaped:.1f} %, "
               f"shape-free {gemm_free:.1f} %):", "",
               "| held-out source | compute total (all rows, with contention) | coverage | rows that ran alone "
               "| their share of rows | GEMM MAPE shaped | shape-free | GEMM rows |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        totals[gpu] = {}
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
            share = 100 * al.sum() / max((cols["group"] == g).sum(), 1)
            print(f"  {g:<40} total (all rows, with contention) {v['error_pct']:+6.1f} % "
                  f"(coverage {100 * v['coverage']:.0f} %), alone rows {alone:+6.1f} % "
                  f"({share:.0f} % of rows)  {gm}")
            gemm_md = (f"{mape(shaped['pred'][sel], cols['dur'][sel]):.1f} % | "
                       f"{mape(free['pred'][sel], cols['dur'][sel]):.1f} % | {int(sel.sum()):,}") if sel.any() else "— | — | 0"
            md.append(f"| `{g}` | {_pct(v['error_pct'])} | {100 * v['coverage']:.0f} % | {_pct(alone)} | {share:.0f} % "
                      f"| {gemm_md} |")
            totals[gpu][g] = v["error_pct"]
        md.append("")
    if readme and totals:
        print("<!-- readme:begin -->")
        print("\n".join(md).strip("\n"))
        print("<!-- readme:end -->")
        parts = []
        for gpu, t in totals.items():
            worst = max(t, key=lambda g: abs(t[g]))
            rest = [e for g, e in t.items() if g != worst]
            parts.append(f"on {gpu} within {_span(list(t.values()))} over {len(t)} sources" if not rest else
                         f"on {gpu} within {_span(rest)} over {len(rest)} sources, the worst `{worst}` at "
                         f"{_pct(t[worst])}")
        print("<!-- readme:begin README.md -->")
        print("- **Compute model** (prediction, each source held out): whole-trace compute " + "; ".join(parts)
              + " — [replay/README.md](replay/README.md#compute-model-timing-ops-without-a-measured-duration).")
        print("<!-- readme:end -->")


if __name__ == "__main__":
    main()
