"""``ettools info``: a summary of a trace."""

from __future__ import annotations

from pathlib import Path

import click

from ettools.cli.common import STEPS_HELP
from ettools.cli_options import handle_errors, print_json, quiet_option
from ettools.io import clean_message


@click.command()
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
