"""``ettools calibrate``: fit compute, network, op or serving cost models on measured traces."""

from __future__ import annotations

from pathlib import Path

import click

from ettools.cli.common import STEPS_HELP, _outfile
from ettools.cli_options import _fail, handle_errors, parse_dims, quiet_option


@click.command()
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Where to write the fit (JSON).")
@click.option("--steps", default=None, help=STEPS_HELP + ".")
@click.option("--network", "network", is_flag=True,
              help="Fit the network instead: collective and send/recv cost vs bytes, from a multi-rank "
                   "capture, a folder of measured collective tables (all_reduce.csv, send_recv.csv, ... as "
                   "Vidur or --measure write them), or --measure (use the file with replay --network).")
@click.option("--measure", "measure", type=click.Choice(["gloo", "nccl"]), default=None,
              help="--network: measure this machine's collectives through torch.distributed (gloo on CPU, "
                   "nccl on GPUs; needs the capture extra) instead of reading INPUTS.")
@click.option("--ranks", "ranks", type=int, default=None,
              help="--measure: processes (ranks) to measure with (default 2).")
@click.option("--reps", "reps", type=int, default=None,
              help="--measure: timed repetitions per kind and size, after 3 warm-up ones (default 20).")
@click.option("--sizes", "sizes", default=None,
              help="--measure: message sizes in bytes, comma-separated (default 1 KiB .. 16 MiB, factors of 4).")
@click.option("--tables", "tables", type=click.Path(path_type=Path), default=None,
              help="--measure: also keep the measured tables (CSV) in this folder.")
@click.option("--statistic", "statistic", type=click.Choice(["median", "min", "mean"]), default=None,
              help="--network on measured tables (a folder, or --measure): which of a size's repetitions stands "
                   "for it (default median; min: the fastest, a GPU collective's own time without the launch skew "
                   "between ranks that the replay adds itself — what the shipped GPU fits use).")
@click.option("--op-model", "op_model", is_flag=True,
              help="Fit the per-class op cost model (GEMM efficiency with wave quantization, attention, conv, "
                   "memory-bound ops, launch floor) on Kineto traces with Input Dims and/or Vidur op-time "
                   "tables (mlp.csv, attention.csv); use with replay --timing calibrated:FIT.")
@click.option("--gpu", default=None, help="--op-model: the hardware preset the data was measured on "
                                          "(default: the device the first trace names).")
@click.option("--report", "report", is_flag=True,
              help="--op-model: print the leave-one-model-out cross-validated error per class.")
@click.option("--serving", "serving", is_flag=True,
              help="Fit per-iteration cost t = a + b·tokens + c·decode context + d·prefill pairs on vLLM/SGLang "
                   "serving traces (use the file with serve --cost).")
@click.option("--model", "serving_model", default=None,
              help="--serving: the traced model (preset or template, with --dim), to scale the fit to other models.")
@click.option("--dim", "serving_dims", multiple=True, help="--serving: dimension override NAME=N of --model.")
@click.option("--predict", "predict_fit", type=click.Path(path_type=Path), default=None,
              help="--serving: also print how this fit (of another trace, scaled to --model) predicts these iterations.")
@quiet_option
@handle_errors
def calibrate(inputs: tuple[Path, ...], out: Path, steps: str | None, network: bool, op_model: bool = False,
              gpu: str | None = None, report: bool = False, serving: bool = False, serving_model: str | None = None,
              serving_dims: tuple[str, ...] = (), predict_fit: Path | None = None, measure: str | None = None,
              ranks: int | None = None, reps: int | None = None, sizes: str | None = None,
              tables: Path | None = None, statistic: str | None = None) -> None:
    """Fit the compute-time model (per op class, time vs FLOPs and bytes) on a measured trace, or
    with --network the cost of its collectives and sends/recvs, or with --op-model the per-class
    op cost model of a GPU from traces with shapes and op-time tables, or with --serving the
    per-iteration cost of a serving engine."""
    _outfile(out)
    if statistic is not None and not (network and (measure is not None or (len(inputs) == 1
                                                                           and _is_table_folder(inputs[0])))):
        _fail("--statistic goes with --network on a folder of measured tables or with --network --measure")
    stat = statistic or "median"
    if measure is not None or any(x is not None for x in (ranks, reps, sizes, tables)):
        if not network or measure is None:
            _fail("--ranks, --reps, --sizes and --tables go with --network --measure")
        if inputs:
            _fail("--measure takes no INPUTS (it measures this machine)")
        _measure_network(out, measure, 2 if ranks is None else ranks, 20 if reps is None else reps, sizes, tables,
                         stat)
        return
    if not inputs:
        _fail("missing INPUTS (traces to fit), or --network --measure")
    if serving:
        from ettools.replay.serve.calibrate_cli import calibrate_serving

        calibrate_serving(list(inputs), out, steps, serving_model, parse_dims(serving_dims), predict_fit)
        return
    if op_model:
        from ettools.replay.calibrate import fit_op_model, report_lines

        try:
            model, res = fit_op_model(list(inputs), gpu, cv=report)
        except ValueError as e:
            _fail(f"{inputs[0]}: cannot calibrate: {e}")
        model.save(out)
        if report:
            click.echo("\n".join(report_lines(model, res)))
        click.echo(f"wrote {out} ({sum(c.n for c in model.classes.values())} samples, {model.gpu})")
        return
    from ettools.formats import load_trace
    from ettools.replay import calibrate as fit_trace
    from ettools.replay import fit_network

    if network and len(inputs) == 1 and _is_table_folder(inputs[0]):
        _fit_tables(inputs[0], out, str(inputs[0]), stat)
        return
    loaded = load_trace(list(inputs), steps=steps)
    try:
        fit = fit_network(loaded.trace, " ".join(map(str, inputs))) if network else fit_trace(loaded.trace)
    except ValueError as e:
        _fail(f"{inputs[0]}: cannot calibrate: {e}")
    fit.save(out)
    click.echo(f"wrote {out} ({fit.samples} samples)")


_TABLES = ("all_reduce.csv", "all_gather.csv", "reduce_scatter.csv", "all_to_all.csv", "send_recv.csv")


def _is_table_folder(path: Path) -> bool:
    """A folder of measured collective tables rather than a trace folder."""
    return path.is_dir() and any((path / t).is_file() for t in _TABLES)


def _fit_tables(folder: Path, out: Path, source: str, statistic: str = "median") -> None:
    """Fit the network of a folder of measured collective tables (each size's ``statistic`` of its
    repetitions) and write it to ``out``."""
    from ettools.replay.netfit import fit_nccl_tables, read_nccl_tables

    fit = fit_nccl_tables(read_nccl_tables(folder, statistic), source=f"{source} (per size: the {statistic} of its repetitions)")
    fit.save(out)
    click.echo(f"wrote {out} ({fit.samples} table rows: {', '.join(sorted(fit.by_kind))})")


def _measure_network(out: Path, backend: str, ranks: int, reps: int, sizes: str | None,
                     tables: Path | None, statistic: str = "median") -> None:
    """``--network --measure``: time this machine's collectives, then fit them like measured tables."""
    import tempfile

    from ettools.collbench import DEFAULT_SIZES, CollBenchError, measure_collectives
    from ettools.progress import is_quiet

    try:
        size_list = DEFAULT_SIZES if sizes is None else tuple(int(x) for x in sizes.split(",") if x.strip())
    except ValueError:
        _fail(f"--sizes: {sizes!r} is not a comma-separated list of byte counts")
    if tables is not None and tables.exists() and not tables.is_dir():
        _fail(f"--tables: {tables} exists and is not a folder")
    log = None if is_quiet() else (lambda m: click.echo(m, err=True))
    with tempfile.TemporaryDirectory(prefix="ettools-tables-") as tmp:
        folder = Path(tmp)
        try:
            measure_collectives(backend, ranks, folder, size_list, reps, log)
        except CollBenchError as e:
            _fail(str(e))
        _fit_tables(folder, out, f"ettools calibrate --network --measure {backend} --ranks {ranks} on "
                                 f"{_host_name()}", statistic)
        if tables is not None:
            import shutil

            tables.mkdir(parents=True, exist_ok=True)
            for f in sorted(folder.glob("*.csv")):
                shutil.copyfile(f, tables / f.name)


def _host_name() -> str:
    """The measured machine, as the fit records its source."""
    import os
    import platform

    return f"{platform.node() or 'this host'} ({os.cpu_count()} CPUs)"
