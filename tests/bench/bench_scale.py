"""Benchmark of the rewriter: re-parallelize the largest shared trace to 1,024 ranks and write it.

Run: ``python tests/bench/bench_scale.py [--trace PATH] [--ranks N] [--out DIR] [--keep]``.
Default trace: ``../shared/traces/kineto/hta_fwdbwd_1rank`` (45,386 nodes, the largest graph of
the shared traces). Steps, each timed: read; ``data_parallel`` to 8 ranks (the run's DDP buckets
become all-reduces) and ``reshard`` to ``--ranks`` (each pass runs the structural proof on its
result); completion semantics once per distinct graph; strict Chakra for every rank plus
``comm_group.json`` (each distinct structure encoded once, every rank's group keys and peers
patched into a copy of its bytes). Prints seconds per step, bytes written and MB/s, and the peak
RSS. A second line does the same for tensor × data parallelism on ``et_kineto/triosim_vgg13_h100``
(TP=8, DP to ``--ranks``/8: 1,024 ranks whose groups all differ), a third for pipeline × data
parallelism on it (PP=4: sends/recvs whose peers differ per rank).

Measured (2-core machine shared with other work, 1,024 ranks): hta DP write 13.3 s, 383 MB/s; VGG-13
TP 8 × DP 128 write 0.86 s, 527 MB/s (was 16-30 s, 15-29 MB/s, encoding every rank); VGG-13 PP 4 ×
DP 256 write 1.60 s, 284 MB/s (256 ranks of PP 4 × DP 64: 8.7 MB/s before sends/recvs were patched).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"


def run(label: str, path: Path, ranks: int, out: Path, tp: int = 1, pp: int = 1) -> None:
    from ettools.converters.chakra import write_chakra
    from ettools.formats import load_trace
    from ettools.replayable import replayable_trace as replayable
    from ettools.scaler import data_parallel, pipeline_parallel, reshard, tensor_parallel

    t = {}
    t0 = time.perf_counter()
    trace = load_trace([path]).trace
    t["read"] = time.perf_counter() - t0
    nodes = trace.num_nodes
    t0 = time.perf_counter()
    if tp > 1:
        trace = tensor_parallel(trace, tp)
    if pp > 1:
        trace = pipeline_parallel(trace, pp)
    trace = data_parallel(trace, 8)
    t["parallelize"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace = reshard(trace, ranks // (tp * pp))
    t["reshard+proof"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace = replayable(trace)
    t["replayable"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    files = write_chakra(trace, out, "trace")
    t["write"] = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in files)
    total = sum(t.values())
    rewrite = t["parallelize"] + t["reshard+proof"] + t["replayable"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{label}: {nodes:,} nodes -> {len(trace.graphs):,} ranks ({trace.num_nodes:,} nodes); "
          + ", ".join(f"{k} {v:.2f} s" for k, v in t.items())
          + f"; rewrite {rewrite:.2f} s; total {total:.2f} s; wrote {len(files)} files, {size / 1e9:.2f} GB, "
          f"{size / 1e6 / t['write']:.0f} MB/s (end to end {size / 1e6 / total:.0f} MB/s); peak RSS {rss:.0f} MB",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=SHARED / "kineto" / "hta_fwdbwd_1rank")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the written files")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    try:
        run(f"DP {args.trace.name}", args.trace, args.ranks, root / "dp")
        if not args.keep:
            shutil.rmtree(root / "dp", ignore_errors=True)
        vgg = SHARED / "et_kineto" / "triosim_vgg13_h100"
        if vgg.exists() and args.trace == ap.get_default("trace"):
            run("TP=8 x DP vgg13", vgg, args.ranks, root / "tpdp", tp=8)
            if not args.keep:
                shutil.rmtree(root / "tpdp", ignore_errors=True)
            run("PP=4 x DP vgg13", vgg, args.ranks, root / "ppdp", pp=4)
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
