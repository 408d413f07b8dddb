"""Benchmark of ``ettools synth``: the configurations STAGE needed minutes for (issue 4).

Run: ``python tests/bench/bench_synth.py [--out DIR] [--quick] [--readme]``. For each configuration
it prints the time to build the distinct-rank graphs (symbolic + instantiate), to stamp and write
every rank's Chakra file, the bytes written and MB/s, next to STAGE's published times, and the
writer's speed as a ratio to ``dd`` writing the same bytes into the same folder in the same run
(:func:`anchors.dd_seconds`; issue 27's target: ≥ 0.8× on the 1,024- and 4,096-rank plans, the
32,768-rank set in ≤ 60 s). ``--quick`` skips the 32,768-rank write (graphs are still built).
``--readme`` prints the table of ``converters/README.md`` (block ``<!-- bench:synth -->``) between
``<!-- readme:begin -->`` and ``<!-- readme:end -->``: ``python tests/bench/run_all.py
--update-readme synth`` puts it there.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from anchors import dd_seconds

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
    ("GPT-3-175B TP=8 PP=8 DP=16 (1,024 ranks), 16 mb",
     dict(model="gpt3-175b", tp=8, pp=8, dp=16, batch=256, micro_batch=16), "-", "-"),
    ("Llama-3-70B TP=8 DP=512 (4,096 ranks), 1 mb", dict(model="llama3-70b", tp=8, dp=512, batch=512, micro_batch=512),
     "368 (4.1 GB)", "-"),
    ("Llama-3-70B TP=8 PP=4 DP=1024 (32,768 ranks), 8 mb",
     dict(model="llama3-70b", tp=8, pp=4, dp=1024, batch=8192, micro_batch=1024), ">1200 (did not finish)", "-"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: a temporary folder, removed)")
    ap.add_argument("--quick", action="store_true", help="do not write the 32,768-rank set")
    ap.add_argument("--readme", action="store_true", help="print the README block")
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
            dd = float("nan")
            if big and args.quick:
                w = {"seconds": float("nan"), "bytes": 0, "mb_per_s": float("nan"), "ranks": 0}
            else:
                d = root / label.split()[0].replace("/", "_") / str(len(rows))
                w = write_synth(res, d, progress=False)
                shutil.rmtree(d, ignore_errors=True)
                dd = dd_seconds(root, int(w["bytes"]))  # the same bytes, the same folder, now
            ratio = dd / w["seconds"] if w["seconds"] > 0 else float("nan")  # writer speed ÷ dd's
            rows.append((label, res.world_size, summ["nodes"], t_build, w["seconds"], w["bytes"], w["mb_per_s"],
                         ratio, stage_normal, stage_opt))
            print(f"{label}: ranks {res.world_size}, nodes/rank0 {summ['nodes']:,}, build {t_build:.2f} s "
                  f"({res.timings}), write {w['seconds']:.1f} s, {w['bytes'] / 1e9:.2f} GB, "
                  f"{w['mb_per_s']:.0f} MB/s = {ratio:.2f}x dd ({dd:.1f} s for the same bytes; target >= 0.8x); "
                  f"STAGE normal {stage_normal} s, optimize {stage_opt} s", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    table = ["| configuration | ranks | nodes (rank 0) | build | write | GB | MB/s | vs `dd`, same bytes, same run "
             "| STAGE normal s | STAGE optimize s |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for label, world, nodes, tb, tw, nb, mbs, ratio, sn, so in rows:
        # the dd ratio where the bytes make it a disk figure (a few MB write in Python's time, not the disk's)
        vs = f"{ratio:.2f}×" if nb >= 256e6 and ratio == ratio else "—"
        table.append(f"| {label} | {world:,} | {nodes:,} | {tb:.2f} s | {tw:.1f} s | {nb / 1e9:.2f} | {mbs:.0f} | "
                     f"{vs} | {sn} | {so} |")
    print()
    print("\n".join(table))
    if args.readme:
        print("<!-- readme:begin -->")
        print("\n".join(table))
        print("\nOne run on this 2-core machine (under whatever load it had); `dd` writes the same bytes into the "
              "same folder right after each write (issue 27's target: ≥ 0.8× on the 1,024- and 4,096-rank plans, "
              "the 32,768-rank set in ≤ 60 s).")
        print("<!-- readme:end -->")


if __name__ == "__main__":
    main()
