"""The search's stage bound without synthesis (:class:`ettools.replay.search.bound.StageWork`):
the per-stage compute it counts from cached programs is what the synthesized plan's graph holds,
timed by the same compute model; plans that share their stages share the work; a plan it prunes
never reaches a worker.

The reference is the synthesizer itself: each plan synthesized (one rank per stage) and its graphs
timed by :func:`ettools.replay.search.evaluate._modelled_compute` — the path every trial took before.
"""

from __future__ import annotations

import pytest

from ettools.converters.symbolic import synthesize
from ettools.replay.search import Space, search
from ettools.replay.search import engines as search_engines
from ettools.replay.search.bound import StageWork
from ettools.replay.search.evaluate import (
    Context,
    _modelled_compute,
    representatives,
    stage_bound,
    synth_kwargs,
)
from ettools.replay.search.search import make_context
from ettools.replay.search.space import canonical

MODEL = "gpt3-5b"  # GPT: tied embeddings (the owner module updates the LM head's weight when pp = 1)
DIMS = {"L": 4}
GPUS = 16
BATCH = 16
SEQ = 512


def plan(dp, tp, pp, sp=False, zero=1, rc=False, mb=1, schedule="1f1b", bucket=None) -> dict:
    return canonical(dict(dp=dp, tp=tp, pp=pp, ep=1, cp=1, sp=sp, zero=zero, recompute=rc, micro_batch=mb,
                          schedule=schedule, vpp=2, bucket_mb=bucket))


# every axis the synthesizer's programs read, each value at least once: degrees (dp 1 has no
# batch axis), sp, ZeRO 0-3, recompute, micro-batch size, the three schedules, buckets
PLANS = [
    plan(16, 1, 1, zero=0),
    plan(1, 4, 4, zero=0, mb=2),
    plan(8, 2, 1, sp=True, zero=1, mb=2),
    plan(4, 2, 2, sp=True, zero=2, rc=True, schedule="gpipe"),
    plan(4, 4, 1, zero=3, rc=True, mb=4),
    plan(2, 2, 4, zero=3, mb=2, schedule="1f1b"),
    plan(4, 1, 4, zero=1, schedule="gpipe", bucket=25),
    plan(2, 4, 2, sp=True, zero=2, schedule="interleaved"),
    plan(8, 1, 2, zero=0, rc=True, mb=1, schedule="interleaved"),
]


@pytest.fixture(scope="module")
def ctx() -> Context:
    return make_context(MODEL, GPUS, dims=DIMS, batch=BATCH, seq=SEQ)[0]


def synthesized(ctx: Context, p: dict):
    reps = representatives(p)
    res = synthesize(ctx.model, ranks=reps, **synth_kwargs(ctx, p))
    return res, reps


@pytest.mark.parametrize("p", PLANS, ids=lambda p: " ".join(f"{k}={v}" for k, v in p.items()))
def test_stage_work_is_the_synthesized_stages_compute(ctx, p):
    res, reps = synthesized(ctx, p)
    want = _modelled_compute(res, reps, ctx)  # per stage: (compute µs, optimizer µs) of the real graphs
    assert want[0][0] > 0 and want[0][1] > 0
    fig = StageWork(ctx).figures(p)
    assert fig.micro_batches == res.plan.micro_batches
    assert len(fig.work) == len(want) == p["pp"]
    for (w, o), (w0, o0) in zip(fig.work, want):
        assert w == pytest.approx(w0, rel=1e-9)
        assert o == pytest.approx(o0, rel=1e-9)
    assert fig.bound_us == pytest.approx(stage_bound(res, reps, ctx, p), rel=1e-9)
    # memory: the synthesizer's own figures per stage, to the byte
    assert fig.peak_memory == [int(res.stages[k].peak_memory) for k in range(p["pp"])]
    assert fig.resident == [int(res.stages[k].resident_bytes) for k in range(p["pp"])]


def test_fp8_gemms_and_weight_casts_are_counted():
    # FP8 training: the GEMMs' operand casts (fwd/bwd) and the weights' casts after the optimizer
    c = make_context(MODEL, GPUS, dims=DIMS, batch=BATCH, seq=SEQ, dtype="fp8")[0]
    for p in (plan(8, 2, 1, sp=True, zero=1, mb=2), plan(4, 2, 2, zero=0, schedule="gpipe")):
        res, reps = synthesized(c, p)
        want = _modelled_compute(res, reps, c)
        got, _m = StageWork(c).stage_compute(p)
        assert [w for w, _ in got] == pytest.approx([w for w, _ in want], rel=1e-9)
        assert [o for _, o in got] == pytest.approx([o for _, o in want], rel=1e-9)


def test_plans_sharing_their_stages_share_the_work(ctx):
    work = StageWork(ctx)
    first = plan(4, 2, 2, sp=True, zero=1, mb=2, schedule="1f1b")
    work.bound(first)
    built, timed = work.stats["built"], work.stats["timed"]
    assert built == 1 and timed == 2  # the fwd/bwd programs and the step programs, once each
    # the schedule orders the same programs; recompute leaves the step programs alone
    for other in (dict(schedule="gpipe"), dict(schedule="interleaved"), dict(bucket_mb=25)):
        assert work.bound({**first, **other}) is not None
    assert (work.stats["built"], work.stats["timed"]) == (built, timed)
    # another ZeRO stage: another resident state, the step programs built and timed anew only
    work.bound({**first, "zero": 2})
    assert (work.stats["built"], work.stats["timed"]) == (built + 1, timed + 1)
    built, timed = work.stats["built"], work.stats["timed"]
    work.bound({**first, "zero": 2, "schedule": "gpipe"})
    assert (work.stats["built"], work.stats["timed"]) == (built, timed)
    # another data-parallel degree (pp 4 instead of 2): the programs are not rebuilt, only timed with
    # the new numbers (the optimizer's shard; GPT's position-embedding gradient sum is 1/dp per rank)
    work.bound(plan(2, 2, 4, sp=True, zero=1, mb=2))
    assert work.stats["built"] == built and work.stats["timed"] == timed + 2
    # recompute changes the backward: built and timed anew (the step programs are reused)
    work.bound(plan(4, 2, 2, sp=True, zero=1, mb=2, rc=True))
    assert work.stats["built"] == built + 1 and work.stats["timed"] == timed + 3


def test_a_plan_pruned_by_the_stage_bound_is_never_synthesized(monkeypatch):
    sent = []  # every plan handed to the engine (a worker synthesizes it)
    submit = search_engines.LocalEngine.submit
    monkeypatch.setattr(search_engines.LocalEngine, "submit",
                        lambda self, p, *args: (sent.append(p), submit(self, p, *args))[1])
    space = Space()
    for axis, vals in {"tp": [1, 2, 4], "pp": [1, 2], "zero": [1], "recompute": [False, True],
                       "micro_batch": [1, 2], "schedule": ["1f1b", "gpipe"], "sp": [False]}.items():
        space.restrict(axis, vals)
    res = search(MODEL, GPUS, batch=BATCH, dims=DIMS, seq=SEQ, space=space, cache_dir=None, workers=1,
                 progress=False, top=1)
    early = [t for t in res.trials if t.get("synthesized") is False]
    assert early and all(t["status"] in ("bound", "memory") for t in early)
    sent_keys = {tuple(sorted(p.items())) for p in sent}
    assert not any(tuple(sorted(t["plan"].items())) in sent_keys for t in early)
    assert res.bound_violations == 0
    assert res.stage_work["counted"] >= len(early)
    # each early prune's bound is the synthesized plan's own stage bound
    ctx = res.context
    for t in [t for t in early if t["status"] == "bound"][:3]:
        r, reps = synthesized(ctx, t["plan"])
        assert t["lower_bound_us"] == pytest.approx(stage_bound(r, reps, ctx, t["plan"]), rel=1e-9)


def test_a_plan_over_memory_is_pruned_before_synthesis_with_its_synthesized_peak():
    space = Space()
    for axis, vals in {"tp": [1, 2, 4], "pp": [1], "zero": [0, 1], "recompute": [False, True],
                       "micro_batch": [1, 2], "schedule": ["1f1b"], "sp": [False]}.items():
        space.restrict(axis, vals)
    limit_gib = 6.0
    res = search(MODEL, GPUS, batch=BATCH, dims=DIMS, seq=SEQ, space=space, cache_dir=None, workers=1,
                 progress=False, top=1, memory_gib=limit_gib)
    early = [t for t in res.trials if t["status"] == "memory" and t.get("synthesized") is False]
    assert early and res.count("replayed")
    ctx = res.context
    for t in early[:3]:
        r, _reps = synthesized(ctx, t["plan"])
        peak = max(int(r.stages[k].peak_memory) for k in r.stages)
        assert t["peak_memory_bytes"] == peak > limit_gib * 2**30
    assert all(t["peak_memory_bytes"] <= limit_gib * 2**30 for t in res.trials if t["status"] == "replayed")
