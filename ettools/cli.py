"""The ``ettools`` command line: one click group, one subcommand per job.

Bad input ends with one line on stderr naming the file and the problem, and exit code 2.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ettools import __version__
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
from ettools.io import (
    check_name,
    check_output_dir,
    check_output_file,
    clean_message,
)
from ettools.progress import is_quiet
from ettools.replay.search.cli import search_command

WRITE_FORMATS = ("chakra", "chakra-json", "chrome", "astrasim-json", "triosim")
MAX_SERVE_GPUS = 65536  # serve simulates every engine: beyond this a run sizes memory past a machine
PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what a plot is written as (matplotlib picks the format by suffix)


def _name_option(default: str) -> Callable[..., Any]:
    """``--name``: a plain file-name stem; the files are ``<name>.<rank>.<ext>`` inside -o."""

    def callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
        try:
            return check_name(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None

    return click.option("--name", default=default, show_default=True, callback=callback,
                        help="Output file name stem: files are <name>.<rank>.<ext> inside -o "
                             "(a plain name: no '/', no leading '.').")


def _outdir(path: Path) -> Path:
    """Refuse an output folder that is a file (or under one) before any work is done."""
    return check_output_dir(path)


def _outfile(path: Path | None) -> Path | None:
    """Refuse an output file that is a directory, FIFO, device or symlink before any work is done."""
    return None if path is None else check_output_file(path)


def _plot_file(path: Path | None, option: str) -> Path | None:
    """Refuse a plot path matplotlib cannot write (it picks the format by the suffix, and raised a
    ValueError after the whole run) or that is not a plain file, before any work is done."""
    if path is None:
        return None
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise click.BadParameter(f"expected a {', '.join(PLOT_SUFFIXES)} file, got {str(path)!r}", param_hint=option)
    _need_matplotlib(option)
    return check_output_file(path)


def _check_world(option: str, **degrees: int | None) -> None:
    """Refuse a plan whose ranks (the product of its parallel degrees) exceed :data:`MAX_WORLD`
    before anything is sized by it (each degree alone is range-checked by its option)."""
    world = 1
    for v in degrees.values():
        world *= v or 1
    if world > MAX_WORLD:
        given = " × ".join(f"{k} {v:,}" for k, v in degrees.items() if v and v > 1)
        raise click.BadParameter(f"{given} = {world:,} ranks: at most {MAX_WORLD:,}", param_hint=option)


def _need_matplotlib(option: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.UsageError(f"{option} needs matplotlib: pip install 'ettools[report]'") from None


# How --steps numbers Kineto steps (the same in every command that reads Kineto).
STEPS_HELP = ("Kineto steps to keep: N, N-M or a comma list of those, numbered as the trace's "
              "ProfilerStep#N (e.g. 101-105 when profiling began at step 101; a number not in the trace "
              "is refused with the list present); a trace without ProfilerStep numbers its top-level step "
              "annotations 0, 1, … in time order. Default: every step")


class _Group(click.Group):
    """The ettools group: usage errors too are one line on stderr (exit 2), like bad input."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as e:
            # `ettools` alone asks for the help: printed as help (it came out as one line of "\n")
            click.echo(e.format_message())
            sys.exit(0)
        except click.ClickException as e:
            where = f" ({e.ctx.command_path} --help)" if isinstance(e, click.UsageError) and e.ctx else ""
            click.echo(f"ettools: error: {clean_message(e.format_message())}{where}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("ettools: error: interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ettools")
@quiet_option
def main() -> None:
    """Convert, synthesize, rewrite, validate and replay execution traces of distributed AI jobs."""
    _log_warnings_as_lines()


class _LevelPrefix(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        kind = "warning: " if record.levelno >= logging.WARNING else ""
        return f"ettools: {kind}{clean_message(record.getMessage())}"


def _log_warnings_as_lines() -> None:
    """The library's log warnings (ASTRA-sim notes of the Chakra writer, skipped notes of readers)
    as ``ettools: warning: …`` lines on stderr, like every other warning the commands print (they
    came out bare, through logging's last-resort handler)."""
    log = logging.getLogger("ettools")
    if not any(isinstance(h, _EchoHandler) for h in log.handlers):
        h = _EchoHandler(logging.WARNING)
        h.setFormatter(_LevelPrefix())
        log.addHandler(h)  # propagation stays: an application's own root handlers see them too


class _EchoHandler(logging.Handler):
    """A record as one line on the current stderr (resolved at each record, as click.echo does)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "outdir", required=True, type=click.Path(path_type=Path),
              help="Output directory.")
@click.option("--to", "to", type=click.Choice(WRITE_FORMATS), default="chakra", show_default=True,
              help="Output format.")
@click.option("--et", type=click.Path(path_type=Path), default=None,
              help="PyTorch Execution Trace file or directory to link with Kineto inputs.")
@_name_option("trace")
@click.option("--steps", default=None, help=STEPS_HELP + ".")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary of what was written.")
@click.option("--allow-defects", "allow_defects", is_flag=True,
              help="Write a dependency graph that holds cycles (refused without it: ASTRA-sim never "
                   "finishes one); dangling and self-dependencies are still dropped.")
@quiet_option
@handle_errors
def convert(inputs: tuple[Path, ...], outdir: Path, to: str, et: Path | None, name: str,
            steps: str | None, as_json: bool, allow_defects: bool) -> None:
    """Convert INPUTS (Kineto, PyTorch ET, Chakra, Chakra JSON, ASTRA-sim JSON, TrioSim CSV).

    The input format is detected from content. Kineto and PyTorch ET files of the same run are
    linked. Chakra output is OUTDIR/<name>.<rank>.et plus OUTDIR/comm_group.json.

    A source's own dependency defects are repaired where one repair is sound, each kind said in a
    warning with its count (chakra, chakra-json, astrasim-json output): a dependency on a node id
    not in the rank (dangling) or of a node on itself is dropped. A dependency cycle through 2+
    nodes has none: it is refused (exit 2, nothing written) unless --allow-defects.
    """
    from ettools.convert import convert_trace
    from ettools.formats import load_trace

    _outdir(outdir)
    t0 = time.perf_counter()
    loaded = load_trace(list(inputs), et=et, steps=steps)
    written = convert_trace(loaded, outdir, to, name, allow_defects=allow_defects)
    elapsed = time.perf_counter() - t0
    for note in loaded.notes:
        click.echo(f"ettools: warning: {clean_message(note)}", err=True)
    if as_json:
        out: dict[str, Any] = {
            "input_format": loaded.format,
            "output_format": to,
            "files": [str(p) for p in written],
            "ranks": loaded.trace.ranks,
            "nodes": loaded.trace.num_nodes,
            "seconds": round(elapsed, 3),
        }
        if loaded.link_report is not None:
            out["linking"] = loaded.link_report.to_dict()
        if to == "chakra":  # a set ASTRA-sim cannot run (part of a world, one rank) says so
            from ettools.converters.chakra import astrasim_world

            out["astrasim"] = astrasim_world(loaded.trace, loaded.trace.ranks)
        print_json(out)
    else:
        click.echo(f"read {loaded.format}: {len(loaded.trace.graphs)} rank(s), "
                   f"{loaded.trace.num_nodes:,} nodes")
        if loaded.link_report is not None:
            click.echo(f"linked: {loaded.link_report}")
        click.echo(f"wrote {len(written)} file(s) to {outdir} ({to}) in {elapsed:.2f} s")


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--et", type=click.Path(path_type=Path), default=None,
              help="PyTorch Execution Trace file or directory to link with Kineto inputs.")
@click.option("--steps", default=None, help=STEPS_HELP + ".")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@quiet_option
@handle_errors
def info(inputs: tuple[Path, ...], et: Path | None, steps: str | None, as_json: bool) -> None:
    """Summarize a trace: ranks, node counts by type, communication, time span, linking, matching."""
    from ettools.formats import load_trace
    from ettools.report import info_report, render_info

    loaded = load_trace(list(inputs), et=et, steps=steps)
    report = info_report(loaded)
    for note in loaded.notes:  # defects kept: counted in report["problems"]
        click.echo(f"ettools: warning: {clean_message(note)}", err=True)
    from ettools.replay.serve.steps import serving_lines, serving_steps

    served = serving_steps(loaded.trace)  # vLLM/SGLang execute spans: prefill, decode or mixed iterations
    if served:
        report["serving_steps"] = served
    if as_json:
        print_json(report)
    else:
        click.echo(render_info(report))
        if served:
            click.echo("\n".join(serving_lines(served)))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "outdir", type=click.Path(path_type=Path), default=Path("capture"),
              show_default=True, help="Directory for rank<N>.kineto.json.gz and rank<N>.et.json.gz.")
@click.option("--steps", default="2", show_default=True,
              help="Optimizer steps to record: N or N-M, counted from 1 as the script calls optimizer.step(); "
                   "the trace's ProfilerStep#N carry these numbers (what --steps of the other commands takes).")
@click.option("--memory/--no-memory", default=True, show_default=True, help="Record memory events.")
@click.option("--emulate", "emulate", default=None, metavar="GPU",
              help="Do not run on a device: emulate GPU (a hardware preset: H100, A100, MI300X, ...) on this machine, "
                   "record every device op and time it on GPU's models (see README, emulated capture).")
@click.option("--world", type=click.IntRange(1, 1 << 20), default=None,
              help="With --emulate: world size; the command runs once per rank as torchrun would launch it "
                   "(default: torchrun's processes, else 1).")
@click.option("--host", "host", type=click.Choice(["modelled", "measured"]), default="modelled", show_default=True,
              help="With --emulate: host time between ops from the host-cost table of real GPU hosts, or as the "
                   "program spends it on this machine.")
@click.option("--host-from", "host_from", multiple=True, type=click.Path(path_type=Path, exists=True, dir_okay=False),
              metavar="TRACE", help="With --emulate: measure the host-cost table from these real Kineto traces (any "
                                    "program profiled with record_shapes and with_stack on the host to predict) "
                                    "instead of the shipped one. Repeatable.")
@click.option("--gpu-memory", type=FiniteRange(0.001, 1 << 20), default=None, metavar="GIB",
              help="With --emulate: device memory in GiB instead of the preset's.")
@click.option("--jobs", type=click.IntRange(1, 256), default=2, show_default=True,
              help="With --emulate: ranks emulated at once (torchrun commands).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@quiet_option
@handle_errors
def capture(outdir: Path, steps: str, memory: bool, emulate: str | None, world: int | None, host: str,
            host_from: tuple[Path, ...], gpu_memory: float | None, jobs: int, command: tuple[str, ...]) -> None:
    """Run COMMAND (an unmodified PyTorch script or launcher) with the profiler on chosen steps.

    Example: ettools capture -o out --steps 3 -- python train.py --epochs 1

    With --emulate GPU no device is needed: ettools capture --emulate H100 -o out -- torchrun
    --nproc-per-node 8 train.py records each rank's ops on fake tensors and writes Kineto traces whose
    device times are modelled for GPU.
    """
    first, last = parse_range(steps, "--steps")
    if emulate is None:
        for name, value in (("--world", world), ("--gpu-memory", gpu_memory), ("--host-from", host_from or None)):
            if value is not None:
                raise click.UsageError(f"{name} needs --emulate GPU")
        from ettools.capture import run_capture

        sys.exit(run_capture(list(command), outdir, steps=(first, last), memory=memory))
    from ettools.capture_emulate import run_capture_emulated
    from ettools.replay.compute import presets

    if not any(k.lower() == emulate.lower() for k in presets() if not k.startswith("_")):
        raise click.BadParameter(f"unknown GPU {emulate!r} (known: "
                                 f"{', '.join(k for k in presets() if not k.startswith('_'))})", param_hint="--emulate")
    costs = None
    if host_from:
        from ettools.converters.emulate.host_fit import HostFitError, fit_host_costs

        try:
            costs = fit_host_costs(list(host_from))
        except HostFitError as e:
            raise click.BadParameter(str(e), param_hint="--host-from") from None
    sys.exit(run_capture_emulated(list(command), outdir, emulate, world, (first, last), host=host, jobs=jobs,
                                  gpu_memory=gpu_memory, quiet=is_quiet(), host_costs=costs))


@main.command()
@click.argument("reference", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="Write a report: FILE.md (charts beside it) or FILE.html (self-contained).")
@click.option("--tolerance", type=FiniteRange(0, 1e9), default=None,
              help="Exit 1 when a compared measure's total error exceeds PCT percent.")
@click.option("--measure", "measures", multiple=True,
              type=click.Choice(["op_counts", "comm_counts", "comm_bytes", "compute_time", "peak_memory",
                                 "step_time"]),
              help="Measures to compare (and gate with --tolerance); repeatable. Default: all.")
@click.option("--unit", type=click.Choice(["auto", "host", "device"]), default="auto", show_default=True,
              help="Count operators as host ops or device kernels.")
@click.option("--op-class", "op_classes", multiple=True,
              type=click.Choice(["GeMM", "Attention", "ElementWise", "Communication", "Memory", "Others"]),
              help="Operator classes to compare (repeatable; default all).")
@click.option("--steps", default=None, help=STEPS_HELP + " (the same on both sides).")
@quiet_option
@handle_errors
def validate(reference: Path, candidate: Path, as_json: bool, report: Path | None, tolerance: float | None,
             measures: tuple[str, ...], unit: str, op_classes: tuple[str, ...], steps: str | None) -> None:
    """Compare CANDIDATE with REFERENCE: op counts by class, communication counts and bytes,
    time by class, peak memory and step time, per rank and in total (any readable format)."""
    from ettools.formats import load_trace
    from ettools.validate import validate as compare
    from ettools.validate_report import render_report

    if report is not None and report.suffix not in (".md", ".html"):
        raise click.BadParameter("expected a .md or .html file", param_hint="--report")
    _outfile(report)
    ref = load_trace([reference], steps=steps).trace
    cand = load_trace([candidate], steps=steps).trace
    try:
        result = compare(ref, cand, measures=list(measures) or None, unit=unit,
                         reference_name=str(reference), candidate_name=str(candidate),
                         op_classes=list(op_classes) or None)
    except ValueError as e:
        _fail(f"{candidate}: cannot compare with {reference}: {e}")
    if report is not None:
        render_report(result, report)
    if as_json:
        print_json(result.to_json())
    else:
        click.echo(result.to_markdown())
    if tolerance is not None:
        over = result.exceeds(tolerance, list(measures) or None)
        off = [m for m in over if m not in result.skipped]
        unchecked = [m for m in over if m in result.skipped]
        if off:
            click.echo(f"ettools: validate: {', '.join(off)} off by more than {tolerance:g} %", err=True)
        for m in unchecked:
            click.echo(f"ettools: validate: {m} could not be compared: {result.skipped[m]}", err=True)
        if over:
            sys.exit(1)


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--system", default=None,
              help="Hardware: preset (A100, H100, H200, B200, MI300X) or JSON file. Default: from the trace. "
                   "On a trace measured on another GPU, every device op is re-timed for this one "
                   "(shares by shape / class transfer / kept are printed).")
@click.option("--network", type=click.Path(path_type=Path), default=None,
              help="ASTRA-sim network YAML, a link-graph JSON or a network fit (calibrate --network). Default: keep measured comm times.")
@click.option("--collectives", type=click.Path(path_type=Path), default=None,
              help="ASTRA-sim system JSON (collective algorithm per dimension).")
@click.option("--timing", default="measured", show_default=True,
              help="Compute time: measured, calibrated:FIT or roofline (falling back in that order).")
@click.option("--symmetric/--no-symmetric", default=None,
              help="Simulate one rank per class of provably symmetric ranks. Default: on in ASTRA-sim mode "
                   "(--network and --collectives) unless --timeline or --congestion, off otherwise.")
@click.option("--congestion", is_flag=True, help="Flow-level bandwidth sharing instead of closed forms.")
@click.option("--align-ranks", "align_ranks", is_flag=True,
              help="Start every rank together (the answer without rank skew); default: each rank starts "
                   "where its trace starts, on the job's clock.")
@click.option("--no-contention", "no_contention", is_flag=True,
              help="Time modelled ops as if alone beside transfers (default: slowed by the fitted contention; "
                   "always off in ASTRA-sim mode, never applied to measured durations).")
@click.option("--what-if", "what_if", multiple=True,
              help="Duration factor KIND=X for device, host, host_gap or comm (e.g. device=0.5).")
@click.option("--et", type=click.Path(path_type=Path), default=None,
              help="PyTorch ET of the same run, for tensor lifetimes (memory).")
@click.option("--steps", default=None, help=STEPS_HELP + ".")
@click.option("--allow-missing-ranks", "allow_missing_ranks", is_flag=True,
              help="Replay a Chakra folder that lacks some ranks' files (default: an error naming them).")
@click.option("--timeline", type=click.Path(path_type=Path), default=None,
              help="Write the replayed per-rank timeline as Chrome trace JSON (Perfetto).")
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="Write a PNG of the breakdown.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@quiet_option
@handle_errors
def replay(inputs: tuple[Path, ...], system: str | None, network: Path | None, collectives: Path | None,
           timing: str, symmetric: bool | None, congestion: bool, align_ranks: bool, no_contention: bool,
           what_if: tuple[str, ...], et: Path | None, steps: str | None, allow_missing_ranks: bool, timeline: Path | None,
           plot: Path | None, as_json: bool) -> None:
    """Simulate compute, memory and network time of a multi-rank trace on a described cluster.

    Exit code 1 when the graph deadlocks (a collective missing on a member, a send without recv).
    """
    from ettools.formats import load_trace
    from ettools.replay import ReplayDeadlock, replay_trace

    if symmetric is None and (timeline is not None or congestion):
        symmetric = False  # a timeline shows every rank; flows couple every rank
    if congestion and symmetric:
        raise click.UsageError("--congestion shares links between every rank's flows, --symmetric simulates "
                               "one rank per class: choose one")
    factors = parse_dims(what_if, float, "--what-if")
    _plot_file(plot, "--plot")
    _outfile(timeline)
    loaded = load_trace(list(inputs), steps=steps, allow_missing_ranks=allow_missing_ranks)
    for note in loaded.notes:  # defects the reader kept (negative durations, cycles): said, not silent
        click.echo(f"ettools: warning: {clean_message(note)}", err=True)
    memory_trace = load_trace([et]).trace if et is not None else None
    try:
        result = replay_trace(loaded.trace, system=system, network=network, collectives=collectives,
                              timing=timing, symmetric=symmetric, congestion=congestion,
                              memory_trace=memory_trace, what_if=factors or None, align_ranks=align_ranks,
                              contention=not no_contention)
    except ReplayDeadlock as e:
        click.echo(f"ettools: replay: deadlock: {e}", err=True)
        if as_json:
            print_json({"deadlock": getattr(e, "details", str(e))})
        sys.exit(1)
    except ValueError as e:
        _fail(f"{inputs[0]}: cannot replay: {e}")
    if timeline is not None:
        result.write_timeline(timeline)
    if plot is not None:
        result.plot(plot)
    if as_json:
        print_json(result.to_json())
    else:
        click.echo(result.summary_text())


@main.command()
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


@main.command()
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


def parse_rank_list(text: str | None, world: int | None = None) -> list[int] | None:
    """``"0-3,8"`` → ``[0, 1, 2, 3, 8]``; None stays None. With ``world``, every rank must be below
    it (checked per range before the list is built)."""
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        try:
            lo = int(a)
            hi = int(b) if b else lo
        except ValueError:
            raise click.BadParameter(f"expected ranks like 0-3,8, got {text!r}", param_hint="--ranks") from None
        if lo < 0 or hi < lo:
            raise click.BadParameter(f"{part!r} is not a rank range N or N-M with 0 <= N <= M", param_hint="--ranks")
        if world is not None and hi >= world:
            raise click.BadParameter(f"rank {hi} is beyond the plan's {world:,} ranks (0-{world - 1})",
                                     param_hint="--ranks")
        out.extend(range(lo, hi + 1))
    return out


def _list_models(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``synth --list-models``: presets (with their dimensions and derived ones) and templates."""
    if not value or ctx.resilient_parsing:
        return
    from ettools.converters.symbolic.presets import PRESETS, derived_dims
    from ettools.converters.symbolic.templates import builtin_templates, load_template

    click.echo("presets (--model NAME; --dim NAME=N overrides a dimension):")
    for p in PRESETS.values():
        dims = " ".join(f"{k}={v}" for k, v in p.dims.items())
        rules = ", ".join(f"{k} = {r}" for k, r in derived_dims(p).items())
        click.echo(f"  {p.name:18s} template {p.template:12s} {dims}" + (f"  [derived: {rules}]" if rules else ""))
    click.echo("templates (--model NAME, or a template file path; dimensions default to):")
    for t in builtin_templates():
        m = load_template(t)
        click.echo(f"  {t:18s} " + " ".join(f"{k}={v}" for k, v in m.defaults.items()))
    ctx.exit(0)


@main.command()
@click.option("--model", required=True,
              help="Preset (gpt3-5b, llama3-70b, mixtral-8x7b, …), built-in template or template file "
                   "(--list-models lists them).")
@click.option("--list-models", is_flag=True, expose_value=False, is_eager=True, callback=_list_models,
              help="List the presets (dimensions, which derive from which) and templates, then exit.")
@click.option("--dim", "dims", multiple=True,
              help="Dimension override NAME=N (e.g. L=4, H=1024); an unknown NAME is refused. A preset's "
                   "derived dimensions follow their inputs unless given too (GPT: F = 4*H; Llama, Mixtral, "
                   "DeepSeekMoE: HD = H/NH; --list-models shows them).")
@click.option("--dp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Data-parallel ranks.")
@click.option("--tp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--sp", is_flag=True, help="Sequence parallelism over the tensor-parallel group (needs --tp > 1).")
@click.option("--cp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Context-parallel ranks.")
@click.option("--pp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Pipeline stages.")
@click.option("--ep", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True,
              help="Expert-parallel ranks (within dp).")
@click.option("--fsdp", is_flag=True, help="Fully sharded data parallel (ZeRO-3; same as --zero 3).")
@click.option("--zero", type=click.IntRange(0, 3), default=None, help="ZeRO stage 0-3.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "deepspeed", "zb-h1"]),
              default="1f1b", show_default=True,
              help="Pipeline schedule (deepspeed: DeepSpeed's pipeline engine, ZeRO 0/1; zb-h1: zero-bubble "
                   "ZB-H1, weight gradients deferred into the bubbles).")
@click.option("--vpp", type=click.IntRange(2, 1 << 10), default=None, help="Virtual stages per rank (with --schedule interleaved).")
@click.option("--recompute", type=click.Choice(["none", "full", "selective"]), is_flag=False, flag_value="full",
              default="none", show_default=True,
              help="Activation recomputation: full (each layer's forward again; a bare --recompute) or selective "
                   "(only the core attention, Megatron's --recompute-granularity selective).")
@click.option("--batch", type=click.IntRange(1, MAX_DIM), default=None, help="Global batch per iteration.")
@click.option("--micro-batch", type=click.IntRange(1, MAX_DIM), default=None, help="Global micro-batch size.")
@click.option("--seq", type=click.IntRange(1, MAX_DIM), default=None, help="Sequence length.")
@click.option("--dtype", default="bf16", show_default=True,
              help="Activation/parameter dtype (fp8: BF16 storage with FP8 GEMMs, as --gemm-dtype fp8).")
@click.option("--gemm-dtype", type=click.Choice(["fp8"]), default=None,
              help="Math dtype of the linear layers' GEMMs (fp8: Transformer Engine's FP8 training: forward, "
                   "dgrad and wgrad GEMMs in FP8 with cast kernels; the output layer, attention and every "
                   "other op stay in --dtype). Default: --dtype.")
@click.option("--grad-sync", type=click.Choice(["iteration", "microbatch"]), default=None,
              help="Gradient synchronization once per iteration or per micro-batch.")
@click.option("--bucket-mb", type=FiniteRange(0, 1 << 20, min_open=True), default=None,
              help="DDP-style gradient buckets of this many MiB (default: one per module).")
@click.option("--vocab-parallel/--no-vocab-parallel", default=None,
              help="Split embedding and LM head over tp (default: the preset's choice).")
@click.option("--dp-after-backward/--dp-overlap", default=False, show_default=True,
              help="Gradient collectives after the last backward op, or each bucket as soon as its gradients "
                   "exist (overlapped with the backward; default).")
@click.option("--pp-scatter-gather/--no-pp-scatter-gather", default=None,
              help="Megatron's pipeline scatter/gather: each TP rank sends 1/tp of a stage-boundary tensor, the "
                   "receiver all-gathers it over TP (default: on when --tp > 1 and --pp > 1 without --sp).")
@click.option("--tie-embeddings/--untie-embeddings", default=None,
              help="One weight for the token embedding and the LM head (default: the template's choice; GPT ties).")
@click.option("--phase", type=click.Choice(["train", "prefill", "decode"]), default="train", show_default=True,
              help="Training iteration, or one inference step: prefill (prompts) or decode (one token per sequence).")
@click.option("--context", type=int, default=None,
              help="Inference: tokens attended over (prefill: the prompt; decode: cached tokens + new ones).")
@click.option("--ranks", "rank_text", default=None, help="Write only these ranks, e.g. 0-7,64.")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(path_type=Path),
              help="Output folder for <name>.<rank>.et and comm_group.json.")
@_name_option("synth")
@click.option("--json", "as_json", is_flag=True,
              help="Print per-rank counts/bytes, op classes, peak memory and wall time.")
@quiet_option
@handle_errors
def synth(model: str, dims: tuple[str, ...], dp: int, tp: int, sp: bool, cp: int, pp: int, ep: int,
          fsdp: bool, zero: int | None, schedule: str, vpp: int | None, recompute: str,
          batch: int | None, micro_batch: int | None, seq: int | None, dtype: str, gemm_dtype: str | None,
          grad_sync: str | None, bucket_mb: float | None, vocab_parallel: bool | None, dp_after_backward: bool,
          pp_scatter_gather: bool | None, tie_embeddings: bool | None, phase: str,
          context: int | None, rank_text: str | None, outdir: Path, name: str, as_json: bool) -> None:
    """Synthesize per-rank Chakra traces of a model under a parallel plan (a training iteration,
    or with --phase prefill|decode one inference step with its KV cache; --batch is then the
    number of sequences and --seq the new tokens per sequence)."""
    from ettools.converters.symbolic import synth_summary, synthesize, write_synth
    from ettools.progress import is_quiet

    if fsdp and zero not in (None, 3):
        raise click.UsageError(f"--fsdp is ZeRO-3: it contradicts --zero {zero}")
    if sp and tp < 2:
        raise click.UsageError("--sp splits the sequence over the tensor-parallel group: give --tp > 1")
    if vpp is not None and schedule != "interleaved":
        raise click.UsageError("--vpp sets virtual stages of the interleaved schedule: add --schedule interleaved")
    _check_world("--dp/--tp/--cp/--pp", dp=dp, tp=tp, cp=cp, pp=pp)
    ranks = parse_rank_list(rank_text, world=dp * tp * cp * pp)
    _outdir(outdir)
    try:
        result = synthesize(
            model, parse_dims(dims), dp=dp, tp=tp, sp=sp, cp=cp, pp=pp, ep=ep, zero=zero, fsdp=fsdp,
            schedule=schedule, vpp=vpp, recompute=recompute, batch=batch, micro_batch=micro_batch,
            seq=seq, dtype=dtype, grad_sync=grad_sync, bucket_mb=bucket_mb, vocab_parallel=vocab_parallel,
            ranks=ranks, phase=phase, context=context,
            **({"dp_after_backward": dp_after_backward, "pp_scatter_gather": pp_scatter_gather,
                "tie_embeddings": tie_embeddings, "gemm_dtype": gemm_dtype} if phase == "train" else {}),
        )
        written = write_synth(result, outdir, name=name, ranks=ranks, progress=not is_quiet())
    except ValueError as e:
        _fail(f"synth {model}: {e}")
    for note in result.notes:
        click.echo(f"ettools: {note}", err=True)
    if as_json:
        summary = synth_summary(result, ranks=ranks)
        summary["files"] = {"count": len(written["paths"]), "bytes": written["bytes"],
                            "write_seconds": written["seconds"]}
        print_json(summary)
    else:
        t = result.timings
        click.echo(f"synthesized {result.model}: {result.world_size:,} ranks, "
                   f"built in {t.get('total_s', 0):.2f} s; wrote {len(written['paths']):,} files "
                   f"({written['bytes'] / 1e6:.1f} MB) to {outdir} in {written['seconds']:.2f} s")


def parse_range(text: str, option: str) -> tuple[int, int]:
    """``"3"`` → (3, 3); ``"2-4"`` → (2, 4); anything else is a usage error."""
    try:
        parts = [int(p) for p in text.split("-")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or parts[0] < 1 or parts[1] < parts[0]:
        raise click.BadParameter(f"expected N or N-M with 1 <= N <= M, got {text!r}", param_hint=option)
    return parts[0], parts[1]


@main.command()
@click.option("--model", required=True, help="Preset (llama3-8b, llama3-70b, mixtral-8x7b, …), template or template file.")
@click.option("--dim", "dims", multiple=True, help="Dimension override NAME=N (e.g. L=4).")
@click.option("--gpus", type=click.IntRange(1, MAX_SERVE_GPUS), default=1, show_default=True,
              help="GPUs in all (engines of tp×pp×ep GPUs each).")
@click.option("--tp", type=click.IntRange(1, 1024), default=1, show_default=True, help="Tensor-parallel GPUs per engine.")
@click.option("--pp", type=click.IntRange(1, 1024), default=1, show_default=True, help="Pipeline stages per engine.")
@click.option("--ep", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Expert-parallel GPUs per engine (attention data-parallel over the same GPUs).")
@click.option("--system", default="H100", show_default=True, help="Hardware preset or JSON file.")
@click.option("--network", type=click.Path(exists=True, path_type=Path), default=None,
              help="ASTRA-sim network YAML for the prefill→decode KV transfer (default: the hardware's).")
@click.option("--rate", type=FiniteRange(0, 1e6, min_open=True), default=None, help="Poisson arrivals, requests per second.")
@click.option("--interval", type=FiniteRange(1e-9, 1e6), default=None, help="Fixed arrival interval in seconds (instead of --rate).")
@click.option("--duration", type=FiniteRange(0, 1e7, min_open=True), default=60.0, show_default=True, help="Seconds of arrivals.")
@click.option("--prompt-tokens", default="512", show_default=True, help="N, A-B (uniform) or exp:MEAN.")
@click.option("--output-tokens", default="128", show_default=True, help="N, A-B (uniform) or exp:MEAN.")
@click.option("--requests", "requests_file", type=click.Path(path_type=Path), default=None,
              help="JSONL requests: arrival (s), prompt_tokens, output_tokens per line.")
@click.option("--scheduler", type=click.Choice(["continuous", "chunked", "static"]), default="continuous",
              show_default=True, help="Batching: continuous (prefill first), chunked prefill, or static.")
@click.option("--token-budget", type=click.IntRange(1, 1 << 24), default=8192, show_default=True, help="New tokens per iteration at most.")
@click.option("--max-seqs", type=click.IntRange(1, 1 << 20), default=256, show_default=True, help="Running sequences per engine at most.")
@click.option("--block-tokens", type=click.IntRange(1, 1 << 16), default=16, show_default=True, help="Tokens per KV-cache block.")
@click.option("--kv-fraction", type=FiniteRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="Share of the memory left after the weights that holds the KV cache.")
@click.option("--kv-tokens", type=click.IntRange(1, 1 << 40), default=None, help="KV-cache capacity per engine in tokens (overrides --kv-fraction).")
@click.option("--spec-tokens", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Speculative decoding: tokens verified per step (1: off; emits up to this many).")
@click.option("--acceptance", type=FiniteRange(0, 1), default=1.0, show_default=True, help="Speculative decoding: draft acceptance rate.")
@click.option("--draft-model", default=None, help="Speculative decoding: the draft model's preset (default: free drafts).")
@click.option("--prefill-gpus", type=click.IntRange(1, MAX_SERVE_GPUS), default=None,
              help="Prefill/decode disaggregation: GPUs of the prefill pool (the rest decode).")
@click.option("--slo-ttft", type=FiniteRange(0, 1e9, min_open=True), default=None, help="TTFT SLO in ms (goodput).")
@click.option("--slo-tpot", type=FiniteRange(0, 1e9, min_open=True), default=None, help="TPOT SLO in ms (goodput).")
@click.option("--dtype", default="bf16", show_default=True, help="Weight/activation/KV-cache dtype.")
@click.option("--seed", default=0, show_default=True,
              help="Random seed of the synthetic arrivals and token counts (same seed, same workload).")
@click.option("--timing", type=click.Choice(["measured", "roofline"]), default="measured", show_default=True,
              help="Step costs: the replay's compute models (fitted op models where the GPU has them) or the roofline only.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Write latency CDFs and KV use over time to this PNG.")
@click.option("--cost", "cost_fit", type=click.Path(path_type=Path), default=None,
              help="Iteration times from a serving fit (calibrate --serving), scaled to --model, instead of replays.")
@click.option("--host-overhead-ms", type=FiniteRange(0, 1e6), default=None,
              help="Host time the GPU waits for per iteration, ms (default: the --cost fit's, else the one "
                   "measured on the shared SGLang/vLLM traces; 0: none).")
@click.option("--host-overhead-per-seq-us", type=FiniteRange(0, 1e9), default=None,
              help="Host time per sequence of an iteration added to --host-overhead-ms, us.")
@click.option("--max-model-len", type=click.IntRange(1, 1 << 31), default=None,
              help="Reject on arrival a request whose prompt + output tokens exceed this, as engines do "
                   "(default: no limit).")
@click.option("--search", "search", is_flag=True,
              help="Plan search: try the --space plans (colocated and prefill/decode pools) on this workload, "
                   "rank by goodput per GPU under --slo-ttft/--slo-tpot.")
@click.option("--space", default="tp=1,2,4,8 pp=1 ep=1 prefill=0.25,0.5,0.75", show_default=True,
              help="--search: axis values per engine (tp, pp, ep) and prefill pool fractions of --gpus.")
@click.option("--slo-attainment", type=FiniteRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="--search: share of requests within the SLOs for a plan to meet them.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@quiet_option
@handle_errors
def serve(model: str, dims: tuple[str, ...], gpus: int, tp: int, pp: int, ep: int, system: str,
          network: Path | None, rate: float | None, interval: float | None, duration: float, prompt_tokens: str,
          output_tokens: str, requests_file: Path | None, scheduler: str, token_budget: int, max_seqs: int,
          block_tokens: int, kv_fraction: float, kv_tokens: int | None, spec_tokens: int, acceptance: float,
          draft_model: str | None, prefill_gpus: int | None, slo_ttft: float | None, slo_tpot: float | None,
          dtype: str, seed: int, timing: str, plot_path: Path | None, as_json: bool,
          cost_fit: Path | None = None, search: bool = False, space: str = "", slo_attainment: float = 0.9,
          host_overhead_ms: float | None = None, host_overhead_per_seq_us: float | None = None,
          max_model_len: int | None = None) -> None:
    """Simulate serving requests: TTFT, TPOT, end-to-end latency, throughput, KV cache, with
    iteration times replayed from synthesized prefill/decode steps (or from a serving fit)."""
    from ettools.replay.serve import load_requests, simulate_serving, synthetic

    _plot_file(plot_path, "--plot")

    try:
        if requests_file is not None:
            wl = load_requests(requests_file)
        else:
            if rate is None and interval is None:
                raise ValueError("give --rate, --interval or --requests")
            wl = synthetic(rate, interval, duration, prompt_tokens, output_tokens, seed)
        if search:
            from ettools.replay.serve.fit import load_fit
            from ettools.replay.serve.search import parse_space, search_lines, search_serving

            rows = search_serving(
                model, wl, gpus=gpus, slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot, attainment=slo_attainment,
                system=system, dims=parse_dims(dims), dtype=dtype, timing=timing,
                fit=load_fit(cost_fit) if cost_fit is not None else None, **parse_space(space),
                scheduler=scheduler, token_budget=token_budget, max_seqs=max_seqs, block_tokens=block_tokens,
                kv_fraction=kv_fraction, kv_tokens=kv_tokens, network=network, seed=seed,
                host_overhead_ms=host_overhead_ms, host_per_seq_us=host_overhead_per_seq_us)
            if as_json:
                print_json({"plans": rows})
            else:
                click.echo("\n".join(search_lines(rows)))
            return
        cost = None
        if cost_fit is not None:
            from ettools.replay.serve.fit import FitCost, load_fit

            cost = FitCost(load_fit(cost_fit), model, tp=tp, pp=pp, ep=ep, system=system, dims=parse_dims(dims),
                           dtype=dtype)
        res = simulate_serving(
            model, wl, gpus=gpus, tp=tp, pp=pp, ep=ep, system=system, network=network, dims=parse_dims(dims),
            dtype=dtype, scheduler=scheduler, token_budget=token_budget, max_seqs=max_seqs,
            block_tokens=block_tokens, kv_fraction=kv_fraction, kv_tokens=kv_tokens, spec_tokens=spec_tokens,
            acceptance=acceptance, draft_model=draft_model, prefill_gpus=prefill_gpus, slo_ttft_ms=slo_ttft,
            slo_tpot_ms=slo_tpot, seed=seed, timing=timing, cost=cost, host_overhead_ms=host_overhead_ms,
            host_per_seq_us=host_overhead_per_seq_us, max_model_len=max_model_len)
    except ValueError as e:
        _fail(f"serve {model}: {e}")
    if plot_path is not None:
        res.plot(plot_path)
    if as_json:
        print_json(res.to_json())
    else:
        click.echo(res.summary_text())


# ettools search lives with its engine (replay/search/cli.py); registered here, after main exists
main.add_command(search_command)

if __name__ == "__main__":
    main()
