"""Re-capture every sample scenario and rewrite ``manifest.json``.

``python -m sample_traces.regenerate [SCENARIO ...] [--jobs N]`` (from the repository root, or
``python sample_traces/regenerate.py``). Each scenario's training script runs under
:func:`ettools.capture.capture` with step :data:`~sample_traces.scenarios.CAPTURED_STEP`
recorded; the traces land in ``sample_traces/<scenario>/rank<N>.{kineto,et}.json.gz``. The
manifest records per scenario the model config, parallel plan, world size, torch version, files,
the losses printed by the script, parameter counts and the collectives the plan implies.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a file: make `sample_traces` importable
    sys.path.insert(0, str(REPO))

from ettools.capture import CaptureError, capture  # noqa: E402
from ettools.io import load_json, write_json  # noqa: E402
from sample_traces.scenarios import (  # noqa: E402
    CAPTURED_STEP,
    SCENARIOS,
    STEPS,
    Scenario,
    expected_collectives,
    param_counts,
)

MANIFEST = HERE / "manifest.json"
_LOSS = re.compile(r"^\S+ rank (\d+) step (\d+) loss (\S+)$", re.M)


def run_scenario(sc: Scenario) -> dict:
    """Capture one scenario; returns its manifest entry (raises :class:`CaptureError`)."""
    t0 = time.perf_counter()
    outdir = HERE / sc.name
    res = capture(
        [sys.executable, "-m", "sample_traces.train", sc.name, "--steps", str(STEPS)],
        outdir,
        steps=(CAPTURED_STEP, CAPTURED_STEP),
        memory=True,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if res.returncode != 0 or res.ranks != list(range(sc.world)) or res.captured_steps != [CAPTURED_STEP]:
        sys.stderr.write(res.stderr.decode(errors="replace"))
        raise CaptureError(
            f"{sc.name}: exit code {res.returncode}, ranks {res.ranks}, steps {res.captured_steps}", 1, res
        )
    versions = {p["torch_version"] for p in res.processes if p.get("torch_version")}
    losses = {f"{int(s)}": float(v) for _, s, v in _LOSS.findall(res.stdout.decode())}
    cfg = sc.cfg.to_dict()
    cfg["head_dim"] = sc.cfg.head_dim
    if sc.cfg.moe_experts:
        cfg["moe_capacity"] = sc.cfg.capacity(sc.cfg.seq * sc.cfg.batch)
    entry = {
        "description": sc.description,
        "world_size": sc.world,
        "config": cfg,
        "plan": sc.plan,
        "steps_run": STEPS,
        "captured_step": CAPTURED_STEP,
        "torch_version": sorted(versions)[0] if versions else None,
        "files": {
            str(r): {
                "kineto": f"{sc.name}/rank{r}.kineto.json.gz",
                "et": f"{sc.name}/rank{r}.et.json.gz",
            }
            for r in range(sc.world)
        },
        "loss": losses,
        "param_counts": param_counts(sc.cfg),
        "expected_collectives": expected_collectives(sc),
    }
    print(f"  {sc.name:<11} {sc.world} rank(s) {time.perf_counter() - t0:5.1f} s", flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    """Regenerate the chosen scenarios (default: all) and the manifest."""
    ap = argparse.ArgumentParser(description="Re-capture the sample traces.")
    ap.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"default: all of {', '.join(SCENARIOS)}"
    )
    ap.add_argument("--jobs", type=int, default=2, help="scenarios captured at once (default 2)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    names = args.scenarios or list(SCENARIOS)
    t0 = time.perf_counter()
    manifest = load_json(MANIFEST) if MANIFEST.exists() and args.scenarios else {"scenarios": {}}
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            entries = dict(zip(names, pool.map(lambda n: run_scenario(SCENARIOS[n]), names), strict=True))
    except CaptureError as e:
        print(f"regenerate: {e}", file=sys.stderr)
        return e.exit_code or 1
    manifest["scenarios"].update(entries)
    manifest["scenarios"] = {n: manifest["scenarios"][n] for n in SCENARIOS if n in manifest["scenarios"]}
    manifest["generated_by"] = "python -m sample_traces.regenerate"
    manifest["conventions"] = {
        "layout": "activations [seq, batch, hidden], float32, linears without bias",
        "batch": "per model replica per optimizer step (per rank for DDP/FSDP/MoE; shared by TP ranks; split into micro-batches for PP)",
        "captured_step": "1-based optimizer step recorded by ettools capture; earlier steps are warm-up",
        "expected_collectives": "per rank; shape = input tensor of one call; bytes per call with Chakra comm_size meaning (all_reduce: buffer, all_gather: per-rank input, reduce_scatter: full input, all_to_all: per-rank total, send/recv: message)",
    }
    write_json(MANIFEST, manifest, indent=True)
    print(f"regenerated {len(entries)} scenario(s) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
