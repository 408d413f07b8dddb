"""The committed sample captures contain exactly the collectives their plans imply.

Reads ``sample_traces/`` with plain gzip + json. The expected collectives are computed here
from the model config and plan in the manifest (independently of ``sample_traces.scenarios``,
whose own numbers in the manifest are checked against these), never read off the traces.
Order is checked too where the plan fixes it (TP+SP, FSDP, both pipeline schedules).
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from functools import cache
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
SCENARIOS = MANIFEST["scenarios"]
F32 = 4

REQUIRED = {"single", "ddp", "tp_sp", "pp_gpipe", "pp_1f1b", "moe_ep", "fsdp"}


def _load(rel: str) -> dict:
    raw = (SAMPLES / rel).read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\0\0\0\0", f"{rel}: not a deterministic gzip"
    return orjson.loads(gzip.decompress(raw))


@cache
def _kineto(name: str, rank: int) -> dict:
    """What the tests need from one Kineto file (the parsed JSON itself is not kept: it is big)."""
    k = _load(SCENARIOS[name]["files"][str(rank)]["kineto"])
    events = sorted(k["traceEvents"], key=lambda e: e.get("ts", 0))
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    return {
        "distributedInfo": k.get("distributedInfo"),
        "steps": [e for e in events if e["name"].startswith("ProfilerStep#")],
        "op_spans": [(e["ts"], e["ts"] + e["dur"]) for e in ops],
        "rf_ids": {e["args"]["Record function id"] for e in ops},
        "mm": sum(1 for e in ops if e["name"] == "aten::mm"),
        "collectives": _collectives(name, rank, ops),
    }


@cache
def _et(name: str, rank: int) -> dict:
    et = _load(SCENARIOS[name]["files"][str(rank)]["et"])
    return {
        "names": {n["name"] for n in et["nodes"]},
        "rf_ids": {a["value"] for n in et["nodes"] for a in n.get("attrs", []) if a["name"] == "rf_id"},
    }


# ---- what the traces contain -------------------------------------------------------------------


def _collectives(name: str, rank: int, ops: list[dict]) -> list[tuple]:
    """``(op, input shape, peer, tag)`` of every gloo collective host op, in start order."""
    out = []
    for e in ops:
        if not e["name"].startswith("c10d::"):
            continue
        op, dims, args = e["name"], e["args"]["Input Dims"], e["args"]
        peer = tag = None
        if op == "c10d::allreduce_":
            shape = dims[0][0]  # a tensor list of one tensor
        elif op in ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::alltoall_base_"):
            shape = dims[1]  # (output, input, ...)
            assert args["Input type"][:2] == ["float", "float"], (name, rank, op)
        elif op in ("c10d::send", "c10d::recv_"):
            shape = dims[0][0]
            peer, tag = int(args["Concrete Inputs"][2]), int(args["Concrete Inputs"][3])
        else:
            raise AssertionError(f"{name} rank {rank}: unexpected collective {op}")
        out.append((op, tuple(shape), peer, tag))
    return out


# ---- what the plans imply (from the config) ------------------------------------------------------


def _counts(cfg: dict) -> dict[str, int]:
    h, f, v = cfg["hidden"], cfg["ffn_hidden"], cfg["vocab"]
    d = h // cfg["heads"]
    norm = 2 * h if cfg["norm"] == "layernorm" else h
    qkv = h * d * (cfg["heads"] + 2 * cfg["kv_heads"])
    proj = cfg["heads"] * d * h
    one_ffn = h * (2 * f if cfg["gated"] else f) + f * h
    experts = cfg["moe_experts"] * one_ffn
    ffn = h * cfg["moe_experts"] + experts if cfg["moe_experts"] else one_ffn
    block = norm + qkv + proj + norm + ffn
    emb = v * h + cfg["seq"] * h
    final = norm + h * v
    return {
        "norm": norm,
        "embedding": emb,
        "block": block,
        "final": final,
        "experts": experts,
        "total": emb + cfg["layers"] * block + final,
    }


AR, AG, RS, A2A = (
    "c10d::allreduce_",
    "c10d::_allgather_base_",
    "c10d::_reduce_scatter_base_",
    "c10d::alltoall_base_",
)
SEND, RECV = "c10d::send", "c10d::recv_"


def _expected(name: str, rank: int) -> list[tuple]:
    """The collectives of one captured step, in order."""
    sc = SCENARIOS[name]
    cfg, plan = sc["config"], sc["plan"]
    n = _counts(cfg)
    s, b, h, layers = cfg["seq"], cfg["batch"], cfg["hidden"], cfg["layers"]
    if sc["world_size"] == 1:
        return []
    if plan["tp"] > 1:
        tp = plan["tp"]
        ag, rs = (AG, (s // tp, b, h), None, None), (RS, (s, b, h), None, None)
        forward = [ag, rs, ag, rs] * layers + [ag]  # + gather for the replicated head
        # backward per layer, last first: fc2 (row: AG), fc1 (column: re-gather AG, RS), proj, qkv
        col_bwd = [ag, rs] if plan["sp_regather_input"] else [rs]
        backward = ([ag, *col_bwd] * 2) * layers + [ag]  # + the embedding's scatter backward
        norms = (2 * layers + 1) * n["norm"]
        return forward + backward + [(AR, (norms,), None, None)]
    if plan["pp"] > 1:
        m = plan["micro_batches"]
        shape = (s, b // m, h)
        peer = 1 - rank
        if rank == 0:
            act = [(SEND, shape, peer, i) for i in range(m)]
            grad = [(RECV, shape, peer, m + i) for i in range(m)]
        else:
            act = [(RECV, shape, peer, i) for i in range(m)]
            grad = [(SEND, shape, peer, m + i) for i in range(m)]
        if plan["schedule"] == "gpipe":
            return act + grad
        assert plan["schedule"] == "1f1b"
        warmup = plan["pp"] - rank - 1  # forwards before the first backward
        seq = act[:warmup]
        for i in range(m - warmup):
            seq += [act[warmup + i], grad[i]]
        return seq + grad[m - warmup :]
    if plan["ep"] > 1:
        tokens = s * b
        cap = math.ceil(cfg["moe_capacity_factor"] * cfg["moe_top_k"] * tokens / cfg["moe_experts"])
        a2a = (A2A, (cfg["moe_experts"], cap, h), None, None)
        dense = n["total"] - layers * n["experts"]
        return [a2a] * (4 * layers) + [(AR, (dense,), None, None)]
    if plan["fsdp"] > 1:
        ws = plan["fsdp"]
        units = [n["embedding"]] + [n["block"]] * layers + [n["final"]]
        padded = [math.ceil(u / ws) * ws for u in units]
        fwd = [(AG, (p // ws,), None, None) for p in padded]
        bwd = []
        for p in reversed(padded):
            bwd += [(AG, (p // ws,), None, None), (RS, (p,), None, None)]
        return fwd + bwd
    if plan["dp"] > 1:
        return [(AR, (n["total"],), None, None)]
    raise AssertionError(f"no expectation for {name}")


# ---- tests -----------------------------------------------------------------------------------


def test_manifest_covers_every_plan() -> None:
    assert REQUIRED <= set(SCENARIOS)
    for name, sc in SCENARIOS.items():
        assert sc["torch_version"], name
        assert len(sc["files"]) == sc["world_size"], name
        for files in sc["files"].values():
            for rel in files.values():
                size = (SAMPLES / rel).stat().st_size
                assert size < 400_000, f"{rel} is {size} bytes"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_collectives_are_exactly_the_plans(name: str) -> None:
    for rank in range(SCENARIOS[name]["world_size"]):
        assert _kineto(name, rank)["collectives"] == _expected(name, rank), f"{name} rank {rank}"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_manifest_expectation_agrees(name: str) -> None:
    """The manifest's expected collectives (from sample_traces.scenarios) agree with ours."""
    for rank in range(SCENARIOS[name]["world_size"]):
        ours = Counter((op, shape) for op, shape, _, _ in _expected(name, rank))
        theirs = Counter()
        for call in SCENARIOS[name]["expected_collectives"][str(rank)]:
            theirs[(call["op"], tuple(call["shape"]))] += call["count"]
            numel = math.prod(call["shape"])
            # Chakra comm_size: all_reduce buffer, all_gather per-rank input, reduce_scatter
            # full input, all_to_all per-rank total, p2p message: all the input tensor here
            assert call["bytes"] == numel * F32, (name, call)
        assert theirs == ours, f"{name} rank {rank}"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_one_captured_step_per_rank(name: str) -> None:
    sc = SCENARIOS[name]
    want = f"ProfilerStep#{sc['captured_step']}"
    for rank in range(sc["world_size"]):
        kineto = _kineto(name, rank)
        steps = kineto["steps"]
        assert [e["name"] for e in steps] == [want]
        lo, hi = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
        assert all(lo <= a and b <= hi + 1 for a, b in kineto["op_spans"]), "op outside the step"
        if sc["world_size"] > 1:
            info = kineto["distributedInfo"]
            assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", rank, sc["world_size"])
        et = _et(name, rank)
        assert want in et["names"]
        assert ("## process_group:init ##" in et["names"]) == (sc["world_size"] > 1)
        assert kineto["rf_ids"] <= et["rf_ids"]  # every host op joins its ET node


def test_sharded_plans_keep_the_matmuls_per_rank() -> None:
    """DDP, FSDP and TP+SP ranks run as many GEMMs as the single process (TP splits each one)."""
    single = _kineto("single", 0)["mm"]
    assert single > 0
    for name in ("ddp", "fsdp", "tp_sp"):
        for rank in range(SCENARIOS[name]["world_size"]):
            assert _kineto(name, rank)["mm"] == single, (name, rank)


def test_parallel_models_compute_the_single_model() -> None:
    """Same weights and data: TP+SP and both pipelines reproduce the single process's losses,
    FSDP reproduces DDP's, and MoE with expert parallelism the MoE model's first step."""
    loss = {name: sc["loss"] for name, sc in SCENARIOS.items()}
    for name in ("tp_sp", "pp_gpipe", "pp_1f1b"):
        assert loss[name].keys() == loss["single"].keys()
        for step, value in loss["single"].items():
            assert loss[name][step] == pytest.approx(value, abs=2e-5), (name, step)
    for step, value in loss["ddp"].items():
        assert loss["fsdp"][step] == pytest.approx(value, abs=2e-5), step
    assert loss["moe_ep"]["1"] == pytest.approx(loss["moe_single"]["1"], abs=2e-5)
