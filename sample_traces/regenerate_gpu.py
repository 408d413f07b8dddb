"""Capture the sample decoder on a real GPU: ``python -m sample_traces.regenerate_gpu OUT [SIZE ...]``.

Runs ``ettools capture --steps 6 -- python -m sample_traces.train_gpu SIZE`` for each size (all
by default) and writes ``OUT/<size>/rank0.{kineto,et}.json.gz`` plus ``OUT/manifest.json`` with
the GPU, driver, torch version, each size's model config and dtype and the wall time. Needs a
CUDA or ROCm device; the traces in ``sample_traces/gpu/`` were made with it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sample_traces.train_gpu import GPU_SIZES, STEPS


def _device_facts() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
    }


def main(argv: list[str] | None = None) -> int:
    """Capture the chosen sizes into ``OUT`` and write its manifest."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("sizes", nargs="*", metavar="SIZE", help=f"default: all of {', '.join(GPU_SIZES)}")
    ap.add_argument("--steps", default=str(STEPS), help=f"optimizer steps to record, N or N-M (default {STEPS})")
    args = ap.parse_args(argv)
    unknown = [s for s in args.sizes if s not in GPU_SIZES]
    if unknown:
        ap.error(f"unknown size(s) {unknown}; choose from {', '.join(GPU_SIZES)}")
    manifest = {"generated_by": "python -m sample_traces.regenerate_gpu", "captured_steps": args.steps,
                "device": _device_facts(), "sizes": {}}
    for size in args.sizes or list(GPU_SIZES):
        cfg, dtype = GPU_SIZES[size]
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "ettools", "capture", "-q", "--steps", args.steps,
               "-o", str(args.out / size), "--", sys.executable, "-m", "sample_traces.train_gpu", size]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        print(f"{size}: exit {proc.returncode} in {wall:.1f} s", flush=True)
        if proc.returncode:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        losses = [float(line.rsplit(" ", 1)[1]) for line in proc.stdout.splitlines() if " loss " in line]
        manifest["sizes"][size] = {"config": cfg.to_dict(), "dtype": dtype, "wall_s": round(wall, 1),
                                   "loss": losses}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
