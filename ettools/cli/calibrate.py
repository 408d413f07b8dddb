"""``ettools calibrate``: fit compute, network, op or serving cost models on measured traces."""

from __future__ import annotations

from pathlib import Path

import click

from ettools.cli.common import STEPS_HELP, _outfile
from ettools.cli_options import _fail, handle_errors, parse_dims, quiet_option


@click.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Where to write the fit (JSON).")
@click.option("--steps", default=None, help=STEPS_HELP + ".")
@click.option("--network", "network", is_flag=True,
              help="Fit the network instead: collective and send/recv cost vs bytes, from a multi-rank "
                   "capture (use the file with replay --network).")
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
              serving_dims: tuple[str, ...] = (), predict_fit: Path | None = None) -> None:
    """Fit the compute-time model (per op class, time vs FLOPs and bytes) on a measured trace, or
    with --network the cost of its collectives and sends/recvs, or with --op-model the per-class
    op cost model of a GPU from traces with shapes and op-time tables, or with --serving the
    per-iteration cost of a serving engine."""
    _outfile(out)
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

    loaded = load_trace(list(inputs), steps=steps)
    try:
        fit = fit_network(loaded.trace, " ".join(map(str, inputs))) if network else fit_trace(loaded.trace)
    except ValueError as e:
        _fail(f"{inputs[0]}: cannot calibrate: {e}")
    fit.save(out)
    click.echo(f"wrote {out} ({fit.samples} samples)")
