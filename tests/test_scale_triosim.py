"""Rewrites of traces without host ops: TrioSim's CSV (VGG-13 on an H100), the same run as Kineto+ET,
and a device-only Kineto trace; and passes that would change nothing refuse (exit 2), never copy.

Expected values are read from the raw files here with the csv module, not from ettools.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.checks import verify
from ettools.cli import main
from ettools.formats import load_trace
from ettools.graph import CollectiveType, EdgeKind, NodeType, ProcessGroup
from ettools.replay import replay_trace
from ettools.scaler import ScaleError, data_parallel, pipeline_parallel, scale_trace
from ettools.scaler.passes import _require_used_groups


def _ids(cell: str) -> list[int]:
    body = cell.strip()[1:-1].replace(" ", "")
    return [int(x) for x in body.split(";")] if body else []


@pytest.fixture(scope="module")
def csv_model(trio_dir: Path) -> dict:
    """Parameters of the model read from the CSV: every input of a forward conv2d/linear row after its activation."""
    with open(trio_dir / "tensor.csv", newline="") as f:
        tens = {int(r["TensorID"]): int(r["TensorNumElement"]) * int(r["TensorEachByte"]) for r in csv.DictReader(f)}
    with open(trio_dir / "trace.csv", newline="") as f:
        ops = list(csv.DictReader(f))
    params = [t for r in ops if r["stage"] == "forward" and r["OperatorName"] in ("aten::conv2d", "aten::linear")
              for t in _ids(r["Operator_input"])[1:]]
    fwd = [r for r in ops if r["stage"] == "forward"]
    return {"grad_bytes": sum(tens[t] for t in params), "grads": len(params), "ops": ops, "fwd_ops": len(fwd),
            "fwd_us": sum(float(r["Operator_cudatimenooverlap"]) for r in fwd)}


def _allreduce_bytes(g) -> int:
    c = (g.type == NodeType.COMM_COLL_NODE) & (g.comm_type == CollectiveType.ALL_REDUCE)
    return int(g.comm_bytes[c].sum())


def test_csv_model_is_vgg13(csv_model):
    # VGG-13: 10 convolutions + 3 linears, weight and bias each: 26 gradients, 532.2 MB in fp32
    assert csv_model["grads"] == 26
    assert round(csv_model["grad_bytes"] / 1e6, 1) == 532.2


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_ddp_allreduces_every_gradient(trio, csv_model, dp):
    out = scale_trace(trio, dp=dp)
    assert out.meta.world_size == dp and verify(out) == []
    for g in out.graphs.values():
        assert _allreduce_bytes(g) == csv_model["grad_bytes"]
    # DDP: several buckets, the first launched during backward (overlapped), not after it
    g = out.graphs[0]
    names = g.names()
    coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    assert len(coll) > 1
    src, dst, kind = g.edge_rows()
    first = coll[0]
    prod = src[(dst == first) & (kind == EdgeKind.DATA)]
    last_bwd = max(r for r, s in enumerate(names) if s.startswith("autograd::"))
    assert len(prod) and all(names[p].startswith("autograd::") and p != last_bwd for p in prod.tolist())


def test_standard_dp_reduces_after_backward(trio, csv_model):
    out = data_parallel(trio, 2, overlap=False)
    g = out.graphs[0]
    names = g.names()
    last_bwd = max(r for r, s in enumerate(names) if s.startswith("autograd::"))
    coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    src, dst, kind = g.edge_rows()
    for c in coll.tolist():
        p = src[(dst == c) & (kind == EdgeKind.DATA)]
        assert p.tolist() == [last_bwd]
    assert _allreduce_bytes(g) == csv_model["grad_bytes"]


def test_kineto_et_pair_gives_the_same_gradient_bytes(shared_traces: Path, csv_model):
    d = shared_traces / "et_kineto" / "triosim_vgg13_h100"
    tr = load_trace([d / "kineto.json.gz"], et=d / "et.json.gz").trace
    out = scale_trace(tr, dp=2)
    assert verify(out) == []
    assert {_allreduce_bytes(g) for g in out.graphs.values()} == {csv_model["grad_bytes"]}


@pytest.fixture(scope="module")
def single_replay(trio):
    rep = replay_trace(trio)
    return rep.ranks[0]


def _check_replay(out, single, world: int) -> None:
    rep = replay_trace(out)
    assert len(rep.ranks) == world
    for r, rr in rep.ranks.items():
        assert rr.compute_us < single.compute_us, f"rank {r}: compute per rank must drop"
        assert rr.comm_us > 0, f"rank {r}: communication must be > 0"


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel(trio, single_replay, tp):
    out = scale_trace(trio, tp=tp)
    assert out.meta.world_size == tp and verify(out) == []
    g = out.graphs[0]
    assert (g.type == NodeType.COMM_COLL_NODE).sum() > 0
    _check_replay(out, single_replay, tp)


@pytest.mark.parametrize("pp,micro", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_pipeline_parallel(trio, csv_model, single_replay, pp, micro):
    out = scale_trace(trio, pp=pp, micro_batches=micro)
    assert out.meta.world_size == pp and verify(out) == []
    fwd_names = [r["OperatorName"] for r in csv_model["ops"] if r["stage"] == "forward"]
    per_stage = []
    for g in out.graphs.values():
        names = g.names()
        comp = [names[r] for r in np.flatnonzero(g.type == NodeType.COMP_NODE)]
        fwd = [s for s in comp if not s.startswith("autograd::") and not s.startswith("aten::_foreach")]
        per_stage.append(len(fwd) // micro)
        # each stage holds part of the model, and sends/receives across its cut
        assert 0 < len(fwd) // micro < csv_model["fwd_ops"]
        assert ((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE)).any()
    assert sum(per_stage) == len(fwd_names)
    _check_replay(out, single_replay, pp)


def test_device_only_kineto_refuses_naming_what_is_missing(shared_traces: Path):
    path = shared_traces / "kineto" / "tracelens_mi210_gpu_only" / "rank0.json.gz"
    tr = load_trace([path]).trace
    with pytest.raises(ScaleError, match="no gradient.*no tensor sizes"):
        scale_trace(tr, dp=2)
    with pytest.raises(ScaleError, match="tensor sizes"):
        scale_trace(tr, tp=2)
    with pytest.raises(ScaleError, match="tensor sizes"):
        scale_trace(tr, pp=2)


def test_cli_exits_2_instead_of_copying(shared_traces: Path, tmp_path: Path):
    path = shared_traces / "kineto" / "tracelens_mi210_gpu_only" / "rank0.json.gz"
    res = CliRunner().invoke(main, ["scale", str(path), "--dp", "2", "-o", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2
    assert "no gradient" in res.output and str(path) in res.output
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def _tiny_csv(d: Path, forward: int) -> Path:
    """A TrioSim trace of ``forward`` parametric forward ops, their backward and an SGD step."""
    d.mkdir()
    tens = [["Index", "TensorID", "TensorShape", "TensorNumElement", "TensorEachByte", "TensorType",
             "TensorStorgeid", "gpuid"]]
    ops = [["OperatorID", "OperatorName", "Operator_input", "Operator_output", "Operator_cudatime",
            "Operator_cudatimenooverlap", "InputSize", "OutputSize", "gpuid", "stage", "tpflag"]]

    def t(tid: int, n: int, role: str) -> None:
        tens.append([len(tens) - 1, tid, f"[8, {n // 8}]", n, 4, role, tid + 1000, 0])

    t(1, 64, "input")
    ws, gs = [], []
    x = 1
    for i in range(forward):
        w, y = 10 + 2 * i, 100 + i
        t(w, 64, "weight")
        t(y, 64, "output")
        ops.append([len(ops), "aten::linear", f"[{x}; {w}]", f"[{y}]", 10, 10, "[64; 64]", "[64]", 0, "forward", 1])
        ws.append(w)
        x = y
    for i in reversed(range(forward)):
        gw = 200 + i
        t(gw, 64, "output")
        ops.append([len(ops), "autograd::engine::evaluate_function: AddmmBackward0", f"[{ws[i]}]", f"[{gw}]",
                    10, 10, "[64]", "[64]", 0, "backward", 1])
        gs.append(gw)
    lst = "; ".join(str(v) for v in ws + gs)
    ops.append([len(ops), "aten::_foreach_add_", f"[{lst}]", "[]", 5, 5,
                "[" + "; ".join(["64"] * (2 * forward)) + "]", "[]", 0, "optimizer", 0])
    for name, rows in (("tensor.csv", tens), ("trace.csv", ops)):
        with open(d / name, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return d


def test_tiny_csv_dp_and_pipeline_that_cannot_cut(tmp_path: Path):
    tr = load_trace([_tiny_csv(tmp_path / "one", 1)]).trace
    # one forward op: nothing to cut into two stages
    with pytest.raises(ScaleError, match="fewer than|cannot cut|no forward"):
        pipeline_parallel(tr, 2, micro_batches=1)
    # its one gradient (read by the optimizer, written by backward) is all-reduced: 64 elements x 4 B
    out = data_parallel(tr, 2)
    assert _allreduce_bytes(out.graphs[0]) == 64 * 4
    tr3 = load_trace([_tiny_csv(tmp_path / "three", 3)]).trace
    assert {_allreduce_bytes(g) for g in data_parallel(tr3, 2).graphs.values()} == {3 * 64 * 4}


def test_dp_without_gradients_is_an_error(tmp_path: Path):
    d = _tiny_csv(tmp_path / "inf", 2)
    # drop the backward and optimizer rows: an inference step
    rows = list(csv.reader(open(d / "trace.csv", newline="")))
    keep = [r for r in rows if r[9] in ("stage", "forward")]
    with open(d / "trace.csv", "w", newline="") as f:
        csv.writer(f).writerows(keep)
    tr = load_trace([d]).trace
    with pytest.raises(ScaleError, match="no gradient"):
        data_parallel(tr, 2)


def test_unused_group_is_an_error(trio):
    out = scale_trace(trio, dp=2)
    out.meta.add_group(ProcessGroup("tp", (0, 1), "tp", ""))
    with pytest.raises(ScaleError, match="'tp'.*no communication uses it"):
        _require_used_groups(set(), out)
