"""Rewriting the single-process capture into the plans that were also captured, and comparing.

The reference numbers come from the real 2-rank captures in ``sample_traces/`` read here with
plain ``json``/``gzip`` (matmuls: ``aten::mm`` nodes — a trace records one matmul as
``aten::linear ⊃ aten::matmul ⊃ aten::mm`` in forward and as ``aten::mm`` under ``MmBackward0`` in
backward, so the innermost ``aten::mm`` counts each once; communication: the ``c10d::`` calls,
bytes with Chakra's ``comm_size`` meaning from their input shapes; send/recv tags from their
arguments). The rewritten trace is read through its columns; the validator
(:func:`ettools.validate.validate`) compares the same traces with zero tolerance on communication.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from capture_reading import FLOAT, captured

from ettools.checks import verify
from ettools.formats import load_trace
from ettools.graph import CollectiveType, NodeType
from ettools.replayable import replayable_trace as replayable
from ettools.scaler import (
    data_parallel,
    expert_parallel,
    pipeline_parallel,
    rescale,
    tensor_parallel,
)
from ettools.validate import validate


def rewritten(g) -> tuple[int, dict[str, list[int]], list[tuple[str, int]]]:
    """The same figures for one rank of a rewritten trace, from its columns."""
    names = np.array(g.names(), object)
    mm = int((names == "aten::mm").sum())
    comm: dict[str, list[int]] = {}
    tags = []
    for r in np.flatnonzero(g.type != NodeType.COMP_NODE).tolist():
        t = int(g.type[r])
        kind = ("SEND" if t == NodeType.COMM_SEND_NODE else "RECV" if t == NodeType.COMM_RECV_NODE
                else CollectiveType(int(g.comm_type[r])).name)
        c = comm.setdefault(kind, [0, 0])
        c[0] += 1
        c[1] += int(g.comm_bytes[r])
        if kind in ("SEND", "RECV"):
            tags.append((kind, int(g.comm_tag[r])))
    return mm, comm, tags


@pytest.fixture(scope="module")
def single(sample_traces: Path):
    return load_trace([sample_traces / "single"]).trace


def _compare(sample_traces: Path, scenario: str, out) -> None:
    manifest = json.loads((sample_traces / "manifest.json").read_text())
    sc = manifest["scenarios"][scenario]
    assert out.meta.world_size == sc["world_size"] == len(out.graphs)
    assert verify(out) == [], "structural proof"
    for rank, files in sc["files"].items():
        mm, comm, tags = captured(sample_traces / files["et"])
        got_mm, got_comm, got_tags = rewritten(out.graphs[int(rank)])
        assert got_mm == mm, f"rank {rank}: matmuls"
        assert got_comm == comm, f"rank {rank}: communication count and bytes"
        assert sorted(got_tags) == sorted(tags), f"rank {rank}: send/recv tags"
    # the validator sees the same: no error on communication, GEMM counts equal per rank
    ref = load_trace([sample_traces / scenario]).trace
    res = validate(ref, out, measures=["op_counts", "comm_counts", "comm_bytes"])
    assert res.exceeds(0.0, ["comm_counts", "comm_bytes"]) == []
    ops = res.tables["op_counts"]
    for col in ops.rank_columns:
        cell = ops.cells[col]["GeMM"]
        assert cell.reference == cell.candidate, f"GeMM ops on {col}"


def test_ddp_from_single(sample_traces: Path, single):
    # one bucket: the capture's bucket_cap_mb=100 holds every gradient
    out = data_parallel(single, 2, bucket_mb=100)
    _compare(sample_traces, "ddp", out)
    # DDP's default 25 MB buckets hold the 436,736 B of this model in one bucket as well
    assert rewritten(data_parallel(single, 2).graphs[1])[1] == {"ALL_REDUCE": [1, 436736]}


def test_tp_sp_from_single(sample_traces: Path, single):
    _compare(sample_traces, "tp_sp", tensor_parallel(single, 2, sp=True))


def test_tp_without_sp_is_megatron_allreduce(single):
    out = tensor_parallel(single, 2, sp=False)
    _, comm, _ = rewritten(out.graphs[0])
    # per layer: after each row layer (2) and each column layer's input gradient (2)
    assert comm == {"ALL_REDUCE": [8, 8 * 32 * 8 * 64 * FLOAT]}
    assert verify(out) == []


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pp_from_single(sample_traces: Path, single, schedule: str):
    out = pipeline_parallel(single, 2, schedule=schedule, micro_batches=4)
    _compare(sample_traces, f"pp_{schedule}", out)
    assert out.graphs[0].meta["scaler_pp"]["layers"][0]["per_stage"] == [1, 1]


def test_pp_send_order_follows_the_schedule(single):
    def order(g):
        # a send issued as F_m ends and a recv used as B_k starts can share the instant: sends first
        rows = np.flatnonzero(g.comm_peer >= 0)
        rows = rows[np.lexsort((g.id[rows], g.type[rows], np.round(g.start[rows], 3)))]
        return ["F" if g.type[r] == NodeType.COMM_SEND_NODE else "B" for r in rows.tolist()]

    # stage 0 sends activations (F) and receives gradients (B) in schedule order
    g1 = pipeline_parallel(single, 2, schedule="1f1b", micro_batches=4).graphs[0]
    gp = pipeline_parallel(single, 2, schedule="gpipe", micro_batches=4).graphs[0]
    assert order(gp) == ["F"] * 4 + ["B"] * 4
    assert order(g1)[:2] == ["F", "F"] and order(g1)[-2:] == ["B", "B"] and order(g1) != order(gp)


def test_ep_from_moe_single(sample_traces: Path):
    moe = load_trace([sample_traces / "moe_single"]).trace
    _compare(sample_traces, "moe_ep", expert_parallel(moe, 2, bucket_mb=100))


UPDATE_OPS = ("aten::addcdiv_", "aten::lerp_", "aten::addcmul_", "aten::sqrt")


def _update_ops(g) -> dict[str, int]:
    names = Counter(g.names())
    return {k: names[k] for k in UPDATE_OPS}


@pytest.mark.parametrize("scenario", ["moe_ep", "pp_gpipe", "pp_1f1b"])
def test_sharded_optimizer_runs_the_captured_updates(sample_traces: Path, single, scenario: str):
    """Each rank of a rewrite that drops parameters (EP: the other rank's experts; PP: the other
    stage's layers) runs the AdamW per-parameter updates the real capture of that plan runs: the
    allocator's reuse of freed temporaries must not tie other parameters' updates to a dropped one."""
    if scenario == "moe_ep":
        out = expert_parallel(load_trace([sample_traces / "moe_single"]).trace, 2, bucket_mb=100)
    else:
        out = pipeline_parallel(single, 2, schedule=scenario[3:], micro_batches=4)
    ref = load_trace([sample_traces / scenario]).trace
    for rank in ref.ranks:
        want = _update_ops(ref.graphs[rank])
        assert want["aten::addcdiv_"] > 0
        assert _update_ops(out.graphs[rank]) == want, f"rank {rank}"


def test_rescale_batch_matches_the_batch16_capture(sample_traces: Path, single):
    out = rescale(single, batch=16)
    assert verify(out) == []
    ref = load_trace([sample_traces / "single_b16"]).trace.graphs[0]
    g = out.graphs[0]

    def signatures(gr):
        t = gr.tensors
        c = Counter()
        for r in range(len(gr)):
            ins = gr.inputs_of(r)
            if len(ins):
                c[(gr.name_of(r), tuple(t.shape(int(x)) for x in ins))] += 1
        return c

    mine, theirs = signatures(g), signatures(ref)
    # every op of the rewrite has the capture's input shapes; the capture runs 2 more fill_
    # (sdpa backward zeroing its scratch at this size), which no rewrite of batch 8 can know of
    assert mine - theirs == Counter()
    assert {k[0] for k in (theirs - mine)} == {"aten::fill_"} and sum((theirs - mine).values()) == 2
    # tensor bytes per op class match; matmul counts and shapes match
    mm = [k for k in mine if k[0] == "aten::mm"]
    assert sum(mine[k] for k in mm) == sum(theirs[k] for k in theirs if k[0] == "aten::mm") == 27
    res = validate(load_trace([sample_traces / "single_b16"]).trace, out, measures=["op_counts"])
    assert res.tables["op_counts"].cells["total"]["GeMM"].error_pct == 0
    assert res.exceeds(1.0, ["op_counts"]) == []
    # the IOInfo strings follow the tensor table
    col = g.attrs["inputs"]
    row = int(np.flatnonzero(np.array(g.names()) == "aten::embedding")[0])
    assert "[32, 16]" in col.get(row)[1]


def test_rescaled_pp_stage_is_replayable(single):
    out = replayable(pipeline_parallel(single, 2, micro_batches=4))
    assert verify(out) == []
    assert all(not (g.dep_kind == 3).any() for g in out)


def _kineto_time(path: Path, names: set[str]) -> float:
    """Total duration (µs) of the CPU ops named ``names`` in a Kineto file, read with plain json."""
    import gzip

    events = json.loads(gzip.open(path).read())["traceEvents"]
    return sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("name") in names)


def test_ddp_reducer_host_work_is_the_captured_reducer_time(sample_traces: Path, single):
    from ettools.replay import replay_trace

    reducer = {"torch::distributed::reducer::mul_out", "torch.distributed.ddp.reducer::copy_bucket_to_grad"}
    real = _kineto_time(sample_traces / "ddp" / "rank0.kineto.json.gz", reducer)
    assert real > 1000.0  # 21 gradients: about 1.8 ms on this CPU
    plain = data_parallel(single, 2, bucket_mb=100, host_work=False)
    with_work = data_parallel(single, 2, bucket_mb=100)
    assert verify(with_work) == []
    assert rewritten(with_work.graphs[0]) == rewritten(plain.graphs[0])  # same ops and communication
    added = replay_trace(with_work).step_time_us - replay_trace(plain).step_time_us
    # timed by the single capture's own aten::mul / aten::to / aten::copy_: within 25 % of DDP's
    assert abs(added - real) / real < 0.25, (added, real)
    # the host layout grows by the same amount (the step annotation spans the longer thread)
    (_, s0, e0), = plain.graphs[0].meta["steps"]
    (_, s1, e1), = with_work.graphs[0].meta["steps"]
    assert (e1 - s1) - (e0 - s0) == pytest.approx(added, rel=0.05)


def test_repack_moves_childless_annotations_with_their_thread(single):
    from ettools.scaler.model import analyze
    from ettools.scaler.timeline import repack

    g = single.graphs[0]
    m = analyze(g)
    start, dur = repack(m, np.full(len(g), 2.0))
    names = np.array(g.names(), object)
    step = int(np.flatnonzero(names == "ProfilerStep#6")[0])
    zero = int(np.flatnonzero(names == "Optimizer.zero_grad#AdamW.zero_grad")[0])
    assert np.isnan(g.dur[m.parent == zero]).all() or not (m.parent == zero).any()  # no timed children
    # every unit doubles and keeps its idle gap: what ran before the annotation took twice as long,
    # so the annotation moves by that much
    before = m.units[g.start[m.units] + np.nan_to_num(g.dur[m.units]) <= g.start[zero]]
    assert len(before) > 0
    shift = start[zero] - g.start[zero]
    assert shift == pytest.approx(np.nan_to_num(g.dur[before]).sum(), rel=1e-6)
    assert start[step] <= start[zero] <= start[step] + dur[step]
