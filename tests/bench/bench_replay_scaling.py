"""How full-rank replay time and memory grow with ranks and with micro-batches (issue 27, item 2).

Run: ``python tests/bench/bench_replay_scaling.py [--max-dp 32] [--max-micro 64] [--readme]``
(``--readme``: also print the README block ``<!-- bench:replay_scaling -->`` of ``replay/README.md``
between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``; ``run_all.py --update-readme
replay_scaling`` puts it there).

Synthesizes GPT-3-5B with TP 8 × PP 4 and replays every rank (``symmetric=False``) in ASTRA-sim mode
(the real ASTRA-sim's ``Switch8x32_256npus.yml``-shaped two-tier switch, ``sys_ring_2d.json``):

* ranks: DP 2, 8, 32 (64, 256, 1,024 ranks) at 4 micro-batches;
* micro-batches: 4, 16, 64 at DP 2 (64 ranks).

Per case it prints nodes, the event loop's and the whole replay's seconds, and the replay's peak
RSS growth per node (``ru_maxrss`` of a fresh child process that synthesizes and replays one case,
less the same child's RSS after synthesis). The exponent of each series is the least-squares slope
of log time on log nodes: the target is ≤ 1.05 (linear), and ≤ 150 B of RSS per node.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASTRA = REPO.parent / "shared" / "tools" / "astrasim" / "configs"
TARGET_EXPONENT = 1.05
TARGET_BYTES_PER_NODE = 150.0

_CHILD = r"""
import json, resource, sys, time
from ettools.converters.symbolic import synthesize
from ettools.replay import replay_trace
dp, micro, network, system = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
syn = synthesize("gpt3-5b", dp=dp, tp=8, pp=4, batch=micro * dp, micro_batch=dp)  # global sizes: one sample per rank per micro-batch
trace = syn.trace
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
res = replay_trace(trace, network=network, collectives=system, symmetric=False, memory=False)
wall = time.perf_counter() - t0
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ranks": len(trace.graphs), "nodes": trace.num_nodes, "wall_s": wall,
                  "loop_s": res.timings.get("simulate_s", float("nan")), "timings": res.timings,
                  "rss_growth_bytes": (rss1 - rss0) * 1024, "step_ms": res.step_time_us / 1e3}))
"""


def _network(ranks: int, work: Path) -> Path:
    """A two-tier switch like ASTRA-sim's Switch8x32 config, with ``ranks / 8`` machines."""
    p = work / f"Switch8x{ranks // 8}.yml"
    p.write_text(f"topology: [ Switch, Switch ]\nnpus_count: [ 8, {ranks // 8} ]\n"
                 "bandwidth: [ 400.0, 50.0 ]  # GB/s\nlatency: [ 500.0, 2000.0 ]  # ns\n")
    return p


def run_case(dp: int, micro: int, work: Path) -> dict:
    """Synthesize and replay one case in a fresh process; its figures."""
    ranks = 32 * dp
    out = subprocess.run([sys.executable, "-c", _CHILD, str(dp), str(micro), str(_network(ranks, work)),
                          str(ASTRA / "sys_ring_2d.json")], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(rows: list[dict], key: str) -> float:
    """Least-squares slope of log(row[key]) on log(nodes)."""
    xs = [math.log(r["nodes"]) for r in rows]
    ys = [math.log(r[key]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-dp", type=int, default=32)
    ap.add_argument("--max-micro", type=int, default=64)
    ap.add_argument("--readme", action="store_true", help="print the README block")
    args = ap.parse_args()
    block = ["| series | ranks | micro-batches | nodes | event loop s | whole replay s | RSS B/node |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    summary = []
    if not ASTRA.is_dir():
        print(f"no ASTRA-sim configs at {ASTRA}")
        return 1
    series = {"ranks (DP 2, 8, 32 at 4 micro-batches)": [(dp, 4) for dp in (2, 8, 32) if dp <= args.max_dp],
              "micro-batches (4, 16, 64 at 64 ranks)": [(2, m) for m in (4, 16, 64) if m <= args.max_micro]}
    with tempfile.TemporaryDirectory() as tmp:
        for label, cases in series.items():
            print(f"\n{label}")
            print(f"{'ranks':>6} {'micro':>6} {'nodes':>11} {'loop s':>8} {'replay s':>9} {'B/node':>7} {'step ms':>10}")
            rows = []
            for dp, micro in cases:
                r = run_case(dp, micro, Path(tmp))
                r["micro"] = micro
                rows.append(r)
                print(f"{r['ranks']:>6} {micro:>6} {r['nodes']:>11,} {r['loop_s']:>8.2f} {r['wall_s']:>9.2f} "
                      f"{r['rss_growth_bytes'] / r['nodes']:>7.0f} {r['step_ms']:>10.1f}", flush=True)
                block.append(f"| {label.split(' (')[0]} | {r['ranks']:,} | {micro} | {r['nodes']:,} | {r['loop_s']:.2f} | "
                             f"{r['wall_s']:.2f} | {r['rss_growth_bytes'] / r['nodes']:.0f} |")
            if len(rows) >= 2:
                print(f"exponent in nodes: event loop {exponent(rows, 'loop_s'):.3f}, whole replay "
                      f"{exponent(rows, 'wall_s'):.3f} (target <= {TARGET_EXPONENT}); largest case "
                      f"{rows[-1]['rss_growth_bytes'] / rows[-1]['nodes']:.0f} B RSS per node "
                      f"(target <= {TARGET_BYTES_PER_NODE:.0f})")
                summary.append(f"in {label.split(' (')[0]}: exponent {exponent(rows, 'wall_s'):.2f} whole replay, "
                               f"{exponent(rows, 'loop_s'):.2f} event loop")
    if args.readme:
        print("<!-- readme:begin -->")
        print("\n".join(block))
        print(f"\nFull-rank replay in ASTRA-sim mode (GPT-3-5B TP 8 × PP 4, every rank simulated), growth with "
              f"the node count {'; '.join(summary)} (target ≤ {TARGET_EXPONENT}); RSS growth per node "
              f"target ≤ {TARGET_BYTES_PER_NODE:.0f} B. Seconds are this machine's, under whatever load it had.")
        print("<!-- readme:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
