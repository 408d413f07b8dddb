"""Host time of emulated capture: the program's Python events and top-level ops are counted as
the PyTorch profiler records them (checked against a real profiled run of the same script on this
CPU), a host-cost table measured on other programs' real traces predicts a host-bound real step,
and the options that choose the table fail in one line."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

if importlib.util.find_spec("torch") is None:  # torch runs in the child processes only: not imported here
    pytest.skip("torch is not installed", allow_module_level=True)
if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
    pytest.skip("emulated capture builds its device library with a C++ compiler; none here", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO.parent / "shared" / "traces" / "hardware_pairs"

# A plain PyTorch program with Python helpers, module nesting, operators and torch functions.
# With PROFILE=1 it runs on the CPU under the real profiler (with_stack) and prints the counts of
# its second forward; without, it runs on "cuda" (the emulated device).
SCRIPT = r'''
import os, sys, torch
from torch import nn

def scale(x, k):
    return x * k

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
    def forward(self, x):
        h = self.fc1(self.ln(x))
        h = torch.nn.functional.gelu(h)
        return x + scale(self.fc2(h), 0.5)

class Net(nn.Module):
    def __init__(self, d=64, n=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        idx = x[:, [0, -1]]  # list indexing: an index tensor moved to the device
        return self.head(x).softmax(-1), idx.sum()

profile = os.environ.get("PROFILE") == "1"
dev = "cpu" if profile else "cuda"
net = Net().to(dev)
x = torch.randn(8, 64, device=dev)
with torch.inference_mode():
    net(x)
    if profile:
        from torch.profiler import profile as prof, ProfilerActivity
        with prof(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True) as p:
            net(x)
        p.export_chrome_trace(sys.argv[1])
    else:
        net(x)
        _, s = net(x)
        print("value read:", s.item())
'''


def _profiled_counts(script: Path, out: Path) -> tuple[int, int]:
    """Python events and top-level ops of the real profiled CPU forward (inside its root module call)."""
    res = subprocess.run([sys.executable, str(script), str(out)], env={**_env(), "PROFILE": "1"},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    ev = [e for e in orjson.loads(out.read_bytes())["traceEvents"] if e.get("ph") == "X"]
    root = next(e for e in ev if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: Net"))
    lo, hi = root["ts"], root["ts"] + root["dur"]
    py = [e for e in ev if e.get("cat") == "python_function" and lo < e["ts"] < hi]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and lo <= e["ts"] <= hi), key=lambda e: (e["ts"], -e["dur"]))
    tops, end = 0, -1.0
    for e in ops:
        if e["ts"] >= end:
            tops, end = tops + 1, e["ts"] + e["dur"]
    return len(py), tops


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "ETTOOLS_EMULATE"}


def test_python_events_and_top_level_ops_counted_as_the_profiler_records_them(tmp_path: Path) -> None:
    from ettools.capture_emulate import run_emulated
    from ettools.replay.compute import load_hardware

    script = tmp_path / "net.py"
    script.write_text(SCRIPT)
    real_py, real_tops = _profiled_counts(script, tmp_path / "real.json")
    raws, status = run_emulated([sys.executable, str(script)], load_hardware("H100"), None, (2, 2), quiet=True,
                                cwd=str(REPO))
    assert status == 0
    raw = next(r for r in raws if r.get("steps"))
    _, first, end = raw["steps"][0]
    rows = raw["rows"][first:end]
    emu_py = sum(r[12] for r in rows[1:])  # events before the first op precede the root call's ops
    emu_tops = sum(r[13] for r in rows)
    # the profiler's own frames and the root call's entry differ by a handful of events
    assert abs(emu_py - real_py) <= max(8, 0.1 * real_py), (emu_py, real_py)
    assert abs(emu_tops - real_tops) <= max(2, 0.1 * real_tops), (emu_tops, real_tops)


def _step_us(path: Path) -> float:
    d = orjson.loads(gzip.open(path).read())
    steps = [e for e in d["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep")]
    return float(steps[-1]["dur"])


@pytest.mark.skipif(not (PAIRS / "bert_small" / "h100.json.gz").exists(), reason="shared hardware pairs missing")
def test_host_measured_on_other_models_predicts_a_host_bound_step(tmp_path: Path) -> None:
    """bert-small's real H100 step is host-bound (8 % GPU busy). The host-cost table is measured
    on the same machine's traces of two *other* models (ViT, Qwen); the emulated bert-small step
    lands within 25 % of the real one (the installed transformers runs ~40 % more Python per
    forward than the 4.49 the reference ran), where device time alone is 0.3 of 3.9 ms."""
    if importlib.util.find_spec("transformers") is None:  # used by the child process only
        pytest.skip("transformers is not installed")
    out = tmp_path / "bert"
    res = subprocess.run([sys.executable, "-m", "ettools", "capture", "--emulate", "H100", "--steps", "2", "-o", str(out),
                          "--host-from", str(PAIRS / "falconsai_vit" / "h100.json.gz"),
                          "--host-from", str(PAIRS / "qwen1.5_0.5b" / "h100.json.gz"), "--",
                          sys.executable, "-m", "sample_traces.hf_run", str(REPO / "sample_traces/hf_configs/bert_small"),
                          "--batch", "1", "--length", "141", "--iters", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "measured from 2 --host-from trace(s)" in res.stderr
    real = _step_us(PAIRS / "bert_small" / "h100.json.gz")
    emu = _step_us(out / "rank0.kineto.json.gz")
    assert abs(emu - real) / real < 0.25, (emu, real)
    meta = orjson.loads(gzip.open(out / "rank0.kineto.json.gz").read())["ettools"]
    assert len(meta["host_costs"]["traces"]) == 2


def test_host_from_refuses_what_is_not_a_profiled_trace(tmp_path: Path) -> None:
    """Refused before anything runs: the group's one line and exit 2, in this process (CliRunner)."""
    from click.testing import CliRunner

    from ettools.cli import main

    bad = tmp_path / "not_a_trace.json"
    bad.write_text('{"nodes": []}')
    res = CliRunner().invoke(main, ["capture", "--emulate", "H100", "--host-from", str(bad), "-o", str(tmp_path / "o"),
                                    "--", sys.executable, "-c", "pass"])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--host-from" in lines[0] and "traceEvents" in lines[0], res.stderr
    assert not (tmp_path / "o").exists()
    res = CliRunner().invoke(main, ["capture", "--host-from", str(bad), "-o", str(tmp_path / "o"),
                                    "--", sys.executable, "-c", "pass"])
    assert res.exit_code == 2 and "--host-from needs --emulate" in res.stderr
