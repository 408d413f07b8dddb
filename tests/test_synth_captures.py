"""Synthesis against real captures: the sample GPT of ``sample_traces/`` under each captured plan.

For every scenario the capture's PyTorch execution trace is read here with plain ``json``/``gzip``
(matmuls: ``aten::mm`` nodes; collectives: the ``c10d::`` ops, bytes with Chakra's ``comm_size``
meaning from their input shapes) and compared per rank with the synthesized trace of the same
model and plan: matmul count, and count and bytes of every collective type and of sends/recvs.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from ettools.checks import verify
from ettools.converters.symbolic import synth_summary, synthesize

FLOAT = 4
# c10d op -> (Chakra type, index of the input whose size is comm_size)
C10D = {
    "c10d::allreduce_": ("ALL_REDUCE", 0),
    "c10d::_allgather_base_": ("ALL_GATHER", 1),
    "c10d::_reduce_scatter_base_": ("REDUCE_SCATTER", 1),
    "c10d::alltoall_base_": ("ALL_TO_ALL", 1),
    "c10d::send": ("SEND", 0),
    "c10d::recv_": ("RECV", 0),
}

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


def _numel(shape) -> int:
    if shape and isinstance(shape[0], list):  # a list of tensors
        return sum(_numel(s) for s in shape)
    return math.prod(shape) if shape else 0


def captured(path: Path) -> tuple[int, dict[str, list[int]]]:
    """(aten::mm count, {type: [count, bytes]}) of one rank's captured execution trace."""
    et = json.loads(gzip.open(path).read())
    mm = 0
    comm: dict[str, list[int]] = {}
    for n in et["nodes"]:
        name = n["name"]
        if name == "aten::mm":
            mm += 1
        elif name in C10D:
            kind, idx = C10D[name]
            nbytes = _numel(n["inputs"]["shapes"][idx]) * FLOAT
            t = comm.setdefault(kind, [0, 0])
            t[0] += 1
            t[1] += nbytes
    return mm, comm


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
        mm, comm = captured(sample_traces / files["et"])
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
