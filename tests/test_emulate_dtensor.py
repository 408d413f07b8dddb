"""Emulated capture of a torchtitan-style script (FSDP2 over one mesh dimension, DTensor tensor
parallelism over the other; ``sample_traces/titan_2d.py``, 4 ranks by ``torchrun``) against the
real gloo capture of the same script on this CPU: DTensor's functional collectives (the
row-parallel all-reduces, waited with ``wait_tensor``) and FSDP2's all-gathers and
reduce-scatters are recorded on every rank with the real capture's types and bytes, in order."""

from __future__ import annotations

import gzip
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

if importlib.util.find_spec("torch") is None:  # torch runs in the child processes only: not imported here
    pytest.skip("torch is not installed", allow_module_level=True)
if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
    pytest.skip("emulated capture builds its device library with a C++ compiler; none here", allow_module_level=True)

from ettools.formats import load_trace  # noqa: E402
from ettools.graph import COMM_NODE_TYPES, NodeType  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASTRASIM = REPO.parent / "shared" / "tools" / "astrasim"
COMMAND = ["torchrun", "--nproc-per-node", "4", "-m", "sample_traces.titan_2d"]


def _capture(extra: list[str], out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ettools", "capture", "--steps", "2", "-q", "-o", str(out), *extra, "--",
                           *COMMAND], cwd=REPO, capture_output=True, text=True, timeout=600)


def _collectives(folder: Path) -> dict[int, list[tuple[int, int]]]:
    trace = load_trace([folder]).trace
    out = {}
    for rank, g in trace.graphs.items():
        rows = np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES]))
        out[rank] = [(int(g.comm_type[r]), int(g.comm_bytes[r])) for r in rows]
    return out


def test_fsdp2_with_dtensor_tp_records_the_real_collectives(tmp_path: Path) -> None:
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    real = _capture([], tmp_path / "real")
    assert real.returncode == 0, real.stderr[-2000:]
    emu = _capture(["--emulate", "H100"], tmp_path / "emu")
    assert emu.returncode == 0, emu.stderr[-2000:]
    got, want = _collectives(tmp_path / "emu"), _collectives(tmp_path / "real")
    assert sorted(got) == sorted(want) == [0, 1, 2, 3]
    for rank in want:
        assert got[rank] == want[rank], rank
    kinds = {k for seq in want.values() for k, _ in seq}
    assert len(kinds) >= 3  # all-reduce (TP), all-gather and reduce-scatter (FSDP) all took part
    # the matrix products a GPU runs are the local shards' (a DTensor op is recorded as the ops its
    # class runs on the shards, not as one op at the global shape): the same as the real run's
    # innermost products, in order
    for rank in want:
        assert _local_matmuls(tmp_path / "emu", rank) == _local_matmuls(tmp_path / "real", rank), rank


def _local_matmuls(folder: Path, rank: int) -> list[tuple[str, list]]:
    """The innermost ``mm``/``addmm``/``bmm`` of the last step of one rank's Kineto file, with their
    operand shapes, in issue order (a real trace also records the DTensor op around each)."""
    d = orjson.loads(gzip.open(folder / f"rank{rank}.kineto.json.gz").read())
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    step = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep")][-1]
    lo, hi = step["ts"], step["ts"] + step["dur"]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and lo <= e["ts"] <= hi
                  and e["name"] in ("aten::mm", "aten::addmm", "aten::bmm")), key=lambda e: (e["ts"], -e["dur"]))
    inner = [e for e in ops if not any(o is not e and e["ts"] <= o["ts"] and o["ts"] + o["dur"] <= e["ts"] + e["dur"]
                                       for o in ops)]
    return [(e["name"], [x for x in e["args"]["Input Dims"] if x]) for e in inner]


def _emulate_script(text: str, nproc: int, tmp_path: Path) -> None:
    """``text`` as a script under ``torchrun --nproc-per-node nproc``, captured on emulated H100s
    into ``tmp_path/emu`` (the test is skipped without torchrun; a failed capture fails it)."""
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    (tmp_path / "script.py").write_text(text)
    res = subprocess.run([sys.executable, "-m", "ettools", "capture", "--emulate", "H100", "-q", "-o",
                          str(tmp_path / "emu"), "--", "torchrun", "--nproc-per-node", str(nproc),
                          str(tmp_path / "script.py")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


PIPELINE_SCRIPT = """
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))  # no init_process_group: the mesh starts it
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
block = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(2)]).to(dev)
stage = PipelineStage(block, rank, world, dev)  # shapes inferred: stages send them as Python objects
schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, target: out.pow(2).mean())
opt = torch.optim.SGD(block.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(16, 256, device=dev)
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=x, losses=[])
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
"""


def test_torch_pipelining_stages_exchange_shapes_and_send_activations(tmp_path: Path) -> None:
    """torch.distributed.pipelining (torchtitan's pipeline parallelism) on 4 emulated ranks: its
    stages infer shapes by sending Python objects down the pipeline before the first step, which
    travel for real between the emulated processes (rank 3, emulated early for dedup, waits for
    rank 2, which is started for it). Each micro-batch then sends its 4 x 256 fp32 activation
    forward and its gradient back: 4 sends and 4 receives per neighbour per step, each naming its
    peer, so that the Chakra conversion can write them. The script starts the job with
    ``init_device_mesh("cuda", …)`` alone: DeviceMesh then starts the default group itself, through
    its own reference to ``init_process_group``, which must reach the emulated group too, not a real
    NCCL the CPU build lacks."""
    _emulate_script(PIPELINE_SCRIPT, 4, tmp_path)
    trace = load_trace([tmp_path / "emu"]).trace
    assert sorted(trace.graphs) == [0, 1, 2, 3]
    one = 16 // 4 * 256 * 4  # a micro-batch's activation (and its gradient), bytes
    for rank, g in trace.graphs.items():
        neighbours = 1 if rank in (0, 3) else 2
        for kind in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
            rows = np.flatnonzero(g.type == int(kind))
            assert len(rows) == 4 * neighbours, (rank, kind)
            assert set(g.comm_bytes[rows].tolist()) == {one}
            # each names its peer (Dst Rank / Src Rank, as a real NCCL trace does): a neighbour stage
            assert set(g.comm_peer[rows].tolist()) == {rank - 1, rank + 1} & set(range(4))
    from ettools.convert import convert_trace
    from ettools.replay import replay_trace

    # Schedule1F1B issues a stage's "send activation" and "receive gradient" as one
    # batch_isend_irecv, which NCCL runs as one group: recorded as one op after the other on one
    # stream, stages 1 and 2 would each wait to send before receiving and the replay deadlocks
    replay_trace(trace)
    ch = tmp_path / "chakra"
    convert_trace(load_trace([tmp_path / "emu"]), ch, "chakra")  # peers known: writable
    assert len(list(ch.glob("*.et"))) == 4
    if not (ASTRASIM / "run").exists():
        pytest.skip("ASTRA-sim not in ../shared/tools/astrasim")
    # stage 0 ends first, waiting on a send: ASTRA-sim's end-of-rank statistics, which throw on
    # host nodes, used to abort the whole run from the network's callback there (1 of 4 finished)
    net, system = ASTRASIM / "configs" / "Ring_4npus.yml", ASTRASIM / "configs" / "sys_ring_1d.json"
    sim = subprocess.run([str(ASTRASIM / "run"), str(ch), "trace", str(net), str(system)], capture_output=True,
                         text=True, timeout=120)
    cycles = [int(x) for x in re.findall(r"sys\[\d+\] finished, (\d+) cycles", sim.stdout)]
    assert len(cycles) == 4, sim.stdout[-1500:]
    ours = replay_trace(load_trace([ch]).trace, network=net, collectives=system).step_time_us
    assert ours == pytest.approx(max(cycles) / 1000.0, rel=0.01)


FAILING_RANK_SCRIPT = """
import torch.distributed as dist
dist.init_process_group("nccl")
if dist.get_rank() == 1:
    raise SystemExit("rank 1 gives up")
got = [None]
dist.recv_object_list(got, src=1)  # never sent: rank 0 would wait for rank 1 forever
"""


def test_a_failing_rank_ends_the_emulated_job(tmp_path: Path) -> None:
    """One rank exits with an error while its peer waits for a Python object from it: the capture
    ends the peer, as torchrun ends a job, names the rank and its status, and writes nothing (it
    used to watch only the first rank and wait for it forever)."""
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    (tmp_path / "script.py").write_text(FAILING_RANK_SCRIPT)
    res = subprocess.run([sys.executable, "-m", "ettools", "capture", "--emulate", "H100", "-q", "-o",
                          str(tmp_path / "emu"), "--", "torchrun", "--nproc-per-node", "2", str(tmp_path / "script.py")],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert res.returncode == 1
    assert "rank 1 gives up" in res.stderr
    assert "emulated rank 1 exited with status 1" in res.stderr and "ended" in res.stderr
    assert "exited with status 1 before a step was captured" in res.stderr  # the cause, not how it stepped
    assert not (tmp_path / "emu").exists()
