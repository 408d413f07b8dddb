"""``ettools search``: the click command (registered by :mod:`ettools.cli`)."""

from __future__ import annotations

from pathlib import Path

import click

from ettools.cli_options import (
    MAX_DIM,
    MAX_WORLD,
    FiniteRange,
    _fail,
    handle_errors,
    parse_dims,
    print_json,
    quiet_option,
)

_AXIS_OPTIONS = (("dp", "Data-parallel degrees (default: what the GPU count leaves)."),
                 ("tp", "Tensor-parallel degrees [1,2,4,8]."),
                 ("pp", "Pipeline stages [1,2,4,8,16]."),
                 ("ep", "Expert-parallel degrees (MoE) [1]."),
                 ("cp", "Context-parallel degrees [1]."),
                 ("sp", "Sequence parallelism over TP, 0/1 [0,1]."),
                 ("zero", "ZeRO stages, 3 = FSDP [0,1,2,3]."),
                 ("recompute", "Activation recomputation, 0/1 [0,1]."),
                 ("micro_batch", "Samples per data-parallel rank per micro-batch [1,2,4,8]."),
                 ("schedule", "Pipeline schedules [gpipe,1f1b,interleaved]."),
                 ("vpp", "Chunks per stage under interleaved [2]."),
                 ("bucket_mb", "DDP gradient bucket MiB, 'none' = one per module [none]."))


def _axis_options(fn):
    for axis, text in reversed(_AXIS_OPTIONS):
        fn = click.option(f"--{axis.replace('_', '-')}", axis, default=None, metavar="V,V,…", help=text)(fn)
    return fn


@click.command("search")
@click.option("--model", required=True, help="Preset (llama3-70b, gpt3-175b, …), built-in template or template file.")
@click.option("--dim", "dims", multiple=True, help="Dimension override NAME=N (e.g. L=4).")
@click.option("--gpus", type=click.IntRange(1, MAX_WORLD), required=True, help="GPUs in the job.")
@click.option("--system", default=None, help="Hardware preset or JSON (A100, H100, …; default H100).")
@click.option("--network", type=click.Path(path_type=Path), default=None, help="ASTRA-sim network YAML.")
@click.option("--collectives", type=click.Path(path_type=Path), default=None, help="ASTRA-sim system JSON.")
@click.option("--batch", type=click.IntRange(1, MAX_DIM), required=True, help="Global batch (samples per step).")
@click.option("--seq", type=click.IntRange(1, MAX_DIM), default=None, help="Sequence length (default: the model's).")
@click.option("--dtype", default="bf16", show_default=True, help="Parameter/activation dtype of every plan.")
@click.option("--timing", default="measured", show_default=True,
              help="Replay timing: measured (synthesized durations re-timed by the replay's models), roofline, calibrated:FIT.")
@_axis_options
@click.option("--fix", "fixes", multiple=True, help="Fix an axis: AXIS=V (e.g. pp=1); repeatable.")
@click.option("--objective", type=click.Choice(["step_time", "tokens", "mfu", "memory"]), default="step_time",
              show_default=True, help="memory = least peak memory among plans within --time-bound.")
@click.option("--time-bound", "time_bound", type=FiniteRange(0, 1e12, min_open=True), default=None,
              help="Step-time bound in ms (--objective memory).")
@click.option("--top", type=click.IntRange(1), default=5, show_default=True, help="Plans to rank (kept exact).")
@click.option("--strategy", type=click.Choice(["exhaustive", "random", "tpe", "cmaes"]), default="exhaustive",
              show_default=True, help="tpe/cmaes need Optuna (pip install 'ettools[search]').")
@click.option("--trials", type=click.IntRange(1), default=None, help="Distinct plans a sampler may visit.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Random seed of the sampling strategies (same seed, same plans tried).")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Evaluate plans in local worker processes or on a Ray cluster.")
@click.option("--address", default=None, help="Ray cluster to join (default: a local one).")
# a process pool forks all its workers at once: a huge count was a fork bomb
@click.option("--workers", type=click.IntRange(1, 256), default=2, show_default=True, help="Trials in parallel.")
@click.option("--cache", "cache_dir", type=click.Path(path_type=Path), default=None,
              help="Trial cache directory (default ~/.cache/ettools/search).")
@click.option("--no-cache", "no_cache", is_flag=True, help="Neither read nor write the trial cache.")
@click.option("--no-prune", "no_prune", is_flag=True, help="Replay every valid plan that fits in memory.")
@click.option("--memory-gib", type=FiniteRange(0, 1 << 20, min_open=True), default=None,
              help="Device memory per GPU (default: the system's).")
@click.option("-o", "--output", "outdir", type=click.Path(path_type=Path), default=None,
              help="Write trials.json, trials.csv and pareto.png here.")
@click.option("--emit-best", "emit_best", type=click.Path(path_type=Path), default=None,
              help="Write the best plan's Chakra traces (every rank) here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (counts, best, all trials).")
@quiet_option
@handle_errors
def search_command(model: str, dims: tuple[str, ...], gpus: int, system: str | None, network: Path | None,
                   collectives: Path | None, batch: int, seq: int | None, dtype: str, timing: str,
                   fixes: tuple[str, ...], objective: str, time_bound: float | None, top: int, strategy: str,
                   trials: int | None, seed: int, backend: str, address: str | None, workers: int,
                   cache_dir: Path | None, no_cache: bool, no_prune: bool, memory_gib: float | None,
                   outdir: Path | None, emit_best: Path | None, as_json: bool, **axes: str | None) -> None:
    """Find the fastest parallel plan of a model on N GPUs: prune, replay, rank."""
    from ettools.progress import is_quiet

    from . import Space, parse_values, plan_label
    from . import search as run_search

    space = Space()
    try:
        for axis, text in axes.items():
            if text is not None:
                space.restrict(axis, parse_values(axis, text))
        for item in fixes:
            axis, sep, value = item.partition("=")
            axis = axis.strip().replace("-", "_")
            if not sep:
                raise ValueError(f"--fix: expected AXIS=VALUE, got {item!r}")
            space.restrict(axis, parse_values(axis, value))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    for p, what in ((network, "--network"), (collectives, "--collectives")):
        if p is not None and not p.exists():
            _fail(f"{p}: {what} file not found")
    try:
        res = run_search(model, gpus, batch=batch, space=space, dims=parse_dims(dims), seq=seq, dtype=dtype,
                         system=system, network=None if network is None else str(network),
                         collectives=None if collectives is None else str(collectives), timing=timing,
                         objective=objective, time_bound_us=time_bound * 1e3 if time_bound else None, top=top,
                         strategy=strategy, trials=trials, seed=seed, backend=backend, workers=workers,
                         address=address, cache_dir=None if no_cache else (cache_dir or "default"),
                         prune=not no_prune, memory_gib=memory_gib, progress=not is_quiet() and not as_json)
    except (ValueError, RuntimeError) as e:
        _fail(f"search {model}: {e}")
    written = res.write(outdir) if outdir is not None else {}
    emitted = res.emit_best(emit_best, progress=not is_quiet() and not as_json) if emit_best is not None and res.best else None
    if as_json:
        print_json(res.to_json())
        return
    click.echo(res.summary())
    if res.best is None:
        click.echo("no plan fits and replays: widen the space or raise --memory-gib")
        return
    click.echo(res.table())
    b = res.best
    click.echo(f"best: {plan_label(b['plan'])}: step {b['step_time_us'] / 1e3:,.1f} ms (compute "
               f"{b['compute_us'] / 1e3:,.1f} ms, exposed comm {b['exposed_comm_us'] / 1e3:,.1f} ms, bubble "
               f"{b['bubble_us'] / 1e3:,.1f} ms), peak {b['peak_memory_bytes'] / 2**30:.1f} GiB per GPU")
    if res.bound_violations:
        click.echo(f"warning: {res.bound_violations} plan(s) replayed faster than their lower bound: "
                   f"bound pruning may be unsafe with this timing (use --no-prune)", err=True)
    for kind, path in written.items():
        click.echo(f"wrote {kind}: {path}")
    if emitted:
        click.echo(f"wrote the best plan's Chakra traces: {len(emitted['paths']):,} files to {emit_best}")
