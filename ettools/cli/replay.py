"""``ettools replay``: simulate a multi-rank trace on a described cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ettools.cli.common import STEPS_HELP, _outfile, _plot_file
from ettools.cli_options import _fail, handle_errors, parse_dims, print_json, quiet_option
from ettools.io import clean_message


@click.command()
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
              help="Simulate one rank per class of provably symmetric ranks (the classes are a proof: a "
                   "measured trace keeps every rank). Default: on, unless --timeline or --congestion. With it, "
                   "a Chakra rank file whose header carries the structure digest of one read before "
                   "(ettools synth writes it) is built from that file and its header, its body not read.")
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
    # one rank per class will be simulated: files the writer stamped from one structure need not be read
    trust = symmetric is not False
    loaded = load_trace(list(inputs), steps=steps, allow_missing_ranks=allow_missing_ranks, trust_structure=trust)
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
