"""Benchmark of ``ettools replay --symmetric`` on written plans of thousands of ranks (issue 27 item 3).

Run: ``python tests/bench/bench_replay_symmetric.py [--big] [--readme]``. Writes two synthesized plans with
``ettools synth`` into a temporary folder — GPT-3-175B TP 8 × PP 8 × DP 16 (1,024 ranks) and
Llama-3-70B TP 8 × DP 512 (4,096 ranks) — and times, as whole processes, ``ettools replay DIR
--symmetric --json --quiet`` against its anchor measured in the same run: the same command on a
folder holding only the representatives' files (one per structure digest, ``--allow-missing-ranks``),
i.e. what reading and replaying the representatives alone costs. Prints wall and CPU seconds, the
ratio to the anchor (target ≤ 1.5×), the rank files built from their headers, the growth of the
wall time from 1,024 to 4,096 ranks, and the issue's absolute target (≤ 5 s at 4,096 ranks on this
machine; with ``--big`` (and ``--readme``) also Llama-3-70B TP 8 × PP 4 × DP 1,024, 32,768 ranks, 19 GB written, against
≤ 30 s). The anchor's step time is printed beside (a folder of representatives alone sizes the
default network by its highest rank file, so it can differ slightly). ``--readme`` prints the row of the Speed
table of ``replay/README.md`` (block ``<!-- bench:replay_symmetric -->``).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLANS = [
    ("GPT-3-175B TP 8 × PP 8 × DP 16", 1024,
     ["--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "16", "--batch", "256", "--micro-batch", "16"]),
    ("Llama-3-70B TP 8 × DP 512", 4096,
     ["--model", "llama3-70b", "--tp", "8", "--dp", "512", "--batch", "512", "--micro-batch", "512"]),
]
BIG = ("Llama-3-70B TP 8 × PP 4 × DP 1,024", 32768,
       ["--model", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "1024", "--batch", "8192", "--micro-batch", "1024"])
TARGET_32768_S = 30.0
TARGET_RATIO = 1.5
TARGET_4096_S = 5.0


def _timed(cmd: list[str]) -> tuple[float, float, dict]:
    """Wall and CPU seconds of one child process, and its JSON output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(out)


def _representatives(folder: Path, into: Path) -> int:
    """Copy one rank file per structure digest (the first) and comm_group.json into ``into``."""
    from ettools.converters.chakra.reader import read_header
    from ettools.filenames import rank_from_name

    into.mkdir()
    seen: set[str] = set()
    files = sorted(folder.glob("*.et"), key=rank_from_name)
    for f in files:
        d = (read_header(f) or {}).get("structure") or f.name  # no digest: its own class
        if d not in seen:
            seen.add(d)
            shutil.copy(f, into / f.name)
    shutil.copy(folder / "comm_group.json", into / "comm_group.json")
    return len(seen)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", action="store_true", help="print the README block")
    ap.add_argument("--big", action="store_true", help="also the 32,768-rank plan (19 GB written; "
                                                      "--readme runs it too)")
    args = ap.parse_args()
    args.big = args.big or args.readme
    exe = [sys.executable, "-m", "ettools.cli"]
    root = Path(tempfile.mkdtemp(prefix="bench_symrep_"))
    rows = []
    try:
        for label, world, synth in [*PLANS, *([BIG] if args.big else [])]:
            folder = root / f"r{world}"
            subprocess.run([*exe, "synth", *synth, "-o", str(folder), "--quiet"], check=True, capture_output=True)
            reps = _representatives(folder, root / f"reps{world}")
            wall, cpu, res = _timed([*exe, "replay", str(folder), "--symmetric", "--json", "--quiet"])
            a_wall, a_cpu, a_res = _timed([*exe, "replay", str(root / f"reps{world}"), "--allow-missing-ranks",
                                           "--json", "--quiet"])
            same = math.isclose(res["step_time_us"], a_res["step_time_us"], rel_tol=1e-9)
            rows.append((label, world, reps, wall, cpu, a_wall, a_cpu, res, same))
            shutil.rmtree(folder, ignore_errors=True)  # the next plan's bytes need the room
            print(f"{label} ({world:,} ranks, {reps} representative files): --symmetric {wall:.2f} s wall "
                  f"{cpu:.2f} s CPU ({res['ranks_from_headers']:,} rank files built from their headers, "
                  f"{res['simulated_ranks']} simulated); anchor (representatives' files alone) {a_wall:.2f} s wall "
                  f"{a_cpu:.2f} s CPU; ratio {wall / a_wall:.2f}x wall, {cpu / a_cpu:.2f}x CPU (target <= "
                  f"{TARGET_RATIO}x); step {res['step_time_us'] / 1e3:.3f} ms, anchor's "
                  f"{a_res['step_time_us'] / 1e3:.3f} ms{'' if same else ' (differs)'}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    growth = math.log(rows[1][3] / rows[0][3]) / math.log(rows[1][1] / rows[0][1])
    big = rows[1][3]
    huge = rows[2][3] if len(rows) > 2 else None
    print(f"wall growth 1,024 -> 4,096 ranks: exponent {growth:.2f}; 4,096 ranks in {big:.2f} s "
          f"(target <= {TARGET_4096_S} s: {'met' if big <= TARGET_4096_S else 'not met'})"
          + (f"; 32,768 ranks in {huge:.2f} s (target <= {TARGET_32768_S} s: "
             f"{'met' if huge <= TARGET_32768_S else 'not met'})" if huge is not None else ""))
    if args.readme:
        print("<!-- readme:begin -->")
        print("| plan (written by `ettools synth`) | ranks | `replay --symmetric` wall / CPU | representatives' files "
              "alone (anchor) | ratio | rank files built from headers |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for label, world, reps, wall, cpu, a_wall, a_cpu, res, _same in rows:
            print(f"| {label} | {world:,} | {wall:.2f} / {cpu:.2f} s | {a_wall:.2f} / {a_cpu:.2f} s "
                  f"({reps} files) | **{wall / a_wall:.2f}×** | {res['ranks_from_headers']:,} |")
        print()
        print(f"Whole processes, one run on this 2-core machine (`bench_replay_symmetric.py`); targets: ≤ "
              f"{TARGET_RATIO}× the anchor, ≤ {TARGET_4096_S:.0f} s at 4,096 ranks "
              f"({'met' if big <= TARGET_4096_S else 'not met'}: {big:.2f} s)"
              + (f", ≤ {TARGET_32768_S:.0f} s at 32,768 ranks ({'met' if huge <= TARGET_32768_S else 'not met'}: "
                 f"{huge:.2f} s)" if huge is not None else "")
              + f"; wall growth from 1,024 to 4,096 ranks: exponent {growth:.2f}.")
        print("<!-- readme:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
