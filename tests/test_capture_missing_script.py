"""``ettools capture -- torchrun ... missing.py`` (and ``--emulate``): one line naming the missing
script, exit 2, nothing run and no output folder — not a launcher traceback from every rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("emulate", [[], ["--emulate", "H100"]])
@pytest.mark.parametrize("launcher", [["torchrun", "--nproc-per-node", "2"], [sys.executable]])
def test_missing_script_is_one_line(tmp_path: Path, emulate: list[str], launcher: list[str]) -> None:
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "ettools", "capture", *emulate, "-o", str(out), "--", *launcher,
                          str(tmp_path / "missing.py"), "--epochs", "1"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "missing.py" in lines[0] and "does not exist" in lines[0], res.stderr
    assert not out.exists()
