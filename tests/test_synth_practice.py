"""Plans as trained in practice (issue 12 item 4): pipeline scatter/gather over TP, gradient
reduction after backward vs overlapped, tied input/output embeddings, attention FLOPs as the
FlashAttention kernels compute them, and MFU on the model-FLOPs convention.

Every expected figure is computed here from the model's published dimensions with formulas
written independently of the synthesizer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ettools.converters.symbolic import synthesize
from ettools.graph import CollectiveType, NodeType

# gpt3-125m with a short sequence and few layers keeps graphs small
H, NH, V, F = 768, 12, 51200, 3072
S, L = 256, 4


def _names(res, g) -> np.ndarray:
    return np.asarray(res.trace.strings.decode(g.name), dtype=object)


def _group_members(res, g, row: int) -> tuple[int, ...]:
    name = res.trace.strings.decode(g.comm_group[row:row + 1])[0]
    return tuple(res.trace.meta.process_groups[name].ranks)


def _deps(g, i: int) -> set[int]:
    return set(g.dep_id[g.dep_ptr[i]:g.dep_ptr[i + 1]].astype(np.int64).tolist())


def _gpt(**kw):
    kw.setdefault("dims", {"L": L})
    return synthesize("gpt3-125m", seq=S, **kw)


# ---- (a) pipeline scatter/gather ------------------------------------------------------------------

@pytest.mark.parametrize("sg", [None, False])
def test_pipeline_scatter_gather_bytes_and_pairs(sg):
    tp, pp, dp, mb, batch = 2, 2, 2, 4, 8
    res = _gpt(tp=tp, pp=pp, dp=dp, micro_batch=mb, batch=batch, pp_scatter_gather=sg)
    on = sg is None  # default: on for tp > 1 and pp > 1 without SP
    assert res.trace.meta.extra["synth"]["plan"]["pp_scatter_gather"] is on
    full = (mb // dp) * S * H * 2  # one micro-batch's boundary activation on one rank, bf16
    want = full // tp if on else full
    M = batch // mb
    sends: dict[tuple[int, int, int], int] = {}
    recvs: dict[tuple[int, int, int], int] = {}
    for r in range(res.world_size):
        g = res.rank_graph(r)
        names = _names(res, g)
        p2p = np.flatnonzero((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE))
        assert len(p2p) == 2 * M  # one activation and one gradient per micro-batch per boundary side
        assert set(g.comm_bytes[p2p].tolist()) == {want}
        for i in p2p:
            d = sends if g.type[i] == NodeType.COMM_SEND_NODE else recvs
            key = (r, int(g.comm_peer[i]), int(g.comm_tag[i])) if d is sends else \
                (int(g.comm_peer[i]), r, int(g.comm_tag[i]))
            d[key] = int(g.comm_bytes[i])
        ag = np.flatnonzero([n.startswith("all_gather pp.") for n in names])
        assert len(ag) == (M if on else 0)  # each received tensor gathered once
        for i in ag:
            assert g.comm_type[i] == int(CollectiveType.ALL_GATHER)
            assert g.comm_bytes[i] == want  # Chakra all-gather size: the per-rank input
            members = _group_members(res, g, i)
            # the TP group: tp consecutive ranks (tp is the fastest mesh axis)
            assert members == tuple(range(r - r % tp, r - r % tp + tp))
            # it gathers what the receive got
            assert any(g.type[d] == NodeType.COMM_RECV_NODE for d in _deps(g, i))
    assert sends == recvs  # every send has its receive: same ranks, tag and bytes


def test_no_scatter_gather_under_sequence_parallelism():
    res = _gpt(tp=2, pp=2, sp=True, micro_batch=1, batch=2)
    assert res.trace.meta.extra["synth"]["plan"]["pp_scatter_gather"] is False
    g = res.rank_graph(0)
    assert not any(n.startswith("all_gather pp.") for n in _names(res, g))
    send = np.flatnonzero(g.type == NodeType.COMM_SEND_NODE)
    assert set(g.comm_bytes[send].tolist()) == {S // 2 * H * 2}  # the SP shard, already split
    with pytest.raises(ValueError, match="sequence parallelism"):
        _gpt(tp=2, pp=2, sp=True, pp_scatter_gather=True)


# ---- (b) gradient reduction after backward / overlapped ------------------------------------------

def _grad_colls(names) -> np.ndarray:
    return np.flatnonzero([n.endswith(".grads") or n.endswith("ddp.bucket") for n in names])


@pytest.mark.parametrize("bucket_mb", [None, 25.0])
def test_after_backward_collectives_depend_on_last_backward_node(bucket_mb):
    res = _gpt(dp=4, micro_batch=4, batch=8, dp_after_backward=True, bucket_mb=bucket_mb, ranks=[0])
    g = res.trace.graphs[0]
    names = _names(res, g)
    comp = np.flatnonzero((g.type == NodeType.COMP_NODE) & ~np.array([n.startswith("adam ") for n in names]))
    last_bwd = int(comp.max())  # the last op of the backward pass (optimizer excluded)
    assert ".bwd" in names[last_bwd] or "grad" in names[last_bwd]
    colls = _grad_colls(names)
    assert len(colls)
    for i in colls:
        assert last_bwd in _deps(g, i), names[i]


def test_overlapped_collectives_follow_their_own_gradients():
    res = _gpt(dp=4, micro_batch=4, batch=4, ranks=[0])
    g = res.trace.graphs[0]
    names = _names(res, g)
    first_emb_bwd = min(i for i, n in enumerate(names) if n.startswith("embedding.bwd"))
    head = [i for i in _grad_colls(names) if names[i] == "all_reduce gpt_head.grads"]
    assert head
    for i in head:  # issued while the earlier layers still run their backward
        assert max(_deps(g, i)) < first_emb_bwd
    # the optimizer waits for every gradient reduction (finish_grad_sync before optimizer.step)
    red = set(_grad_colls(names).tolist())
    for i, n in enumerate(names):
        if n.startswith("adam "):
            assert red <= _deps(g, i)


def test_after_backward_exposes_the_reduction_in_replay():
    from ettools.replay import replay_trace

    steps = {}
    for after in (False, True):
        res = _gpt(dp=4, micro_batch=4, batch=8, dp_after_backward=after, ranks=list(range(4)))
        r = replay_trace(res.trace, system="A100", timing="roofline", symmetric=True)
        steps[after] = (r.ranks[0].step_time_us, r.ranks[0].exposed_comm_us, r.ranks[0].comm_us)
    assert steps[True][0] > steps[False][0]
    # after backward nothing hides the reduction: exposed = its whole time (one NCCL stream)
    assert steps[True][1] == pytest.approx(steps[True][2], rel=0.02)
    assert steps[False][1] < steps[True][1]  # overlapped: the layers' buckets hide behind backward


# ---- (c) tied embeddings ---------------------------------------------------------------------------

def _grad_allreduce_bytes(res, r: int) -> int:
    g = res.rank_graph(r)
    names = _names(res, g)
    sel = [i for i in _grad_colls(names) if g.comm_type[i] == int(CollectiveType.ALL_REDUCE)]
    return int(g.comm_bytes[sel].sum())


def test_tied_embedding_counted_once_and_gradient_summed():
    kw = dict(dp=2, micro_batch=2, batch=2, ranks=[0])
    tied, untied = _gpt(**kw), _gpt(tie_embeddings=False, **kw)
    assert tied.trace.meta.extra["synth"]["plan"]["tied_embeddings"] is True
    # resident: weight (bf16) + gradient (bf16) + fp32 master and two Adam moments (12 B) per element
    assert untied.stages[0].resident_bytes - tied.stages[0].resident_bytes == V * H * (2 + 2 + 12)
    # one gradient reduced over dp instead of two
    assert _grad_allreduce_bytes(untied, 0) - _grad_allreduce_bytes(tied, 0) == V * H * 2
    g = tied.trace.graphs[0]
    names = _names(tied, g)
    emb = [i for i, n in enumerate(names) if n == "all_reduce gpt_embedding.grads"]
    assert len(emb) == 1
    # the reduction of the tied weight waits for both uses: the LM head's weight gradient too
    assert any(names[d] == "matmul.wgrad gpt_head.logits" for d in _deps(g, emb[0]))
    assert not any("embedding_grads" in n for n in names)  # one stage: no embedding group


def test_llama_is_untied():
    res = synthesize("llama3-8b", dims={"L": 2}, seq=256, ranks=[0])
    assert res.trace.meta.extra["synth"]["plan"]["tied_embeddings"] is False
    with pytest.raises(ValueError, match="no tied parameters"):
        synthesize("llama3-8b", dims={"L": 2}, seq=256, tie_embeddings=True)


def test_embedding_group_allreduce_across_pipeline_ends():
    tp, pp, dp = 2, 3, 2
    res = _gpt(dims={"L": 6}, tp=tp, pp=pp, dp=dp, micro_batch=2, batch=4)
    stride = tp * dp  # ranks per pipeline stage
    for r in range(res.world_size):
        g = res.rank_graph(r)
        names = _names(res, g)
        rows = [i for i, n in enumerate(names) if n.endswith(".embedding_grads")]
        stage = r // stride
        if stage in (0, pp - 1):
            assert len(rows) == 1  # once per iteration, after the data-parallel reduction
            i = rows[0]
            assert g.comm_type[i] == int(CollectiveType.ALL_REDUCE)
            assert g.comm_bytes[i] == V // tp * H * 2  # the vocab-parallel shard's gradient, bf16
            assert _group_members(res, g, i) == (r % stride, r % stride + (pp - 1) * stride)
            dp_red = [d for d in _deps(g, i) if names[d].endswith(".grads")]
            assert dp_red, "after the data-parallel reduction"
            # the optimizer waits for it
            assert any(i in _deps(g, j) for j, n in enumerate(names) if n.startswith("adam "))
        else:
            assert not rows


# ---- (d) attention FLOPs as the kernels compute them ------------------------------------------------

def _flash_causal_flops(b: int, sq: int, sk: int, hd_total: int, tile: int = 128) -> int:
    """Forward FLOPs of a tiled causal attention (QK^T and PV: 2 GEMMs of 2 FLOPs per MAC): every
    query tile of 128 rows computes the whole 128-key blocks up to its last row's last visible key
    (bottom-right aligned), written as an explicit loop over tiles."""
    work = 0
    for q0 in range(0, sq, tile):
        rows = min(tile, sq - q0)
        last_key = (q0 + rows - 1) + (sk - sq)  # index of the last key the tile's last row sees
        blocks = last_key // tile + 1
        work += rows * min(blocks * tile, sk)
    return 4 * b * hd_total * work


@pytest.mark.parametrize("seq", [256, 1000, 2048])
def test_attention_flops_at_tile_granularity(seq):
    res = synthesize("gpt3-125m", dims={"L": 1}, seq=seq, ranks=[0])
    g = res.trace.graphs[0]
    names = _names(res, g)
    fwd = [i for i, n in enumerate(names) if n == "attention gpt_block.o"]
    bwd = [i for i, n in enumerate(names) if n == "attention.bwd gpt_block.o"]
    assert len(fwd) == len(bwd) == 1
    want = _flash_causal_flops(1, seq, seq, H)
    assert g.num_ops[fwd[0]] == want
    assert want > 4 * seq * H * seq / 2  # more than the exact half: whole diagonal tiles
    # backward: 5 GEMMs (S and P recomputed, dV, dP, dQ, dK) against the forward's 2
    assert g.num_ops[bwd[0]] == pytest.approx(2.5 * want, abs=1)


def test_fitted_attention_model_reads_synthesized_shapes():
    from ettools.replay.compute import load_hardware, node_features
    from ettools.replay.opmodel import graph_cols
    from ettools.replay.opsamples import ATTENTION

    res = synthesize("gpt3-125m", dims={"L": 1}, seq=2048, ranks=[0])
    g = res.trace.graphs[0]
    rows, cols = graph_cols(g, *node_features(g), load_hardware("A100"))
    att = np.flatnonzero(cols["cls"] == ATTENTION)
    assert len(att) == 2
    assert (cols["m"][att] == 2048).all() and (cols["causal"][att] == 1).all()  # shaped, causal
    # restated in the fit's convention (the exact half: 2048/2 keys per query)
    half = 4 * 2048 * H * 1024
    assert sorted(cols["flops"][att].tolist()) == pytest.approx([half, 2.5 * half])


# ---- MFU on model FLOPs ------------------------------------------------------------------------------

def test_model_flops_and_mfu_convention():
    from ettools.replay import replay_trace

    dp, mb, batch = 2, 4, 8
    res = _gpt(dp=dp, micro_batch=mb, batch=batch, ranks=[0, 1])
    tokens = batch // dp * S  # tokens per rank per iteration
    matmul_params = L * (3 * H * H + H * H + 2 * H * F) + H * V  # QKV, out, FFN, LM head
    attention_fwd = L * 4 * H * S * (S / 2) * (batch // dp)  # exact causal half
    want = 3 * (2 * matmul_params * tokens + attention_fwd)
    g = res.trace.graphs[0]
    assert g.meta["model_flops"] == pytest.approx(want, rel=1e-9)
    r = replay_trace(res.trace, system="A100", timing="roofline", symmetric=True)
    rr = r.ranks[0]
    assert rr.mfu_flops == "model"
    from ettools.replay.compute import peak_flops

    assert rr.mfu == pytest.approx(want / (rr.span_us * 1e-6 * peak_flops(r.hardware)), rel=1e-9)
    # the node FLOPs (hardware: elementwise ops, 2.5x attention backward, tiles) are more
    assert rr.flops > want
    assert "MFU counts model FLOPs" in r.summary_text()
    assert math.isfinite(rr.mfu) and 0 < rr.mfu < 1
    # the hardware FLOPs utilization counts those node FLOPs over the same span
    assert rr.hfu == pytest.approx(rr.flops / (rr.span_us * 1e-6 * peak_flops(r.hardware)), rel=1e-9)
    assert "HFU counts" in r.summary_text()


def test_hfu_counts_the_recomputed_forward():
    """With activation recomputation the step does one more forward: the model FLOPs (what the
    MFU counts) stay, the node FLOPs (what the HFU counts) grow by the forward's matmuls — a quarter
    or more of the 3-pass work, as Megatron-LM's 96·B·s·l·h² (vs 72) convention counts them."""
    from ettools.replay import replay_trace

    plain = _gpt(dp=2, micro_batch=4, batch=8, ranks=[0, 1])
    rc = _gpt(dp=2, micro_batch=4, batch=8, ranks=[0, 1], recompute=True)
    assert rc.trace.graphs[0].meta["model_flops"] == plain.trace.graphs[0].meta["model_flops"]
    a = replay_trace(plain.trace, system="A100", timing="roofline", symmetric=True).ranks[0]
    b = replay_trace(rc.trace, system="A100", timing="roofline", symmetric=True).ranks[0]
    assert b.flops / a.flops == pytest.approx(4 / 3, rel=0.08)
    assert b.hfu / b.mfu > a.hfu / a.mfu


def test_model_flops_survive_the_chakra_round_trip(tmp_path):
    """Written to Chakra and read back, a synthesized rank keeps its model FLOPs (GlobalMetadata
    ``ettools_model_flops``, read here from the raw first frame), so the replay of the files reports
    the same model-FLOPs MFU as the in-memory replay."""
    from ettools.converters.chakra import read_chakra, write_chakra
    from ettools.replay import replay_trace
    from ettools.schema import et_def_pb2 as pb

    res = _gpt(dp=2, micro_batch=4, batch=8, ranks=[0, 1])
    write_chakra(res.trace, tmp_path)
    f = sorted(tmp_path.glob("*.0.et"))[0]
    data = f.read_bytes()
    n, i = 0, 0
    while True:  # varint length of the first frame
        b = data[i]
        n |= (b & 0x7F) << (7 * i)
        i += 1
        if b < 0x80:
            break
    gm = pb.GlobalMetadata()
    gm.ParseFromString(data[i:i + n])
    attrs = {a.name: a.double_val for a in gm.attr if a.name == "ettools_model_flops"}
    assert attrs["ettools_model_flops"] == pytest.approx(res.trace.graphs[0].meta["model_flops"], rel=1e-12)
    back = read_chakra(tmp_path)
    a = replay_trace(res.trace, system="A100", timing="roofline", symmetric=True).ranks[0]
    b = replay_trace(back, system="A100", timing="roofline", symmetric=True).ranks[0]
    assert b.mfu_flops == "model" and b.mfu == pytest.approx(a.mfu, rel=1e-6)
