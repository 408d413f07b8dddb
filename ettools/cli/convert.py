"""``ettools convert``: a trace from one format to another."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ettools.cli.common import STEPS_HELP, WRITE_FORMATS, _name_option, _outdir
from ettools.cli_options import handle_errors, print_json, quiet_option
from ettools.io import clean_message


@click.command()
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
