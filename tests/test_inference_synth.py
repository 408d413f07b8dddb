"""Inference steps of the synthesizer (issue 17): KV cache bytes, decode memory-bound, STAGE's
DeepSeek-R1 EP ordering.

Expected figures are computed here from the models' published dimensions (Llama 3 herd paper
Table 3; DeepSeek-V2 config) and the H100 data sheet, not from the synthesizer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.converters.symbolic import synthesize
from ettools.graph import NodeType
from ettools.replay.api import replay_trace
from ettools.replay.serve import roofline_breakdown

H100_HBM = 3.35e12  # B/s, data sheet


def _synth_json(tmp_path, *args):
    res = CliRunner().invoke(main, ["synth", *args, "-o", str(tmp_path / "out"), "--json", "--ranks", "0"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_kv_cache_bytes_gqa_and_mla(tmp_path):
    """Llama-3-8B decode TP 2: batch × context × layers × (KV heads / tp) × head dim × 2 × 2 B;
    DeepSeek-V2-Lite (MLA): the 512-dim latent + 64-dim RoPE key per layer, not split by tp."""
    d = _synth_json(tmp_path, "--model", "llama3-8b", "--phase", "decode", "--context", "1000", "--batch", "4",
                    "--tp", "2")
    assert d["plan"]["phase"] == "decode"
    assert d["ranks"]["0"]["kv_cache_bytes"] == 4 * 1000 * 32 * (8 // 2) * 128 * 2 * 2
    d = _synth_json(tmp_path, "--model", "deepseek-v2-lite", "--phase", "prefill", "--context", "512",
                    "--batch", "2", "--tp", "2")
    assert d["ranks"]["0"]["kv_cache_bytes"] == 2 * 512 * 27 * (512 + 64) * 2
    # training keeps no cache and its default is unchanged
    d = _synth_json(tmp_path, "--model", "llama3-8b", "--dim", "L=2", "--seq", "256")
    assert d["ranks"]["0"]["kv_cache_bytes"] == 0


def test_prefill_has_no_backward_and_decode_reads_the_cache():
    """Prefill: no backward ops; its causal attention costs what the training forward's does.
    Decode: each attention node reads the layer's whole KV cache."""
    r = synthesize("llama3-8b", {"L": 2}, phase="prefill", batch=2, context=1024, ranks=[0])
    t = synthesize("llama3-8b", {"L": 2}, seq=1024, batch=2, micro_batch=2, ranks=[0])
    gp, gt = r.rank_graph(0), t.rank_graph(0)
    names = [r.trace.strings[i] for i in gp.name]
    assert not any(".bwd" in n or "grad" in n or "adam" in n for n in names)
    att_p = [gp.num_ops[i] for i, n in enumerate(names) if n.startswith("attention ")]
    tn = [t.trace.strings[i] for i in gt.name]
    att_t = [gt.num_ops[i] for i, n in enumerate(tn) if n.startswith("attention ") and ".bwd" not in n]
    assert att_p == att_t[: len(att_p)] and len(att_p) == 2
    d = synthesize("llama3-8b", {"L": 2}, phase="decode", batch=8, context=3000, ranks=[0])
    g = d.rank_graph(0)
    nm = [d.trace.strings[i] for i in g.name]
    layer_kv = 8 * 3000 * 8 * 128 * 2 * 2
    for i, n in enumerate(nm):
        if n.startswith("attention "):
            assert layer_kv <= g.tensor_size[i] < 1.01 * layer_kv


def _llama70b_weights() -> int:
    L, H, NH, KV, HD, F, V = 80, 8192, 64, 8, 128, 28672, 128256
    per_layer = H * (NH + 2 * KV) * HD + NH * HD * H + 3 * H * F + 2 * H
    return (V * H + L * per_layer + H + H * V) * 2


def test_llama70b_decode_is_memory_bound_at_hbm_speed():
    """Decode, batch 64, context 4,096, H100 TP 8: the roofline breakdown is memory-bound and the
    replayed compute time is within 10 % of (weights + KV bytes per GPU) / HBM bandwidth."""
    r = synthesize("llama3-70b", phase="decode", tp=8, batch=64, context=4096)
    res = replay_trace(r.trace, system="H100", timing="roofline", symmetric=True, memory=False)
    g = r.rank_graph(0)
    br = roofline_breakdown(g, res.hardware)
    assert br["memory_bound_us"] > 0.9 * (br["memory_bound_us"] + br["compute_bound_us"])
    a, z = res.rank_nodes(0)
    comp = g.type == int(NodeType.COMP_NODE)
    compute_us = float(np.nansum(res.built.program.dur[a:z][comp]))
    kv = 64 * 4096 * 80 * 8 * 128 * 2 * 2
    expect_us = (_llama70b_weights() + kv) / 8 / H100_HBM * 1e6
    assert abs(compute_us - expect_us) / expect_us < 0.10, (compute_us, expect_us)
    span = float(res.schedule.end.max() - res.schedule.start.min())
    assert span >= compute_us  # the step adds its tensor-parallel all-reduces


# STAGE's DeepSeek-R1 case in shape: R1's MoE (hidden 7,168; 256 routed experts + 32 redundant
# copies = 288 so they split over 36/72/144 GPUs; top-8; one shared expert; expert FFN 2,048;
# dense FFN 18,432; vocabulary 129,280), attention with 128 heads and about MLA's KV bytes per token
# (2 KV heads of 128), 2 MoE layers + 1 dense (enough to show the trend, fast).
R1_DIMS = {"L": 2, "LD": 1, "H": 7168, "NH": 128, "KV": 2, "HD": 128, "F": 2048, "FD": 18432,
           "E": 288, "K": 8, "ES": 1, "V": 129280}
# two racks of 36 GPUs each over NVLink (900 GB/s), 4 racks over 50 GB/s per GPU; direct all-to-all
NVL36 = {"topology": ["Switch", "Switch"], "npus_count": [36, 4], "bandwidth": [900.0, 50.0],
         "latency": [500.0, 2000.0]}
DIRECT = {"all-to-all-implementation": ["direct", "direct"]}


def _tokens_per_s(phase: str, ep: int, context: int) -> float:
    r = synthesize("deepseek-moe-16b", R1_DIMS, dp=144, ep=ep, phase=phase, batch=2048, context=context)
    res = replay_trace(r.trace, system="B200", network=NVL36, collectives=DIRECT, timing="roofline",
                       symmetric=True, memory=False)
    span_s = float(res.schedule.end.max() - res.schedule.start.min()) * 1e-6
    return 2048 * (context if phase == "prefill" else 1) / span_s


def test_stage_deepseek_r1_prefill_prefers_low_ep_decode_high_ep():
    """144 GPUs as 4×36, 2×72, 1×144 (EP for MoE, DP for the rest), batch 2,048: prefill
    throughput is highest at EP 36, decode throughput at EP 144."""
    eps = (36, 72, 144)
    pre = {ep: _tokens_per_s("prefill", ep, 1024) for ep in eps}
    dec = {ep: _tokens_per_s("decode", ep, 2048) for ep in eps}
    assert max(pre, key=pre.get) == 36, pre
    assert max(dec, key=dec.get) == 144, dec


def test_mla_absorbed_decode_flops_and_bytes():
    """DeepSeek-V2-Lite decode (batch 4, context 1,000, TP 2): the absorbed MLA form (DeepSeek-V2
    §2.1.2). Per layer and rank (8 of the 16 heads): scores over the 512 latent + 64 RoPE dims and
    P·V over the 512 latent dims, 2·b·h·T·(576 + 512) FLOPs; the attention reads the cached latent
    once (b·T·576·2 B, replicated across TP) plus the queries (b·h·576·2) and writes b·h·512·2;
    W_UK and W_UV are applied per head: 2·b·h·128·512 FLOPs each."""
    b, T, h, kr, dr, dn, dv = 4, 1000, 16 // 2, 512, 64, 128, 128
    r = synthesize("deepseek-v2-lite", {"L": 1}, phase="decode", batch=b, context=T, tp=2, ranks=[0])
    g = r.rank_graph(0)
    names = [r.trace.strings[i] for i in g.name]
    att = [i for i, n in enumerate(names) if n.startswith("attention ")]
    assert len(att) == 2  # the dense layer and the MoE layer
    for i in att:
        flops = 2 * b * h * T * (kr + dr) + 2 * b * h * T * kr
        assert abs(g.num_ops[i] - flops) / flops < 1e-3, (g.num_ops[i], flops)
        assert g.tensor_size[i] == b * T * (kr + dr) * 2 + b * h * (kr + dr) * 2 + b * h * kr * 2
    for stem in ("absorb_uk ", "absorb_uv "):
        ids = [i for i, n in enumerate(names) if n.startswith(stem)]
        assert len(ids) == 2 and all(g.num_ops[i] == 2 * b * h * (dn if stem == "absorb_uk " else dv) * kr for i in ids)
    assert r.stages[0].kv_cache_bytes == 2 * b * T * (kr + dr) * 2
    # prefill keeps the up-projection over the context (no absorption)
    p = synthesize("deepseek-v2-lite", {"L": 1}, phase="prefill", batch=1, context=256, ranks=[0])
    assert not any(p.trace.strings[i].startswith("absorb_") for i in p.rank_graph(0).name)


@pytest.mark.parametrize("tp", [8, 16, 32])
def test_kv_heads_are_replicated_not_split_beyond_their_count(tp):
    """Llama-3-8B has 8 KV heads of 128: at tp >= 8 every GPU caches one whole head — one layer,
    1,024 tokens: 1,024 x 2 (K, V) x 128 x 2 B — where tp 16/32 used to cache half/quarter heads."""
    res = synthesize("llama3-8b", {"L": 1}, tp=tp, phase="decode", batch=1, context=1024)
    assert res.stages[0].kv_cache_bytes == 1024 * 2 * 128 * 2
    assert any("replicated" in n for n in res.notes) == (tp > 8)


def test_kv_heads_that_do_not_divide_tp_are_refused():
    with pytest.raises(ValueError, match="KV heads"):
        synthesize("llama3-8b", {"L": 1, "KV": 3, "NH": 24, "HD": 128}, tp=4, phase="decode", batch=1, context=16)
