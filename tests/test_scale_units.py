"""The rewriter's pieces on their own: schedules, stage balancing, resharding rules, composition, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ettools.checks import StructuralError, verify
from ettools.formats import load_trace
from ettools.graph import (
    CollectiveType,
    EdgeKind,
    GraphBuilder,
    NodeType,
    ProcessGroup,
    Trace,
    TraceMeta,
    new_trace,
)
from ettools.scaler import (
    PassError,
    ScaleError,
    data_parallel,
    pipeline_parallel,
    prove,
    rescale,
    reshard,
    scale_trace,
    strip_data_parallel,
    tensor_parallel,
)
from ettools.scaler.dims import infer_dims, label_dims
from ettools.scaler.model import BWD, FWD, OPT, PRE, analyze
from ettools.scaler.pp import assign_stages, schedule_order


@pytest.fixture(scope="module")
def single(sample_traces: Path):
    return load_trace([sample_traces / "single"]).trace


# ---- schedules and stages ---------------------------------------------------------------------

def test_1f1b_schedule():
    # 4 stages, 8 micro-batches: stage p warms up with pp - p - 1 forwards, then alternates
    for p in range(4):
        order = schedule_order("1f1b", 4, p, 8)
        assert sorted(order) == sorted([("F", i) for i in range(8)] + [("B", i) for i in range(8)])
        warm = 4 - p - 1
        assert order[:warm + 1] == [("F", i) for i in range(warm + 1)]
        # never more than pp - p forwards in flight
        inflight = 0
        for kind, _ in order:
            inflight += 1 if kind == "F" else -1
            assert 0 <= inflight <= 4 - p
    assert schedule_order("gpipe", 2, 1, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_order("zb", 2, 0, 2)


def test_stage_balance():
    assert assign_stages([1, 1, 1, 1], 2) == [2, 2]
    # the head goes with the last stage, the embedding with the first
    assert assign_stages([1, 1, 1, 1], 2, head=0.0, tail=2.0) == [3, 1]
    assert assign_stages([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert assign_stages([1, 2, 3], 3, stages=[1, 1, 1]) == [1, 1, 1]
    with pytest.raises(ScaleError, match="fewer than"):
        assign_stages([1], 2)
    with pytest.raises(ScaleError, match="must give"):
        assign_stages([1, 1], 2, stages=[2, 1])


def test_user_stage_list(single):
    out = pipeline_parallel(single, 2, micro_batches=2, stages=[2, 0])
    # both layers on stage 0: stage 1 keeps only the head, its matmuls are the head's (3 per micro-batch)
    names1 = np.array(out.graphs[1].names())
    assert int((names1 == "aten::mm").sum()) == 3 * 2
    assert verify(out) == []


# ---- analysis ---------------------------------------------------------------------------------

def test_step_model_of_the_sample(single):
    g = single.graphs[0]
    m = analyze(g)
    phases = {p: m.units[m.phase[m.units] == p] for p in (PRE, FWD, BWD, OPT)}
    names = np.array(g.names(), object)
    assert set(names[phases[PRE]]) >= {"aten::randint"}
    assert (names[phases[FWD]] == "aten::linear").sum() == 9
    assert (names[phases[OPT]] == "aten::addcdiv_").sum() == 21  # AdamW, one per parameter
    # every backward unit knows its forward unit; EmbeddingBackward goes to the token embedding
    bw = phases[BWD]
    assert (m.fwd_of[bw] >= 0).all()
    emb_b = [u for u in bw.tolist() if names[u].endswith("EmbeddingBackward0")]
    assert {names[m.fwd_of[u]] for u in emb_b} == {"aten::embedding"}
    assert len(m.param_storage) == 21


def test_dimension_inference_and_labels(single):
    m = analyze(single.graphs[0])
    assert infer_dims(m) == {"batch": 8, "seq": 32}
    lab = label_dims(m, "batch", 8)
    t = single.graphs[0].tensors
    # the flattened token dimension of an mm input carries the batch, the vocabulary does not
    g = single.graphs[0]
    names = g.names()
    head_fwd = [r for r, s in enumerate(names) if s == "aten::mm" and t.shape(int(g.inputs_of(r)[1])) == (64, 256)]
    assert head_fwd
    a, w = (int(x) for x in g.inputs_of(head_fwd[0]))
    assert lab.of(a).tolist() == [True, False] and not lab.of(w).any()


def test_rescale_seq_and_errors(single):
    out = rescale(single, seq=64)
    g = out.graphs[0]
    names = g.names()
    sd = [r for r, s in enumerate(names) if s == "aten::scaled_dot_product_attention"][0]
    assert g.tensors.shape(int(g.inputs_of(sd)[0])) == (8, 4, 64, 16)
    assert verify(out) == []
    # attention FLOPs are quadratic in the sequence, GEMM FLOPs linear: the step's compute more than doubles
    flops_before = _flops(single.graphs[0])
    flops_after = _flops(g)
    assert flops_after["attention"] == pytest.approx(4 * flops_before["attention"])
    assert flops_after["gemm"] == pytest.approx(2 * flops_before["gemm"])
    with pytest.raises(ScaleError, match="does not split into 3 micro-batches"):
        pipeline_parallel(single, 2, micro_batches=3)
    with pytest.raises(ScaleError, match="current size"):
        rescale(single, dims={"hidden": 128})


def _flops(g) -> dict[str, float]:
    from ettools.scaler.rescale import op_cost

    out = {"attention": 0.0, "gemm": 0.0}
    t = g.tensors
    for r, s in enumerate(g.names()):
        ins = [t.shape(int(x)) for x in g.inputs_of(r)]
        outs = [t.shape(int(x)) for x in g.outputs_of(r)]
        if s == "aten::_scaled_dot_product_flash_attention_for_cpu":
            out["attention"] += op_cost(s, ins, outs)[0]
        elif s == "aten::mm":
            out["gemm"] += op_cost(s, ins, outs)[0]
    return out


def test_rescale_named_dim_by_value(single):
    out = rescale(single, dims={"hidden": (64, 128)})
    g = out.graphs[0]
    lin = [r for r, s in enumerate(g.names()) if s == "aten::linear"][0]
    shapes = [g.tensors.shape(int(x)) for x in g.inputs_of(lin)]
    assert shapes[0][-1] == 128 and 128 in shapes[1]


# ---- reshard ----------------------------------------------------------------------------------

def _dp_capture(ctype: CollectiveType, nbytes: int, world: int = 2) -> Trace:
    trace, strings = new_trace("test", world)
    trace.meta.add_group(ProcessGroup("0", tuple(range(world))))
    for r in range(world):
        b = GraphBuilder(r, strings)
        a = b.add_node("work", start=0.0, dur=1.0, is_cpu_op=0)
        c = b.add_node("coll", NodeType.COMM_COLL_NODE, start=1.0, dur=1.0, is_cpu_op=0,
                       comm_type=int(ctype), comm_bytes=nbytes, comm_group="0")
        b.add_dep(b.last_row, a, EdgeKind.DATA)
        del c
        trace.graphs[r] = b.build()
    return trace


def test_reshard_bytes_by_collective():
    ag = reshard(_dp_capture(CollectiveType.ALL_GATHER, 4096), 8)
    assert ag.meta.world_size == 8 and list(ag.meta.process_groups["0"].ranks) == list(range(8))
    assert int(ag.graphs[7].comm_bytes[1]) == 4096 * 2 // 8  # the gathered result is fixed
    ar = reshard(_dp_capture(CollectiveType.ALL_REDUCE, 4096), 8)
    assert int(ar.graphs[5].comm_bytes[1]) == 4096
    rs = reshard(_dp_capture(CollectiveType.REDUCE_SCATTER, 4096), 8)
    assert int(rs.graphs[5].comm_bytes[1]) == 4096


def test_reshard_dp_axis(single):
    dp2 = data_parallel(single, 2)
    big = reshard(dp2, 1024)
    assert big.meta.world_size == 1024 and verify(big) == []
    assert list(big.meta.process_groups["dp"].ranks) == list(range(1024))
    with pytest.raises(ScaleError, match="re-run"):
        reshard(tensor_parallel(single, 2), 4)


def test_reshard_refuses_a_non_dp_trace(sample_traces: Path):
    pp = load_trace([sample_traces / "pp_1f1b"]).trace
    with pytest.raises(ScaleError, match="send/recv"):
        reshard(pp, 4)


# ---- composition ------------------------------------------------------------------------------

def test_scale_trace_composes_every_axis(single):
    out = scale_trace(single, tp=2, sp=True, pp=2, micro_batches=4, dp=2, bucket_mb=100)
    assert out.meta.world_size == 8
    assert [a for a, _ in out.meta.extra["scaler"]["axes"]] == ["tp", "pp", "dp"]
    # rank = (d*pp + p)*tp + t: ranks 0,1 are the TP pair of stage 0; 2,3 stage 1
    g0, g2 = out.graphs[0], out.graphs[2]
    assert g0.meta["scaler_pp"]["stage"] == 0 and g2.meta["scaler_pp"]["stage"] == 1
    assert out.meta.process_groups["tp"].ranks == (0, 1)
    assert out.meta.process_groups["dp0"].ranks == (0, 4)
    assert verify(out) == []


def test_scale_trace_world_and_dp_capture(sample_traces: Path, single):
    assert scale_trace(single, world=16, tp=2).meta.world_size == 16
    ddp = load_trace([sample_traces / "ddp"]).trace
    resized = scale_trace(ddp, world=64)
    assert resized.meta.world_size == 64 and verify(resized) == []
    stripped = strip_data_parallel(ddp)
    assert stripped.meta.world_size == 1
    assert not (stripped.graphs[0].type == NodeType.COMM_COLL_NODE).any()
    replanned = scale_trace(ddp, tp=2, sp=True)  # keeps the capture's 2 data-parallel replicas
    assert replanned.meta.world_size == 4 and verify(replanned) == []
    assert scale_trace(single) is single


# ---- errors -----------------------------------------------------------------------------------

def test_pass_error_names_the_node():
    trace, strings = new_trace("t", 1)
    b = GraphBuilder(0, strings)
    a = b.add_node("a")
    b.add_dep(0, 999, EdgeKind.DATA)
    del a
    trace.graphs[0] = b.build()
    trace.meta = TraceMeta(world_size=1)
    with pytest.raises(PassError, match=r"^rescale: rank 0 node 0 \(a\): depends on node id 999") as e:
        prove(trace, "rescale")
    assert isinstance(e.value, StructuralError)


def test_tp_needs_tensors_and_sp_needs_a_residual(shared_traces: Path, single):
    hta = load_trace([shared_traces / "kineto" / "hta_fwdbwd_1rank"]).trace
    with pytest.raises(ScaleError, match="tensor sizes"):
        tensor_parallel(hta, 2)
    vgg = load_trace([shared_traces / "et_kineto" / "triosim_vgg13_h100"]).trace
    with pytest.raises(ScaleError, match="residual"):
        tensor_parallel(vgg, 2, sp=True)
    with pytest.raises(ScaleError, match="needs tensor parallelism"):
        scale_trace(single, sp=True)


def test_rescale_a_pipeline_capture_keeps_pairs_matched(sample_traces: Path):
    pp = load_trace([sample_traces / "pp_1f1b"]).trace
    before = {r: int(g.comm_bytes[g.comm_peer >= 0].sum()) for r, g in pp.graphs.items()}
    out = rescale(pp, batch=4)  # its micro-batches of 2 become 4: received activations too
    assert verify(out) == []
    assert {r: int(g.comm_bytes[g.comm_peer >= 0].sum()) for r, g in out.graphs.items()} == \
        {r: 2 * b for r, b in before.items()}


def test_pp_needs_tensor_sizes(shared_traces: Path):
    hta = load_trace([shared_traces / "kineto" / "hta_fwdbwd_1rank"]).trace
    with pytest.raises(ScaleError, match="tensor sizes"):
        pipeline_parallel(hta, 2)
