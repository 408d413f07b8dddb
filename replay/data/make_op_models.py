"""Re-fit the shipped op cost models (``op_models/<GPU>.json``) from the real data in the shared
folder: ``python -m ettools.replay.data.make_op_models [--shared DIR]``.

Each GPU's model is fitted on every source below that exists (Kineto traces with ``Input Dims``,
Vidur op-time tables); the fit records the files it came from and each class's leave-one-model-out
MAPE. GPUs without data get no file: the replay transfers another GPU's fit to them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SOURCES: dict[str, list[str]] = {
    "H100": ["data/vidur_profiling/compute/h100/*/*/mlp.csv",
             "traces/hardware_pairs/*/h100.json.gz", "traces/et_kineto/triosim_vgg13_h100/kineto.json.gz"],
    "A100": ["data/vidur_profiling/compute/a100/*/*/mlp.csv", "data/vidur_profiling/compute/a100/attention.csv",
             "traces/kineto/hta_8rank_rank3/rank3.json.gz", "traces/kineto/hta_16rank_blocking_memcpy/rank0.json.gz"],
    "MI300X": ["traces/hardware_pairs/*/mi300x.json.gz", "traces/kineto/tracelens_mi300x_resnet_ddp8/rank0.json.gz",
               "traces/inference/sglang_qwen3_8b_mi300x/prefill_extend_bs15.json.gz"],
    "V100": ["traces/et_kineto/param_dlrm_8rank/kineto/rank*.json.gz", "traces/kineto/tb_resnet50_v100_legacy/rank0.json.gz"],
    "MI250": ["traces/kineto/hta_amd_mi250/rank0.json.gz"],
}


def main(argv: list[str] | None = None) -> int:
    """Fit and write every GPU's model; print the cross-validation report of each."""
    ap = argparse.ArgumentParser(description=__doc__)
    here = Path(__file__).resolve()
    ap.add_argument("--shared", type=Path, default=here.parents[2].parent / "shared",
                    help="the shared folder (traces/, data/)")
    ap.add_argument("--out", type=Path, default=here.with_name("op_models"))
    ap.add_argument("--gpu", action="append", help="only these GPUs")
    a = ap.parse_args(argv)
    from ettools.replay.calibrate import fit_op_model, report_lines
    from ettools.replay.opmodel import OpModel

    a.out.mkdir(parents=True, exist_ok=True)
    files_of = {}
    for gpu, pats in SOURCES.items():
        if a.gpu and gpu not in a.gpu:
            continue
        files_of[gpu] = sorted({p for pat in pats for p in a.shared.glob(pat)})
        if not files_of[gpu]:
            print(f"{gpu}: no data under {a.shared}", file=sys.stderr)
    # what a GPU's kernels do not measure, the other GPUs' own fits may lend: every GPU refitted
    # now (its own kernels only, no borrowing) plus the fits already in --out for the others, so
    # the result does not depend on the order the GPUs are fitted in
    own = {g: fit_op_model(f, g, cv=False, donors=[])[0] for g, f in files_of.items() if f}
    kept = {p.stem: OpModel.load(p) for p in sorted(a.out.glob("*.json")) if p.stem not in own}
    for gpu, files in files_of.items():
        if not files:
            continue
        donors = [m for g, m in sorted({**kept, **own}.items()) if g != gpu]
        model, res = fit_op_model(files, gpu, donors=donors)
        for s in model.sources:  # paths relative to the shared folder: the fit says where, not whose disk
            s["path"] = str(Path(s["path"]).relative_to(a.shared))
        model.save(a.out / f"{gpu}.json")
        print("\n".join(report_lines(model, res)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
