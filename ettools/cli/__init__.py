"""The ``ettools`` command line: one click group, one subcommand per job.

Bad input ends with one line on stderr naming the file and the problem, and exit code 2.

The group :func:`main` is in :mod:`ettools.cli.group`, the helpers several commands share in
:mod:`ettools.cli.common` (and :mod:`ettools.cli_options`), each subcommand in a module of its
own (``ettools/cli/<command>.py``; ``search`` lives with its engine, :mod:`ettools.replay.search.cli`).
This package adds them to the group and re-exports their names. A command's heavy imports stay
inside its function: importing this package stays cheap.
"""

from __future__ import annotations

from ettools import __version__
from ettools.cli.calibrate import calibrate
from ettools.cli.capture import capture
from ettools.cli.common import (
    PLOT_SUFFIXES,
    STEPS_HELP,
    WRITE_FORMATS,
    _check_world,
    _name_option,
    _need_matplotlib,
    _outdir,
    _outfile,
    _plot_file,
    parse_range,
    parse_rank_list,
)
from ettools.cli.convert import convert
from ettools.cli.group import _EchoHandler, _Group, _LevelPrefix, _log_warnings_as_lines, main
from ettools.cli.info import info
from ettools.cli.replay import replay
from ettools.cli.scale import scale
from ettools.cli.serve import MAX_SERVE_GPUS, serve
from ettools.cli.synth import _list_models, synth
from ettools.cli.validate import validate
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
from ettools.io import check_name, check_output_dir, check_output_file, clean_message
from ettools.progress import is_quiet
from ettools.replay.search.cli import search_command

for _command in (convert, info, capture, validate, replay, calibrate, scale, synth, serve):
    main.add_command(_command)
# ettools search lives with its engine (replay/search/cli.py); registered here, after main exists
main.add_command(search_command)
del _command

__all__ = [
    "MAX_DIM", "MAX_SERVE_GPUS", "MAX_WORLD", "PLOT_SUFFIXES", "STEPS_HELP", "WRITE_FORMATS", "FiniteRange",
    "_EchoHandler", "_Group", "_LevelPrefix", "__version__", "_check_world", "_fail", "_list_models",
    "_log_warnings_as_lines", "_name_option", "_need_matplotlib", "_outdir", "_outfile", "_plot_file",
    "calibrate", "capture", "check_name", "check_output_dir", "check_output_file", "clean_message", "convert",
    "handle_errors", "info", "is_quiet", "main", "parse_dims", "parse_range", "parse_rank_list", "print_json",
    "quiet_option", "replay", "scale", "search_command", "serve", "synth", "validate",
]
