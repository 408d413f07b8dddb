"""Benchmark of ``ettools search`` (issue 16): plans per minute, prune rates, replay time per plan.

Run: ``python tests/bench/bench_search.py [--quick] [--workers N]``. The full run is the issue's
target: Llama-3-70B on 1,024 H100s, batch 1,024 × 4,096 tokens, over dp/tp/pp/sp/ZeRO/recompute/
micro-batch/schedule (the default space), exhaustive, no cache — at least 1,000 plans considered
in at most 10 minutes on a 2-core machine. ``--quick`` searches GPT-3-5B (4 layers) on 16 GPUs.
It prints the counts (pruned by reason, replayed), plans per minute, the time per phase per plan
(synthesis, bound, replay), the CPU seconds of the workers, and the best plan.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ettools.replay.search import search
from ettools.replay.search.space import plan_label


def main() -> int:
    """Run one search and print its figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="GPT-3-5B (4 layers) on 16 GPUs instead")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if a.quick:
        label, kw = "GPT-3-5B (L=4) on 16 H100", dict(model="gpt3-5b", gpus=16, batch=32, seq=1024, dims={"L": 4})
    else:
        label, kw = "Llama-3-70B on 1,024 H100, batch 1,024 x 4,096", dict(model="llama3-70b", gpus=1024,
                                                                           batch=1024, seq=4096)
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = search(kw.pop("model"), kw.pop("gpus"), **kw, cache_dir=None, workers=a.workers, top=5, progress=False)
    wall = time.perf_counter() - t0
    j = res.to_json()
    n = j["considered"]
    print(f"{label}: exhaustive, {a.workers} workers, top 5")
    print(f"  considered {n:,} plans in {wall:.1f} s = {60 * n / wall:,.0f} plans/minute "
          f"(target: >= 1,000 in <= 600 s: {'met' if n >= 1000 and wall <= 600 else 'NOT met'})")
    for why, k in j["pruned"].items():
        print(f"  pruned {why:<8} {k:>6,}  ({100 * k / n:5.1f} %)")
    print(f"  replayed        {j['replayed']:>6,}  ({100 * j['replayed'] / n:5.1f} %)")
    for phase in ("synth", "bound", "replay"):
        xs = [t["seconds"][phase] for t in res.trials if t.get("seconds", {}).get(phase) is not None]
        if xs:
            print(f"  {phase:<7} per plan: mean {statistics.mean(xs):.3f} s, median {statistics.median(xs):.3f} s, "
                  f"max {max(xs):.3f} s over {len(xs):,} plans (sum {sum(xs):.1f} s)")
    print(f"  parent CPU {time.process_time() - c0:.1f} s; bound violations {res.bound_violations}")
    b = res.best
    if b:
        print(f"  best: {plan_label(b['plan'])}: {b['step_time_us'] / 1e3:,.1f} ms/step, "
              f"{b['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU {100 * (b['mfu'] or 0):.1f} %, "
              f"peak {b['peak_memory_bytes'] / 2**30:.1f} GiB (compute {b['compute_us'] / 1e3:,.1f} ms, exposed comm "
              f"{b['exposed_comm_us'] / 1e3:,.1f} ms, bubble {b['bubble_us'] / 1e3:,.1f} ms)")
    print(res.table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
