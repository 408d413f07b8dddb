"""Benchmark of ``ettools replay`` (issue 5): nodes simulated per second on a synthesized 256-rank GPT trace.

Run: ``python tests/bench/bench_replay.py [--batch 128] [--micro-batch 8] [--readme]``. Synthesizes
GPT-3-5B with dp8 tp8 pp4 (256 ranks; batch 128 in micro-batches of 8 gives 16 micro-batches,
~720K nodes) and replays it without and with symmetry, printing wall and CPU seconds, nodes per
second and the predicted step time. (The comparison with ASTRA-sim on the same files, measured in
the same run, is ``bench_astrasim.py``'s.) ``--readme`` prints the first row of the Speed table of
``replay/README.md`` (block ``<!-- bench:replay -->``) between ``<!-- readme:begin -->`` and
``<!-- readme:end -->``.
"""

from __future__ import annotations

import argparse
import resource
import time

from ettools.converters.symbolic import synthesize
from ettools.replay import replay_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt3-5b")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--network", default=None, help="ASTRA-sim network YAML (default: the hardware's)")
    ap.add_argument("--readme", action="store_true", help="print the README block")
    args = ap.parse_args()
    t0 = time.perf_counter()
    syn = synthesize(args.model, dp=8, tp=8, pp=4, batch=args.batch, micro_batch=args.micro_batch)
    trace = syn.trace
    nodes = trace.num_nodes
    print(f"synthesized {args.model} dp8 tp8 pp4: {len(trace.graphs)} ranks, {nodes:,} nodes "
          f"in {time.perf_counter() - t0:.2f} s", flush=True)
    results, cpus, sims = {}, {}, {}
    for symmetric in (False, True):
        c0, w0 = time.process_time(), time.perf_counter()
        res = replay_trace(trace, network=args.network, symmetric=symmetric)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        results[symmetric], cpus[symmetric] = wall, cpu
        sim = sims[symmetric] = res.built.program.n
        print(f"symmetric={symmetric!s:5}: wall {wall:6.2f} s, CPU {cpu:6.2f} s "
              f"({', '.join(f'{k} {v:.2f}' for k, v in res.timings.items())}); "
              f"{nodes / wall:,.0f} trace nodes/s, {sim:,} nodes simulated ({sim / max(res.timings['simulate_s'], 1e-9):,.0f}/s "
              f"in the event loop); {len(res.built.sim_ranks)} ranks simulated; step {res.step_time_us / 1000:.3f} ms",
              flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"symmetry: {results[False] / results[True]:.1f}x faster than every rank; peak RSS {rss:.0f} MB")
    if args.readme:
        print("<!-- readme:begin -->")
        print("| what | figure | target / anchor |\n| --- | --- | --- |")
        print(f"| Replay, synthesized {args.model} dp8 tp8 pp4 ({len(trace.graphs)} ranks, {nodes:,} nodes, "
              f"`bench_replay.py`, one run) | **{results[False]:.2f} s** wall ({cpus[False]:.2f} s CPU, "
              f"{nodes / results[False]:,.0f} nodes/s); {results[True]:.2f} s with `--symmetric` "
              f"({results[False] / results[True]:.0f}×) | ASTRA-sim on the same ranks: the next table |")
        print("<!-- readme:end -->")


if __name__ == "__main__":
    main()
