"""Synthesis against real captures: the sample GPT of ``sample_traces/`` under each captured plan.

For every scenario the capture's PyTorch execution trace is read here with plain ``json``/``gzip``
(matmuls: ``aten::mm`` nodes; collectives: the ``c10d::`` ops, bytes with Chakra's ``comm_size``
meaning from their input shapes) and compared per rank with the synthesized trace of the same
model and plan: matmul count, and count and bytes of every collective type and of sends/recvs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from capture_reading import captured

from ettools.checks import verify
from ettools.converters.symbolic import synth_summary, synthesize

# scenario -> how ettools synth is asked for the same model and plan
PLANS = {
    "single": dict(model="sample_gpt"),
    "single_b16": dict(model="sample_gpt", batch=16, micro_batch=16),
    "ddp": dict(model="sample_gpt", dp=2, batch=16, micro_batch=16, bucket_mb=100),
    "fsdp": dict(model="sample_gpt", dp=2, fsdp=True, batch=16, micro_batch=16),
    "tp_sp": dict(model="sample_gpt", tp=2, sp=2, vocab_parallel=False, batch=8, micro_batch=8, bucket_mb=100),
    "pp_gpipe": dict(model="sample_gpt", pp=2, schedule="gpipe", batch=8, micro_batch=2),
    "pp_1f1b": dict(model="sample_gpt", pp=2, schedule="1f1b", batch=8, micro_batch=2),
    "moe_single": dict(model="sample_moe"),
    "moe_ep": dict(model="sample_moe", dp=2, ep=2, batch=16, micro_batch=16, bucket_mb=100),
}


@pytest.mark.parametrize("scenario", sorted(PLANS))
def test_synthesis_matches_capture(sample_traces: Path, scenario: str):
    manifest = json.loads((sample_traces / "manifest.json").read_text())
    sc = manifest["scenarios"][scenario]
    cfg = sc["config"]
    # the template's defaults are the sample config; make sure the capture used those dims
    assert (cfg["vocab"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn_hidden"],
            cfg["layers"]) == (256, 32, 64, 4, 2, 128, 2)
    res = synthesize(**PLANS[scenario], dtype="fp32")
    assert res.world_size == sc["world_size"]
    assert verify(res.trace) == []
    summary = synth_summary(res)
    for rank, files in sc["files"].items():
        mm, comm, _ = captured(sample_traces / files["et"])
        got = summary["ranks"][rank]
        assert got["ops"]["GeMM"] == mm, f"rank {rank} matmuls"
        assert {k: [v["count"], v["bytes"]] for k, v in got["comm"].items() if v["count"]} == comm, f"rank {rank} comm"


def test_sample_pp_tags_follow_the_capture(sample_traces: Path):
    """The capture tags micro-batch m's activation m and its gradient M + m; so do we."""
    res = synthesize("sample_gpt", pp=2, batch=8, micro_batch=2, dtype="fp32")
    g = res.trace.graphs[0]
    names = g.names()
    tags = Counter()
    for i, nm in enumerate(names):
        if nm.startswith("send_act"):
            tags["act"] += int(g.comm_tag[i])
        elif nm.startswith("recv_grad"):
            tags["grad"] += int(g.comm_tag[i])
    assert tags["act"] == 0 + 1 + 2 + 3
    assert tags["grad"] == 4 + 5 + 6 + 7
