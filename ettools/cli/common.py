"""What several ``ettools`` subcommands share: output-path checks, ``--name``, ``--steps`` help,
the world-size check and the ``--steps``/``--ranks`` parsers (option-level helpers every command
uses are in :mod:`ettools.cli_options`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ettools.cli_options import MAX_WORLD
from ettools.io import check_name, check_output_dir, check_output_file

WRITE_FORMATS = ("chakra", "chakra-json", "chrome", "astrasim-json", "triosim")
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
