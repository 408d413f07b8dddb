"""The sample scenarios: model config, parallel plan, and the collectives the plan implies.

No torch import here: ``regenerate`` writes the manifest from this module alone.

Every scenario trains :data:`STEPS` optimizer steps and captures the last one (earlier steps
are warm-up: DDP, for one, broadcasts its rebuilt bucket layout during the second step).
``batch`` in a config is the batch of one model replica per optimizer step: per rank for DDP,
FSDP and the MoE data-parallel ranks; shared by the two ranks for TP; split into micro-batches
for PP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sample_traces.models.config import GPTConfig

STEPS = 6  # optimizer steps each script runs
CAPTURED_STEP = 6  # the one recorded (1-based): steps 1-5 warm up, so step times are steady
FLOAT_BYTES = 4

BASE = GPTConfig()
MOE = replace(BASE, moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0)


@dataclass(frozen=True)
class Scenario:
    """One capture: ``world`` ranks train ``cfg`` with ``plan``."""

    name: str
    world: int
    cfg: GPTConfig
    plan: dict = field(default_factory=dict)
    description: str = ""


_PLAN_KEYS = {
    "dp": 1,
    "tp": 1,
    "sp": False,
    "pp": 1,
    "ep": 1,
    "fsdp": 1,
    "schedule": None,
    "micro_batches": 1,
}


def _plan(**kw: object) -> dict:
    plan = dict(_PLAN_KEYS)
    plan.update(kw)
    return plan


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("single", 1, BASE, _plan(), "one process, no torch.distributed"),
        Scenario(
            "single_b16", 1, replace(BASE, batch=16), _plan(), "one process, batch doubled (rescale target)"
        ),
        Scenario(
            "ddp",
            2,
            BASE,
            _plan(
                dp=2, bucket_cap_mb=100, grad_sync="torch DDP, one bucket (all gradients < first-bucket cap)"
            ),
            "torch DistributedDataParallel on 2 ranks, each with its own batch",
        ),
        Scenario(
            "tp_sp",
            2,
            BASE,
            _plan(
                tp=2,
                sp=True,
                sp_regather_input=True,
                vocab_parallel=False,
                grad_sync="one all_reduce (sum) of the flattened norm gradients of the SP region",
            ),
            "Megatron-style tensor + sequence parallel on 2 ranks; embedding and LM head replicated",
        ),
        Scenario(
            "pp_gpipe",
            2,
            BASE,
            _plan(pp=2, schedule="gpipe", micro_batches=4, tags="activation m: m; gradient m: M+m"),
            "2-stage pipeline (layers split in half), GPipe over 4 micro-batches",
        ),
        Scenario(
            "pp_1f1b",
            2,
            BASE,
            _plan(pp=2, schedule="1f1b", micro_batches=4, tags="activation m: m; gradient m: M+m"),
            "2-stage pipeline (layers split in half), 1F1B over 4 micro-batches",
        ),
        Scenario("moe_single", 1, MOE, _plan(), "MoE FFN in every layer, all experts in one process"),
        Scenario(
            "moe_ep",
            2,
            MOE,
            _plan(
                dp=2, ep=2, grad_sync="one all_reduce (mean) of the flattened dense (non-expert) gradients"
            ),
            "MoE with expert parallel all_to_all on 2 ranks (also data parallel for dense weights)",
        ),
        Scenario(
            "fsdp",
            2,
            BASE,
            _plan(
                dp=2,
                fsdp=2,
                units="embedding, each block, final",
                reshard_after_forward=True,
                grad_sync="reduce_scatter (sum, then / ws) per unit",
            ),
            "explicit FSDP/ZeRO-3 on 2 ranks: flat padded shard per unit, all_gather before use",
        ),
    ]
}


# ---------------------------------------------------------------------------------------------
# parameter counts


def norm_params(cfg: GPTConfig) -> int:
    """Elements of one norm (LayerNorm: weight + bias; RMSNorm: weight)."""
    return cfg.hidden * (2 if cfg.norm == "layernorm" else 1)


def ffn_params(cfg: GPTConfig) -> int:
    """Elements of one (gated) FFN."""
    return cfg.hidden * cfg.ffn_hidden * (2 if cfg.gated else 1) + cfg.ffn_hidden * cfg.hidden


def param_counts(cfg: GPTConfig) -> dict[str, int]:
    """Elements per part: ``embedding``, ``block`` (each), ``final``, ``experts`` (per block), ``total``."""
    d = cfg.head_dim
    attn = cfg.hidden * (cfg.heads + 2 * cfg.kv_heads) * d + cfg.heads * d * cfg.hidden
    experts = cfg.moe_experts * ffn_params(cfg)
    ffn = (cfg.hidden * cfg.moe_experts + experts) if cfg.moe_experts else ffn_params(cfg)
    block = 2 * norm_params(cfg) + attn + ffn
    emb = cfg.vocab * cfg.hidden + cfg.seq * cfg.hidden
    final = norm_params(cfg) + cfg.hidden * cfg.vocab
    return {
        "embedding": emb,
        "block": block,
        "final": final,
        "experts": experts,
        "total": emb + cfg.layers * block + final,
    }


# ---------------------------------------------------------------------------------------------
# expected collectives


def _call(op: str, kind: str, shape: list[int], count: int, nbytes: int, **extra: object) -> dict:
    return {
        "op": op,
        "type": kind,
        "shape": shape,
        "dtype": "float",
        "count": count,
        "bytes": nbytes,
        **extra,
    }


def expected_collectives(sc: Scenario) -> dict[str, list[dict]]:
    """Per rank (``"0"``, ``"1"``) the collectives of the captured step, derived from the config.

    Each entry: ``op`` (the gloo ``c10d::`` op name in Kineto), ``type`` (Chakra collective name),
    ``shape`` (the *input* tensor of one call), ``count`` (calls), ``bytes`` (per call, Chakra
    ``comm_size`` meaning: all_reduce the buffer, all_gather the per-rank input, reduce_scatter
    the full input, all_to_all the per-rank total, send/recv the message), and ``peer``/``tags``
    for point-to-point.
    """
    c, p = sc.cfg, sc.plan
    b4 = FLOAT_BYTES
    pc = param_counts(c)
    ranks = [str(r) for r in range(sc.world)]
    if sc.world == 1:
        return {"0": []}
    if p.get("fsdp", 1) > 1:
        ws = p["fsdp"]
        sizes = [pc["embedding"]] + [pc["block"]] * c.layers + [pc["final"]]
        calls = []
        for n in sorted(set(sizes), key=sizes.index):
            padded = math.ceil(n / ws) * ws
            k = sizes.count(n)
            calls.append(
                _call("c10d::_allgather_base_", "ALL_GATHER", [padded // ws], 2 * k, padded // ws * b4)
            )
            calls.append(_call("c10d::_reduce_scatter_base_", "REDUCE_SCATTER", [padded], k, padded * b4))
        return {r: calls for r in ranks}
    if p.get("tp", 1) > 1:
        tp = p["tp"]
        act = [c.seq, c.batch, c.hidden]
        shard = [c.seq // tp, c.batch, c.hidden]
        # per layer: forward AG x2, RS x2; backward: row AG x2, column re-gather AG x2, column RS x2
        ag = (6 if p.get("sp_regather_input", True) else 4) * c.layers + 2  # + final gather, + embedding bwd
        rs = 4 * c.layers
        norms = (2 * c.layers + 1) * norm_params(c)
        calls = [
            _call("c10d::_allgather_base_", "ALL_GATHER", shard, ag, math.prod(shard) * b4),
            _call("c10d::_reduce_scatter_base_", "REDUCE_SCATTER", act, rs, math.prod(act) * b4),
            _call("c10d::allreduce_", "ALL_REDUCE", [norms], 1, norms * b4),
        ]
        return {r: calls for r in ranks}
    if p.get("pp", 1) > 1:
        m = p["micro_batches"]
        shape = [c.seq, c.batch // m, c.hidden]
        n = math.prod(shape) * b4
        act_tags, grad_tags = list(range(m)), list(range(m, 2 * m))
        return {
            "0": [
                _call("c10d::send", "SEND", shape, m, n, peer=1, tags=act_tags),
                _call("c10d::recv_", "RECV", shape, m, n, peer=1, tags=grad_tags),
            ],
            "1": [
                _call("c10d::recv_", "RECV", shape, m, n, peer=0, tags=act_tags),
                _call("c10d::send", "SEND", shape, m, n, peer=0, tags=grad_tags),
            ],
        }
    if p.get("ep", 1) > 1:
        cap = c.capacity(c.seq * c.batch)
        buf = [c.moe_experts, cap, c.hidden]
        dense = pc["total"] - c.layers * pc["experts"]
        calls = [
            _call("c10d::alltoall_base_", "ALL_TO_ALL", buf, 4 * c.layers, math.prod(buf) * b4),
            _call("c10d::allreduce_", "ALL_REDUCE", [dense], 1, dense * b4),
        ]
        return {r: calls for r in ranks}
    if p.get("dp", 1) > 1:
        return {
            r: [_call("c10d::allreduce_", "ALL_REDUCE", [pc["total"]], 1, pc["total"] * b4)] for r in ranks
        }
    raise ValueError(f"no expectation for plan {p}")
