"""``ettools info``: a summary of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ettools.cli.common import STEPS_HELP
from ettools.cli_options import (
    handle_errors,
    import_numpy_without_blas_threads,
    print_json,
    quiet_option,
    skip_exit_gc,
)
from ettools.gcpause import no_gc
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
    import_numpy_without_blas_threads()  # info calls no BLAS: no thread pool spinning beside it
    skip_exit_gc()  # nothing is written but stdout
    # no collector passes while the trace is alive: the reader pauses them while it parses and builds,
    # and the trace's millions of objects, all young when it returns, would otherwise be walked by the
    # next passes (a first and a second generation pass, ~40 ms of CPU on a 35 MB trace), to find no
    # garbage; they resume once the trace is freed (when _info returns)
    with no_gc():
        _info(inputs, et, steps, as_json)


def _info(inputs: tuple[Path, ...], et: Path | None, steps: str | None, as_json: bool) -> None:
    from ettools.formats import load_trace
    from ettools.report import info_report, render_info

    loaded = load_trace(list(inputs), et=et, steps=steps)
    report = info_report(loaded)
    for note in loaded.notes:  # defects kept: counted in report["problems"]
        click.echo(f"ettools: warning: {clean_message(note)}", err=True)
    served = _serving_steps(loaded.trace)
    if served:
        report["serving_steps"] = served
    if as_json:
        print_json(report)
    else:
        click.echo(render_info(report))
        if served:
            from ettools.replay.serve.steps import serving_lines

            click.echo("\n".join(serving_lines(served)))


def _serving_steps(trace: Any) -> list[dict[str, Any]]:
    """vLLM/SGLang ``execute_…`` spans as prefill, decode or mixed iterations
    (:func:`ettools.replay.serve.steps.serving_steps`); [] without a look at the graphs when no
    step's name holds ``execute_``, which every name its pattern matches does. So the serving
    model (``ettools.replay`` and its calibration) is imported, and every rank's host view built,
    only for a trace that has such steps (issue 27: ~60 ms of CPU on every training trace)."""
    if not any("execute_" in str(s[0]) for g in trace.graphs.values() for s in g.meta.get("steps") or ()):
        return []
    from ettools.replay.serve.steps import serving_steps

    return serving_steps(trace)
