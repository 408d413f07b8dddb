"""A command pays only for what it uses (issue 27, item 4): the ``ettools`` group imports a
subcommand when it is run or listed, and ``info`` on a training trace imports no stage but the
Kineto reader (no replay, search, scaler, serving model, progress bars).

What the imports cost is measured in ``tests/bench/bench_kineto.py --info``, not here: these tests
check which modules are loaded, never how long anything takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "single" / "rank0.kineto.json.gz"
COMMANDS = {"calibrate", "capture", "convert", "info", "replay", "scale", "search", "serve", "synth", "validate"}
HEAVY = ("ettools.replay", "ettools.scaler", "ettools.cli.convert", "ettools.cli.replay", "tqdm", "scipy")


def _loaded_after(code: str) -> list[str]:
    """The heavy modules (:data:`HEAVY`) loaded once ``code`` has run, in a fresh interpreter."""
    probe = (f"{code}\nimport sys\n"
             f"print('loaded:', *sorted(m for m in sys.modules if m.startswith({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.splitlines()[-1].split()[1:]


def test_importing_the_command_line_imports_no_command():
    assert _loaded_after("import ettools.cli") == []


def test_info_on_a_training_trace_imports_no_other_stage():
    run = ("from ettools.cli import main\n"
           "try:\n"
           f"    main(['info', {str(SAMPLE)!r}])\n"
           "except SystemExit as e:\n"
           "    assert not e.code, e.code")
    assert _loaded_after(run) == []


def test_every_command_is_listed_and_each_loads_on_demand():
    from ettools.cli import main

    assert set(main.commands) == COMMANDS and len(main.commands) == len(COMMANDS)
    assert "info" in main.commands and "nosuch" not in main.commands
    assert main.commands.get("nosuch") is None
    assert all(isinstance(main.commands[name], click.Command) for name in COMMANDS)
    assert main.commands["search"].name == "search"


def test_reexported_names_are_the_objects_they_were():
    import ettools.cli as cli
    from ettools.cli import MAX_DIM, STEPS_HELP, info, search_command
    from ettools.cli.common import STEPS_HELP as steps_help
    from ettools.cli_options import MAX_DIM as max_dim

    assert isinstance(info, click.Command) and info.name == "info"
    assert isinstance(search_command, click.Command) and search_command.name == "search"
    assert (MAX_DIM, STEPS_HELP) == (max_dim, steps_help)
    assert isinstance(cli.main.commands["info"], click.Command)
    assert all(hasattr(cli, name) for name in cli.__all__)
