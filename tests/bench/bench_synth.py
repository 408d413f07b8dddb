"""Benchmark of ``ettools synth``: the configurations STAGE needed minutes for (issue 4).

Run: ``python tests/bench/bench_synth.py [--out DIR] [--quick]``. For each configuration it
prints the time to build the distinct-rank graphs (symbolic + instantiate), to stamp and write
every rank's Chakra file, the bytes written and MB/s, next to STAGE's published times.
``--quick`` skips the 32,768-rank write (graphs are still built).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from ettools.converters.symbolic import synth_summary, synthesize
from ettools.converters.symbolic.write import write_synth

# (label, kwargs, STAGE normal-mode seconds, STAGE optimize-mode seconds) — from the issue
CONFIGS = [
    ("GPT-3-5B TP=8+SP, 128 micro-batches", dict(model="gpt3-5b", tp=8, sp=8, batch=128, micro_batch=1),
     ">1200 (did not finish)", "33"),
    ("GPT-3-5B (STAGE template) TP=8+SP, 128 mb", dict(model="gpt3-5b-stage", tp=8, sp=8, batch=128, micro_batch=1),
     ">1200 (did not finish)", "33"),
    ("GPT-3-5B PP=8, 128 micro-batches", dict(model="gpt3-5b", pp=8, batch=128, micro_batch=1), "598", "-"),
    ("Llama-3-70B TP=4 PP=2 batch 32", dict(model="llama3-70b", tp=4, pp=2, batch=32, micro_batch=1), "675", "47"),
    ("Llama-3-70B TP=8 DP=512 (4,096 ranks), 1 mb", dict(model="llama3-70b", tp=8, dp=512, batch=512, micro_batch=512),
     "368 (4.1 GB)", "-"),
    ("Llama-3-70B TP=8 PP=4 DP=1024 (32,768 ranks), 8 mb",
     dict(model="llama3-70b", tp=8, pp=4, dp=1024, batch=8192, micro_batch=1024), ">1200 (did not finish)", "-"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: a temporary folder, removed)")
    ap.add_argument("--quick", action="store_true", help="do not write the 32,768-rank set")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench_synth_"))
    rows = []
    try:
        for label, kw, stage_normal, stage_opt in CONFIGS:
            t0 = time.perf_counter()
            res = synthesize(**kw, materialize=False)
            t_build = time.perf_counter() - t0
            summ = synth_summary(res, [0])["ranks"]["0"]
            big = res.world_size > 10000
            if big and args.quick:
                w = {"seconds": float("nan"), "bytes": 0, "mb_per_s": float("nan"), "ranks": 0}
            else:
                d = root / label.split()[0].replace("/", "_") / str(len(rows))
                w = write_synth(res, d, progress=False)
                shutil.rmtree(d, ignore_errors=True)
            rows.append((label, res.world_size, summ["nodes"], t_build, w["seconds"], w["bytes"], w["mb_per_s"],
                         stage_normal, stage_opt))
            print(f"{label}: ranks {res.world_size}, nodes/rank0 {summ['nodes']:,}, build {t_build:.2f} s "
                  f"({res.timings}), write {w['seconds']:.1f} s, {w['bytes'] / 1e9:.2f} GB, "
                  f"{w['mb_per_s']:.0f} MB/s; STAGE normal {stage_normal} s, optimize {stage_opt} s", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print("| configuration | ranks | nodes (rank 0) | build s | write s | GB | MB/s | STAGE normal s | STAGE optimize s |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for label, world, nodes, tb, tw, nb, mbs, sn, so in rows:
        print(f"| {label} | {world:,} | {nodes:,} | {tb:.2f} | {tw:.1f} | {nb / 1e9:.2f} | {mbs:.0f} | {sn} | {so} |")


if __name__ == "__main__":
    main()
