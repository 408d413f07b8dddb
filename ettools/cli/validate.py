"""``ettools validate``: compare a candidate trace with a reference."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ettools.cli.common import STEPS_HELP, _outfile
from ettools.cli_options import FiniteRange, _fail, handle_errors, print_json, quiet_option


@click.command()
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
