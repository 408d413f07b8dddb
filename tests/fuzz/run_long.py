"""Long fuzz run: ``python tests/fuzz/run_long.py [N] [SEED] [START] [--kind inputs|options|both]``
prints counts per outcome class and the first cases of each bad class.

- ``inputs`` (default): N mutants of real traces (:mod:`harness`);
- ``options``: N option cases of every subcommand (:mod:`options`);
- ``both``: N of each, in alternating blocks of 1,000 (2N runs).

Deterministic: the same N, SEED, START and kind give the same cases and outcomes (cases are numbered
by (seed, index) only, so a run cut in blocks gives the same cases as one long run).

Every case runs in this process (click's CliRunner, a SIGALRM time limit per run): ~25-40 ms a
case instead of ~1 s for a fresh interpreter. A progress line with the counts so far is printed
every 1,000 cases of each kind, so a run cut short still gives its figure. The address space is
capped (``--memory-gib``, default 8) so that a number that reaches an allocation fails with
MemoryError in this process instead of taking a shared machine's memory.

Stop a run with SIGKILL: SIGTERM and SIGINT reach the command in flight, which ends that case with
its own exit 143/130 (counted as a traceback) and the run goes on."""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import fuzz  # noqa: E402
from options import fuzz_options  # noqa: E402

CLASSES = ("ok", "clean", "exit1", "launch", "traceback", "hang", "leftover", "oom", "exit1-undocumented",
           "exit2-lines", "harness")
BAD = ("traceback", "hang", "leftover", "oom", "exit1-undocumented", "exit2-lines", "harness")


def _line(counts: Counter) -> str:
    return ", ".join(f"{k} {counts.get(k, 0)}" for k in CLASSES if k in counts or k in BAD)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=1000, help="cases (of each kind with --kind both)")
    ap.add_argument("seed", nargs="?", type=int, default=0)
    ap.add_argument("start", nargs="?", type=int, default=0, help="first case index")
    ap.add_argument("--kind", choices=("inputs", "options", "both"), default="inputs")
    ap.add_argument("--memory-gib", type=float, default=8.0, help="address-space cap of this process (0: none)")
    a = ap.parse_args()
    if a.memory_gib > 0:
        cap = int(a.memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    kinds = ("inputs", "options") if a.kind == "both" else (a.kind,)
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    counts: dict[str, Counter] = {k: Counter() for k in kinds}
    details: dict[str, list[str]] = {}
    for lo in range(a.start, a.start + a.n, 1000):
        size = min(1000, a.start + a.n - lo)
        for kind in kinds:
            if kind == "inputs":
                c, d = fuzz(size, a.seed, lo, keep=10)
            else:
                c, d = fuzz_options(size, a.seed, lo, keep=10)
            counts[kind].update(c)
            for cls, items in d.items():
                if cls not in BAD:
                    continue
                for item in items:
                    print(f"[{kind} {cls}] {item}", flush=True)
                    if len(details.setdefault(f"{kind} {cls}", [])) < 10:
                        details[f"{kind} {cls}"].append(item)
            print(f"progress {kind}: {sum(counts[kind].values())} runs, {time.perf_counter() - t0:.0f} s: "
                  + _line(counts[kind]), flush=True)
    dt = time.perf_counter() - t0
    total: Counter = sum(counts.values(), Counter())
    print(f"runs: {sum(total.values())} in {dt:.0f} s (seed {a.seed}, cases {a.start}..{a.start + a.n - 1}, "
          f"kind {a.kind})")
    for kind in kinds:
        print(f"  {kind}: {sum(counts[kind].values())} runs: {_line(counts[kind])}")
    for cls in CLASSES:
        print(f"  {cls:20s} {total.get(cls, 0)}")
    for cls, items in details.items():
        print(f"\n--- {cls}")
        for item in items:
            print(item)
    return 1 if any(total.get(c) for c in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
