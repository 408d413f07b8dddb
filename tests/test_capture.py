"""``ettools.capture``: real captures of scripts that import nothing from ettools.

The tests that run torch are skipped when torch is not installed (it is the optional
``[capture]`` extra); each starts real Python processes, so there are few of them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import socket
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from ettools.capture import TORCH_HINT, CaptureError, capture, parse_steps, run_capture

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")

TRAIN = textwrap.dedent(
    """
    import sys
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1])):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    """
)

DDP = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    dist.destroy_process_group()
    """
)


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b", f"{path} is not gzip"
    assert raw[4:8] == b"\0\0\0\0", f"{path}: gzip mtime is not 0"
    return json.loads(gzip.decompress(raw))


def _rf_ids(et: dict) -> set[int]:
    return {a["value"] for n in et["nodes"] for a in n.get("attrs", []) if a["name"] == "rf_id"}


def test_parse_steps() -> None:
    assert parse_steps("2") == (2, 2)
    assert parse_steps("3-5") == (3, 5)
    for bad in ("0", "4-3", "x", "1-2-3", ""):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_exit_code_passes_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_capture([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "out")
    assert rc == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ettools capture: script exited with code 3")
    assert "never imported torch" in err[-1]


def test_missing_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a torch that cannot be imported, first on the child's path
    shim = tmp_path / "shim" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n'
    )
    monkeypatch.setenv("PYTHONPATH", str(shim.parent))
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    rc = run_capture([sys.executable, str(script), "3"], tmp_path / "out")
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"ettools capture: {TORCH_HINT}"
    assert not (tmp_path / "out" / "rank0.kineto.json.gz").exists()


def test_command_not_found(tmp_path: Path) -> None:
    with pytest.raises(CaptureError) as e:
        capture([str(tmp_path / "no-such-program")], tmp_path / "out")
    assert e.value.exit_code == 127


@needs_torch
def _one_step_of_two(out: Path, et: dict) -> None:
    """Selecting one Kineto step of a linked 2-step capture keeps only that step's ET ops."""
    import numpy as np

    from ettools.formats import load_trace
    from ettools.scaler import scale_trace

    loaded = load_trace([out], steps="3")
    g = loaded.trace.graphs[0]
    names = Counter(g.names())
    assert names["ProfilerStep#3"] == 1 and names["ProfilerStep#2"] == 0
    assert names["aten::addmm"] == 2  # the two linears of one forward
    per_step = Counter(n["name"] for n in et["nodes"])["aten::addmm"] // 2
    assert per_step == 2
    host = g.is_cpu_op != 0
    assert np.isfinite(g.start[host]).all(), "every ET op kept has its Kineto time"
    assert loaded.link_report.host_ops_matched == loaded.link_report.et_host_ops
    # a rewrite of the selected step is sound (ops of the other step used to form cycles)
    assert len(scale_trace(loaded.trace, dp=2).graphs) == 2


def test_single_process_capture(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank7.kineto.json.gz").write_bytes(b"stale")  # from an earlier capture: replaced
    res = capture([sys.executable, str(script), "4"], out, steps=(2, 3), memory=True)
    assert res.returncode == 0
    assert res.captured_steps == [2, 3] and res.ranks == [0] and res.steps_seen == 4
    assert sorted(p.name for p in out.iterdir()) == ["rank0.et.json.gz", "rank0.kineto.json.gz"]

    kineto = _load(out / "rank0.kineto.json.gz")
    events = kineto["traceEvents"]
    names = Counter(e["name"] for e in events if e.get("cat") == "user_annotation")
    assert names["ProfilerStep#2"] == 1 and names["ProfilerStep#3"] == 1
    assert not any(
        n.startswith("ProfilerStep#") and n not in ("ProfilerStep#2", "ProfilerStep#3") for n in names
    )
    # whole optimizer steps (the Optimizer.step span closes inside the window)
    assert names["Optimizer.step#SGD.step"] == 2
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    op_names = Counter(e["name"] for e in ops)
    assert op_names["aten::addmm"] >= 4  # 2 linears x 2 steps forward
    assert any(e.get("name") == "[memory]" for e in events)  # memory on by default
    step2 = next(e for e in events if e["name"] == "ProfilerStep#2")
    step3 = next(e for e in events if e["name"] == "ProfilerStep#3")
    assert step2["ts"] + step2["dur"] <= step3["ts"] + 1e-3

    et = _load(out / "rank0.et.json.gz")
    assert len(et["nodes"]) > 50
    assert {n["name"] for n in et["nodes"]} >= {"aten::addmm", "ProfilerStep#2"}
    # every host op joins its ET node through the record-function id
    assert {e["args"]["Record function id"] for e in ops} <= _rf_ids(et)
    _one_step_of_two(out, et)

    # the script ends inside the window: the whole steps are kept, the unfinished one dropped
    res = capture([sys.executable, str(script), "3"], tmp_path / "part", steps=(2, 5), memory=False)
    assert res.returncode == 0 and res.captured_steps == [2, 3]
    kineto = _load(tmp_path / "part" / "rank0.kineto.json.gz")
    et = _load(tmp_path / "part" / "rank0.et.json.gz")
    for names in ([e["name"] for e in kineto["traceEvents"]], [n["name"] for n in et["nodes"]]):
        assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
            "ProfilerStep#2",
            "ProfilerStep#3",
        ]
    ids = {n["id"] for n in et["nodes"]}
    assert all(n["ctrl_deps"] in ids for n in et["nodes"] if n["ctrl_deps"] not in (0, -1))

    # fewer optimizer steps than asked for: a clear error that says how many ran
    with pytest.raises(CaptureError) as e:
        capture([sys.executable, str(script), "1"], tmp_path / "none", steps=(2, 2), memory=False)
    assert e.value.exit_code == 2
    assert str(e.value) == "no step captured: asked for step 2, the script ran 1 optimizer step"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_torch
def test_two_ranks_with_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not on PATH")
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    out = tmp_path / "out"
    cmd = [
        torchrun,
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
    ]
    res = capture([*cmd, str(script)], out, steps=(3, 3), memory=False)
    assert res.returncode == 0
    assert res.ranks == [0, 1]
    for rank in (0, 1):
        kineto = _load(out / f"rank{rank}.kineto.json.gz")
        assert kineto["distributedInfo"]["rank"] == rank
        assert kineto["distributedInfo"]["world_size"] == 2
        events = kineto["traceEvents"]
        assert [e["name"] for e in events if e["name"].startswith("ProfilerStep#")] == ["ProfilerStep#3"]
        assert not any(e.get("name") == "[memory]" for e in events)  # --no-memory
        coll = [e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")]
        # DDP of Linear(16, 4): one bucket of 16*4 + 4 gradient elements, nothing else
        assert [(e["name"], e["args"]["Input Dims"][0]) for e in coll] == [("c10d::allreduce_", [[68]])]
        et = _load(out / f"rank{rank}.et.json.gz")
        assert any(n["name"] == "## process_group:init ##" for n in et["nodes"])

    # the capture converts: ET and Kineto of both ranks link, and the all-reduce survives in Chakra
    from click.testing import CliRunner

    from ettools.cli import main

    res = CliRunner().invoke(main, ["convert", str(out), "-o", str(tmp_path / "chakra"), "--json", "-q"])
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["input_format"] == "pytorch-et+kineto" and summary["ranks"] == [0, 1]
    assert summary["linking"]["host_match_rate"] == 1.0
    res = CliRunner().invoke(main, ["info", str(tmp_path / "chakra"), "--json"])
    info = json.loads(res.stdout)
    for rank in ("0", "1"):
        assert info["ranks"][rank]["comm"]["ALL_REDUCE"] == {"count": 1, "bytes": 68 * 4}
    assert info["collectives"]["matched"] == 1 and info["collectives"]["unmatched_count"] == 0
