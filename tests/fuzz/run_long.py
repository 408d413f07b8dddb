"""Long fuzz run: ``python tests/fuzz/run_long.py [N] [SEED] [START]`` prints counts per outcome
class (ok / clean / exit1 / traceback / hang / leftover) and the first cases of each bad class.
Deterministic: the same N, SEED and START give the same cases and outcomes.

Every case runs in this process (click's CliRunner, a SIGALRM time limit per run): ~25 ms a case
on the shipped seeds instead of ~1 s for a fresh interpreter. A progress line with the counts so
far is printed every 1,000 cases, so a run cut short still gives its figure."""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import fuzz  # noqa: E402

CLASSES = ("ok", "clean", "exit1", "traceback", "hang", "leftover", "harness")
BAD = ("traceback", "hang", "leftover", "harness")


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    start = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    counts: Counter = Counter()
    details: dict[str, list[str]] = {}
    for lo in range(start, start + n, 1000):
        c, d = fuzz(min(1000, start + n - lo), seed, lo, keep=10)
        counts.update(c)
        for cls, items in d.items():
            details.setdefault(cls, []).extend(items[: 10 - len(details.get(cls, []))])
            for item in items:
                print(f"[{cls}] {item}", flush=True)
        done = sum(counts.values())
        print(f"progress: {done} runs in {time.perf_counter() - t0:.0f} s: "
              + ", ".join(f"{k} {counts.get(k, 0)}" for k in CLASSES), flush=True)
    dt = time.perf_counter() - t0
    print(f"runs: {sum(counts.values())} in {dt:.0f} s (seed {seed}, cases {start}..{start + n - 1})")
    for cls in CLASSES:
        print(f"  {cls:10s} {counts.get(cls, 0)}")
    for cls, items in details.items():
        print(f"\n--- {cls}")
        for item in items:
            print(item)
    return 1 if any(counts.get(c) for c in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
