"""Kineto load time vs plain ``orjson.loads`` of the same file (target: ≤ 1.5×).

Run: ``python tests/bench/bench_kineto.py [--repeat N] [FILE...]`` (default: the largest shared
traces, ``et_kineto/param_resnet/kineto.json.gz`` and ``kineto/hta_fwdbwd_1rank``).

Both sides include reading and gunzipping the file and freeing the parsed JSON, so the ratio is
"build the graph" over "just parse it". The baseline is timed twice: as a plain call (Python's
garbage collector on, the default) and with the collector off (``read_kineto`` switches it off
while it parses and builds, since nothing it allocates is cyclic garbage). Best of N runs each, the
three alternated in each round so that a busy machine slows them alike.
Also prints the replayable pass and its ASAP self-replay.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from pathlib import Path

import orjson

from ettools.converters.kineto import read_kineto
from ettools.io import read_bytes
from ettools.replayable import asap_schedule, to_replayable

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
DEFAULT = [SHARED / "et_kineto/param_resnet/kineto.json.gz", SHARED / "kineto/hta_fwdbwd_1rank/rank0.json.gz"]


def _parse(path: Path, gc_off: bool) -> tuple[float, float]:
    was = gc.isenabled()
    if gc_off:
        gc.disable()
    try:
        t, c = time.perf_counter(), time.process_time()
        data = orjson.loads(read_bytes(path))
        del data
        return time.perf_counter() - t, time.process_time() - c
    finally:
        if was:
            gc.enable()


def _read(path: Path) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    trace = read_kineto(path)
    del trace
    return time.perf_counter() - t, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    files = args.files or DEFAULT
    print(f"{'file':48s} {'events':>8s} {'nodes':>7s} {'loads':>8s} {'loads-gc':>9s} {'read_kineto':>11s} "
          f"{'ratio':>6s} {'ratio-gc':>8s} {'ratio-cpu':>9s}")
    worst = 0.0
    for path in files:
        _read(path)  # warm the page cache and imports
        # alternated, so that a busy machine slows every side alike; best of N each
        runs = [(_parse(path, False), _parse(path, True), _read(path)) for _ in range(args.repeat)]
        plain, nogc, ours = (min(run[k][0] for run in runs) for k in range(3))
        plain_cpu, ours_cpu = min(run[0][1] for run in runs), min(run[2][1] for run in runs)
        trace = read_kineto(path)
        events = len(orjson.loads(read_bytes(path))["traceEvents"])
        name = str(path.relative_to(SHARED)) if path.is_relative_to(SHARED) else str(path)
        print(f"{name:48s} {events:8d} {trace.num_nodes:7d} {plain * 1e3:7.0f}ms {nogc * 1e3:8.0f}ms "
              f"{ours * 1e3:10.0f}ms {ours / plain:6.2f} {ours / nogc:8.2f} {ours_cpu / plain_cpu:9.2f}")
        worst = max(worst, ours / plain)
        for g in trace:
            t = time.perf_counter()
            rg = to_replayable(g)
            t_pass = time.perf_counter() - t
            t = time.perf_counter()
            _, end = asap_schedule(rg)
            t_asap = time.perf_counter() - t
            print(f"    rank {g.rank}: to_replayable {t_pass * 1e3:.0f}ms ({len(g)} -> {len(rg)} nodes), "
                  f"ASAP replay {t_asap * 1e3:.0f}ms")
    print("ratio = read_kineto / (read + gunzip + orjson.loads + free), GC on as in a plain call; "
          "ratio-gc = same with the GC off for the baseline too; ratio-cpu = ratio of the process CPU "
          "times (steadier than wall time on a busy machine). Target <= 1.5.")
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
