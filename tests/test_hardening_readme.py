"""Every README command runs as written: the ```bash blocks are extracted from README.md and the stage
READMEs (converters/, scaler/, replay/README.md, whose commands also run from the repository root) and
run in order from a scratch copy of the repository root (sample_traces/ and converters/ linked, the shared
traces beside it), so their ``out/`` stays out of the checkout. Commands that install packages, need
a PyTorch capture or run for minutes are skipped, each for a stated reason."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
READMES = ("README.md", "converters/README.md", "scaler/README.md", "replay/README.md")

# (prefix of the command, why it is not run here)
SKIP = [
    ("python3 -m venv", "creates a virtual environment (the suite already runs in one)"),
    (". .venv/bin/activate", "activates that environment"),
    ("pip install", "installs packages"),
    ("python -m pytest", "the suite itself"),
    ("../shared/tools/astrasim/run", "the real ASTRA-sim binary (tests/test_astrasim_real.py runs it)"),
    ("ettools capture", "needs PyTorch and runs a training script"),
    ("ettools calibrate --network --measure", "needs PyTorch and starts worker processes (tests/test_collbench.py)"),
    ("ettools replay out/tp_sp_rewritten --network out/gloo_net.json", "reads the measured fit above"),
    ("ettools convert out/cap", "reads the capture above"),
    ("ettools validate out/cap", "reads the capture above"),
    ("ettools synth --model llama3-70b", "4,096-rank plan: ~1 min and ~1 GB written"),
    ("ettools scale ../shared/traces/kineto/hta_fwdbwd_1rank --dp 64", "64 ranks of a 15 MB trace: ~1 min"),
    ("ettools calibrate ../shared", "fits op models on a 25 MB trace: ~1 min"),
    ("ettools replay ../shared/traces/et_kineto/param_linear --timing calibrated", "reads that fit"),
    ("ettools serve", "simulates 120 s of serving on 8 engines: ~1 min"),
    ("ettools search", "a plan search of 728 plans: minutes, and the search extra"),
]


def readme_commands() -> list[str]:
    """The READMEs' bash commands in order: continuations joined, comments and ``&&`` chains split."""
    text = "\n".join((REPO / name).read_text() for name in READMES if (REPO / name).exists())
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()  # a trailing comment
            if not line or line.startswith("#"):
                continue
            out += [part.strip() for part in line.split(" && ")]
    return out


def _skip_reason(cmd: str) -> str | None:
    return next((why for prefix, why in SKIP if cmd.startswith(prefix)), None)


def test_readme_commands_run_as_written(tmp_path, monkeypatch):
    """Each command runs through the ``ettools`` group in this process (click's CliRunner: the
    group's own error handling and exit codes, arguments exactly as written), from the scratch
    root; the console script's process boundary is tested in test_cli.py."""
    if not (SHARED / "traces").is_dir():
        pytest.skip("the shared traces are not beside the checkout")
    from click.testing import CliRunner

    from ettools.cli import main

    root = tmp_path / "repo"
    root.mkdir()
    for name in ("sample_traces", "converters", "README.md"):
        (root / name).symlink_to(REPO / name)
    (tmp_path / "shared").symlink_to(SHARED)
    cmds = readme_commands()
    assert any(c.startswith("ettools synth --list-models") for c in cmds)
    monkeypatch.chdir(root)
    ran, failed = 0, []
    for cmd in cmds:
        if _skip_reason(cmd):
            continue
        argv = shlex.split(cmd)
        assert argv[0] == "ettools", cmd  # anything else must be in SKIP with its reason
        res = CliRunner().invoke(main, [*argv[1:], "-q"], prog_name="ettools")
        ran += 1
        if res.exit_code != 0:
            why = res.stderr.strip()[-300:] or repr(res.exception)
            failed.append(f"{cmd}: exit {res.exit_code}: {why}")
    assert not failed, failed
    assert ran >= 15
    # every output named under -o/--report/--timeline landed in out/ of the scratch root
    assert not [p.name for p in root.iterdir() if p.name not in ("sample_traces", "converters", "README.md", "out")]


def test_every_skipped_readme_command_has_a_reason_and_exists():
    cmds = readme_commands()
    for prefix, why in SKIP:
        assert why and any(c.startswith(prefix) for c in cmds), prefix


def test_readme_outputs_go_under_out():
    for cmd in readme_commands():
        argv = shlex.split(cmd)
        for flag in ("-o", "--output", "--report", "--timeline", "--plot"):
            if flag in argv:
                target = argv[argv.index(flag) + 1]
                assert target.startswith("out/"), cmd
