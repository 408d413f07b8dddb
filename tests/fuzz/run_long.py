"""Long fuzz run: ``python tests/fuzz/run_long.py [N] [SEED] [START]`` prints counts per outcome
class (ok / clean / exit1 / traceback / hang / leftover) and the first cases of each bad class.
Deterministic: the same N, SEED and START give the same cases and outcomes."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import fuzz  # noqa: E402


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    start = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    counts, details = fuzz(n, seed, start, keep=10)
    dt = time.perf_counter() - t0
    print(f"runs: {sum(counts.values())} in {dt:.0f} s (seed {seed}, cases {start}..{start + n - 1})")
    for cls in ("ok", "clean", "exit1", "traceback", "hang", "leftover"):
        print(f"  {cls:10s} {counts.get(cls, 0)}")
    for cls, items in details.items():
        print(f"\n--- {cls}")
        for d in items:
            print(d)
    return 1 if any(counts.get(c) for c in ("traceback", "hang", "leftover")) else 0


if __name__ == "__main__":
    sys.exit(main())
