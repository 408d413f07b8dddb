"""Benchmark of ``ettools serve`` (issue 17): simulated requests per minute of wall time.

Run: ``python tests/bench/bench_serve.py [--rate R] [--duration S]``. Workload: one hour of
Poisson arrivals for Llama-3-8B on 8 H100s (8 engines of TP 1), prompts uniform 128–2,048 tokens,
outputs geometric with mean 256; continuous and chunked-prefill batching. It prints the wall time
(the step replays included), requests simulated per minute (target ≥ 10,000 on 2 cores) and the
latency figures.
"""

from __future__ import annotations

import argparse
import time

from ettools.replay.serve import StepCost, simulate_serving, synthetic


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=40.0, help="requests per second (all 8 GPUs)")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of arrivals")
    args = ap.parse_args()
    w = synthetic(args.rate, None, args.duration, "128-2048", "exp:256", seed=0)
    print(f"workload: {len(w):,} requests, Poisson {args.rate}/s over {args.duration:.0f} s; Llama-3-8B, 8 × H100 TP 1")
    for policy in ("continuous", "chunked"):
        t0 = time.perf_counter()
        cost = StepCost("llama3-8b", system="H100")
        r = simulate_serving("llama3-8b", w, gpus=8, scheduler=policy, cost=cost, slo_ttft_ms=500, slo_tpot_ms=50)
        wall = time.perf_counter() - t0
        j = r.to_json()
        print(f"{policy:>10}: {wall:6.2f} s wall ({cost.replays} step replays) -> "
              f"{len(w) / wall * 60:,.0f} requests simulated per minute (target >= 10,000); "
              f"TTFT p50/p99 {j['ttft_ms']['p50']:.1f}/{j['ttft_ms']['p99']:.1f} ms, "
              f"TPOT p50/p99 {j['tpot_ms']['p50']:.2f}/{j['tpot_ms']['p99']:.2f} ms, "
              f"{j['throughput_rps']:.1f} req/s, {j['tokens_per_s']:,.0f} tok/s, goodput {j['goodput_rps']:.1f} req/s, "
              f"KV peak {100 * j['kv']['peak_utilization']:.1f} %")


if __name__ == "__main__":
    main()
