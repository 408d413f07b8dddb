"""``ettools scale``: rescale and re-parallelize a real trace."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ettools.cli.common import STEPS_HELP, WRITE_FORMATS, _check_world, _name_option, _outdir
from ettools.cli_options import (
    MAX_DIM,
    MAX_WORLD,
    FiniteRange,
    _fail,
    handle_errors,
    print_json,
    quiet_option,
)


@click.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "outdir", required=True, type=click.Path(path_type=Path),
              help="Output folder for the rewritten trace.")
@click.option("--batch", type=click.IntRange(1, MAX_DIM), default=None, help="New batch size.")
@click.option("--seq", type=click.IntRange(1, MAX_DIM), default=None, help="New sequence length.")
@click.option("--dim", "dims", multiple=True,
              help="Other dimension: NAME=NEW or NAME=OLD:NEW (e.g. hidden=64:128).")
@click.option("--dp", type=click.IntRange(1, MAX_WORLD), default=None, help="Data-parallel replicas.")
@click.option("--tp", type=click.IntRange(1, MAX_WORLD), default=None, help="Tensor-parallel ranks.")
@click.option("--sp", is_flag=True, help="Sequence parallelism with tensor parallelism (needs --tp > 1).")
@click.option("--pp", type=click.IntRange(1, MAX_WORLD), default=None, help="Pipeline stages.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b"]), default=None,
              help="Pipeline schedule with --pp (default 1f1b).")
@click.option("--micro-batches", type=click.IntRange(1), default=None, help="Micro-batches per step (with --pp).")
@click.option("--stages", default=None, help="Layers per pipeline stage, e.g. 3,3,2 (default: balanced).")
@click.option("--pp-split", type=click.Choice(["time", "ops"]), default=None,
              help="Pipeline stage split with --pp: balanced by measured time (default), or TrioSim's equal "
                   "forward-op counts.")
@click.option("--ep", type=click.IntRange(1, MAX_WORLD), default=None, help="Expert-parallel ranks (MoE).")
@click.option("--world", type=click.IntRange(1, MAX_WORLD), default=None, help="Reshard a replicated trace to this many ranks.")
@click.option("--bucket-mb", type=FiniteRange(0, 1 << 20, min_open=True), default=25.0, show_default=True,
              help="DDP gradient bucket size.")
@click.option("--dp-after-backward", "--no-overlap", "dp_after_backward", is_flag=True,
              help="Standard data parallelism with --dp: every gradient all-reduce after the whole backward pass "
                   "(default: DDP buckets overlapped with backward).")
@click.option("--ddp-host-work/--no-ddp-host-work", default=True, show_default=True,
              help="Add DDP's reducer host work (gradient copies into buckets and back) to --dp on CPU traces.")
@click.option("--fit", type=click.Path(path_type=Path), default=None,
              help="Calibrated compute fit (ettools calibrate) for rescaled durations.")
@click.option("--device-memory", type=FiniteRange(0, 1 << 20, min_open=True), default=None,
              help="Device memory in GiB: check peak per rank.")
@click.option("--to", "to", type=click.Choice(WRITE_FORMATS), default="chakra", show_default=True,
              help="Output format.")
@_name_option("trace")
@click.option("--et", type=click.Path(path_type=Path), default=None, help="PyTorch ET to link with Kineto input.")
@click.option("--steps", default=None, help=STEPS_HELP + ".")
@click.option("--json", "as_json", is_flag=True, help="Print the summary of the result (as ettools info --json).")
@quiet_option
@handle_errors
def scale(inputs: tuple[Path, ...], outdir: Path, batch: int | None, seq: int | None, dims: tuple[str, ...],
          dp: int | None, tp: int | None, sp: bool, pp: int | None, schedule: str, micro_batches: int | None,
          stages: str | None, pp_split: str | None, ep: int | None, world: int | None, bucket_mb: float,
          dp_after_backward: bool, ddp_host_work: bool,
          fit: Path | None, device_memory: float | None, to: str, name: str, et: Path | None, steps: str | None,
          as_json: bool) -> None:
    """Rescale and re-parallelize a real trace, proving every result structurally sound."""
    from ettools.convert import convert_trace
    from ettools.formats import Loaded, load_trace
    from ettools.scaler import scale_trace
    from ettools.summary import summarize

    if not any(v is not None for v in (batch, seq, dp, tp, pp, ep, world)) and not dims and not sp:
        raise click.UsageError("nothing to rewrite: give at least one of --batch, --seq, --dim, --dp, --tp, "
                               "--sp, --pp, --ep, --world")
    if pp is None and (schedule is not None or micro_batches is not None or stages is not None):
        raise click.UsageError("--schedule, --micro-batches and --stages shape a pipeline: give --pp")
    if pp is None and pp_split is not None:
        raise click.UsageError("--pp-split cuts a pipeline: give --pp")
    if dp_after_backward and dp is None and world is None:
        raise click.UsageError("--dp-after-backward shapes data parallelism: give --dp (or --world)")
    if sp and (tp or 1) < 2:
        raise click.UsageError("--sp splits the sequence over the tensor-parallel group: give --tp > 1")
    _check_world("--dp/--tp/--pp", dp=dp, tp=tp, pp=pp)
    schedule = schedule or "1f1b"
    other: dict[str, Any] = {}
    for item in dims:
        key, _, value = item.partition("=")
        old, _, new = value.partition(":")
        try:
            sizes = (int(old), int(new)) if new else (int(old),)
        except ValueError:
            raise click.BadParameter(f"expected NAME=NEW or NAME=OLD:NEW, got {item!r}", param_hint="--dim") from None
        if not all(1 <= v <= MAX_DIM for v in sizes):
            # a dimension rescales tensor shapes (int64 arrays): 2^64 overflowed in the rewrite
            raise click.BadParameter(f"{item!r}: sizes must be 1..{MAX_DIM:,}", param_hint="--dim")
        other[key.strip()] = sizes if new else sizes[0]
    try:
        stage_list = [int(x) for x in stages.split(",")] if stages else None
    except ValueError:
        raise click.BadParameter(f"expected layer counts like 3,3,2, got {stages!r}", param_hint="--stages") from None
    _outdir(outdir)
    loaded = load_trace(list(inputs), et=et, steps=steps)
    fit_obj = None
    if fit is not None:
        from ettools.replay import Fit

        fit_obj = Fit.load(fit)
    t0 = time.perf_counter()
    try:
        trace = scale_trace(loaded.trace, batch=batch, seq=seq, dims=other or None, dp=dp, tp=tp, sp=sp, pp=pp,
                            schedule=schedule, micro_batches=micro_batches, ep=ep, world=world, fit=fit_obj,
                            bucket_mb=bucket_mb, stages=stage_list, ddp_host_work=ddp_host_work,
                            pp_split=pp_split or "time", dp_overlap=not dp_after_backward,
                            device_bytes=int(device_memory * 2**30) if device_memory else None)
    except ValueError as e:  # ScaleError, and PassError (a StructuralError) naming rank and node
        _fail(f"{inputs[0]}: cannot rewrite: {e}")
    rewrite_s = time.perf_counter() - t0
    written = convert_trace(Loaded(trace, "rewritten", loaded.files), outdir, to, name)
    if as_json:
        print_json(summarize(trace))
    else:
        click.echo(f"rewrote {loaded.format} ({len(loaded.trace.graphs)} rank(s)) to {len(trace.graphs):,} "
                   f"rank(s), {trace.num_nodes:,} nodes in {rewrite_s:.2f} s; wrote {len(written):,} "
                   f"file(s) to {outdir} ({to})")
