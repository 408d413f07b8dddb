"""Newcomer papercuts: every option of every command says what it does, --steps says how steps are
numbered, the package has a version and runs as ``python -m ettools``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click

import ettools
from ettools.cli import main

REPO = Path(__file__).resolve().parents[1]


def _commands(cmd: click.Command, path: tuple[str, ...] = ("ettools",)):
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def test_every_option_of_every_command_has_help():
    missing = [f"{' '.join(path)} {'/'.join(p.opts)}"
               for path, cmd in _commands(main) for p in cmd.params
               if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert not missing, missing
    no_doc = [" ".join(path) for path, cmd in _commands(main) if not (cmd.help or "").strip()]
    assert not no_doc, no_doc


def test_steps_help_says_how_steps_are_numbered():
    seen = 0
    for path, cmd in _commands(main):
        for p in cmd.params:
            if isinstance(p, click.Option) and "--steps" in p.opts:
                seen += 1
                assert "ProfilerStep#N" in p.help, (path, p.help)
    assert seen >= 5


def test_version_and_python_dash_m():
    # the version the package reports is the one pyproject.toml declares
    declared = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert declared and ettools.__version__ == declared.group(1)
    res = subprocess.run([sys.executable, "-m", "ettools", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert res.returncode == 0 and "synth" in res.stdout and "convert" in res.stdout, res.stderr


def test_validate_report_step_time_in_its_heading_unit_and_headline_in_table(tmp_path):
    import gzip
    import json

    from click.testing import CliRunner

    ref = REPO / "sample_traces" / "tp_sp"
    cand = tmp_path / "cand"
    runner = CliRunner()
    res = runner.invoke(main, ["scale", str(REPO / "sample_traces" / "single"), "--tp", "2", "--sp",
                               "-o", str(cand), "-q"])
    assert res.exit_code == 0, res.output
    report = tmp_path / "r.md"
    res = runner.invoke(main, ["validate", str(ref), str(cand), "--report", str(report), "-q"])
    assert res.exit_code in (0, 1), res.output
    text = report.read_text()
    # the reference step: the longest ProfilerStep over ranks, read from the raw Kineto files (µs)
    steps = [e["dur"] for p in sorted(ref.glob("*.kineto.json.gz"))
             for e in json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    section = text.split("## Step time (")[1]
    unit = section.split(")")[0]
    row = next(line for line in section.splitlines() if line.startswith("| step |"))
    shown = float(row.split("|")[-4].strip().replace(",", ""))
    assert unit in ("ms", "µs")
    assert abs(shown * (1000 if unit == "ms" else 1) - max(steps)) <= (50 if unit == "ms" else 0.05)
    # the headline is the total error row of a table
    headline = text.split("**max total error**: ")[1].split("\n")[0]
    totals = [line.rsplit("|", 2)[-2].strip() for line in text.splitlines() if line.startswith("| total error")]
    assert headline in totals, (headline, totals)
