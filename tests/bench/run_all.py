"""Run every benchmark in this folder, one after another, and print their figures.

Usage: ``python tests/bench/run_all.py [NAME ...]`` (names like ``kineto``, ``chakra``; default all).
Each ``bench_*.py`` is a standalone script printing its own figures and target ratios; they are
not collected by pytest.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; exit non-zero if any script failed."""
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in argv]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"--- {script.name}: exit {rc}, {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
