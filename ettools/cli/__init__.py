"""The ``ettools`` command line: one click group, one subcommand per job.

Bad input ends with one line on stderr naming the file and the problem, and exit code 2.

The group :func:`main` is in :mod:`ettools.cli.group`, the helpers several commands share in
:mod:`ettools.cli.common` (and :mod:`ettools.cli_options`), each subcommand in a module of its
own (``ettools/cli/<command>.py``; ``search`` lives with its engine, :mod:`ettools.replay.search.cli`).
This package registers them with the group by name and re-exports their names, and imports none of
them until it is used (PEP 562 ``__getattr__``; the group imports a command when it is invoked or
listed): importing every command pulled in every stage, a third of ``ettools info``'s start-up
(issue 27). A command's heavy imports stay inside its function for the same reason.
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import TYPE_CHECKING, Any

from ettools import __version__
from ettools.cli.group import _EchoHandler, _Group, _LevelPrefix, _log_warnings_as_lines, main

if TYPE_CHECKING:  # the names __getattr__ gives (and, read from the source, the import graph's edges)
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

# command name -> (module, attribute), in the order `ettools --help` used to register them
_COMMANDS: dict[str, tuple[str, str]] = {
    **{c: (f"ettools.cli.{c}", c) for c in
       ("convert", "info", "capture", "validate", "replay", "calibrate", "scale", "synth", "serve")},
    # ettools search lives with its engine (replay/search/cli.py)
    "search": ("ettools.replay.search.cli", "search_command"),
}

# re-exported name -> the module that defines it
_HOME: dict[str, str] = {
    **{attr: module for module, attr in _COMMANDS.values()},
    **dict.fromkeys(("PLOT_SUFFIXES", "STEPS_HELP", "WRITE_FORMATS", "_check_world", "_name_option",
                     "_need_matplotlib", "_outdir", "_outfile", "_plot_file", "parse_range", "parse_rank_list"),
                    "ettools.cli.common"),
    "MAX_SERVE_GPUS": "ettools.cli.serve",
    "_list_models": "ettools.cli.synth",
    **dict.fromkeys(("MAX_DIM", "MAX_WORLD", "FiniteRange", "_fail", "handle_errors", "parse_dims", "print_json",
                     "quiet_option"), "ettools.cli_options"),
    **dict.fromkeys(("check_name", "check_output_dir", "check_output_file", "clean_message"), "ettools.io"),
    "is_quiet": "ettools.progress",
}


def __getattr__(name: str) -> Any:
    """A re-exported name, importing the one module that defines it on first use.

    A command's name is also its module's (``ettools.cli.info`` holds ``info``): importing the module
    sets the package attribute to the module, so the command is put back in its place here."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


for _name, (_, _attr) in _COMMANDS.items():
    main.commands.add_lazy(_name, partial(__getattr__, _attr))
del _name, _attr


__all__ = [
    "MAX_DIM", "MAX_SERVE_GPUS", "MAX_WORLD", "PLOT_SUFFIXES", "STEPS_HELP", "WRITE_FORMATS", "FiniteRange",
    "_EchoHandler", "_Group", "_LevelPrefix", "__version__", "_check_world", "_fail", "_list_models",
    "_log_warnings_as_lines", "_name_option", "_need_matplotlib", "_outdir", "_outfile", "_plot_file",
    "calibrate", "capture", "check_name", "check_output_dir", "check_output_file", "clean_message", "convert",
    "handle_errors", "info", "is_quiet", "main", "parse_dims", "parse_range", "parse_rank_list", "print_json",
    "quiet_option", "replay", "scale", "search_command", "serve", "synth", "validate",
]
