"""A search worker's reuse and its dependency bound (issue 27):

* the symbolic programs a worker built for one plan are reused for the next plans that read the same
  of their plan (:func:`ettools.converters.symbolic.distribute.programs_key`): every trial, and every
  synthesized stage graph, is what it is without the cache;
* :func:`ettools.replay.search.pathbound.path_bound` (transfers on the dependency chains, stages
  waiting for each other, the device lane) never exceeds the replayed step time, and is tighter than
  the stage bound where transfers sit on the chains.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_search_bound import BATCH, DIMS, GPUS, MODEL, SEQ, plan  # the same model, GPUs, batch, plans

from ettools.converters.symbolic import synth as synth_mod
from ettools.converters.symbolic import synthesize
from ettools.converters.symbolic.distribute import programs_key
from ettools.converters.symbolic.setup import train_setup
from ettools.replay.api import replay_trace
from ettools.replay.search import evaluate as ev
from ettools.replay.search.evaluate import representatives, stage_bound, synth_kwargs
from ettools.replay.search.pathbound import path_bound
from ettools.replay.search.search import make_context

# degrees, sp, ZeRO 0-3, recompute, micro-batches, the three schedules, buckets
PLANS = [
    plan(16, 1, 1, zero=0),
    plan(8, 2, 1, sp=True, zero=1, mb=2),
    plan(8, 2, 1, sp=True, zero=2, mb=1),
    plan(4, 4, 1, zero=3, rc=True, mb=4),
    plan(4, 2, 2, sp=True, zero=2, rc=True, schedule="gpipe"),
    plan(2, 2, 4, zero=3, mb=2),
    plan(4, 1, 4, zero=1, schedule="gpipe", bucket=25),
    plan(2, 4, 2, sp=True, zero=2, schedule="interleaved"),
    plan(8, 1, 2, zero=0, rc=True, schedule="interleaved"),
    plan(1, 8, 2, zero=0, mb=2),
]


@pytest.fixture(scope="module")
def ctx():
    return make_context(MODEL, GPUS, dims=DIMS, batch=BATCH, seq=SEQ)[0]


def _results(trial: dict) -> dict:
    return {k: v for k, v in trial.items() if k != "seconds"}


def test_trials_are_the_same_with_the_workers_program_cache(ctx, monkeypatch):
    monkeypatch.setattr(ev, "_PROGRAMS", {})
    # two more plans that differ from one above in micro-batches or schedule only: its programs
    plans = PLANS + [plan(8, 2, 1, sp=True, zero=1, mb=1), plan(4, 2, 2, sp=True, zero=2, rc=True)]
    cold = [ev.evaluate_plan(ctx, p, reuse=False) for p in plans]
    assert not ev._PROGRAMS
    warm = [ev.evaluate_plan(ctx, p, reuse=True) for p in plans]
    assert len(ev._PROGRAMS) == len(PLANS)  # the last two reused what their siblings built
    again = [ev.evaluate_plan(ctx, p, reuse=True) for p in plans]  # every program set from the cache
    assert [t["status"] for t in cold] == ["replayed"] * len(plans)
    assert [_results(t) for t in warm] == [_results(t) for t in cold] == [_results(t) for t in again]


def test_synthesized_stages_are_the_same_with_programs_from_another_plan(ctx):
    cache: dict = {}
    # warm the cache with plans that share the programs of the ones compared (other degrees,
    # micro-batches, schedule, buckets)
    for p in (plan(2, 2, 4, sp=True, zero=1, mb=2, schedule="gpipe"), plan(4, 1, 4, zero=1, bucket=25)):
        synthesize(ctx.model, ranks=representatives(p), programs_cache=cache, **synth_kwargs(ctx, p))
    built = len(cache)
    for p in (plan(4, 2, 2, sp=True, zero=1, mb=1, schedule="interleaved"), plan(4, 1, 4, zero=1, mb=2, schedule="gpipe")):
        reps = representatives(p)
        a = synthesize(ctx.model, ranks=reps, **synth_kwargs(ctx, p))
        b = synthesize(ctx.model, ranks=reps, programs_cache=cache, **synth_kwargs(ctx, p))
        assert a.stages.keys() == b.stages.keys()
        for s in a.stages:
            x, y = a.stages[s], b.stages[s]
            assert x.cols.keys() == y.cols.keys()
            for k in x.cols:
                if k.startswith("_"):
                    continue  # caches the stamper adds
                assert np.array_equal(x.cols[k], y.cols[k], equal_nan=x.cols[k].dtype.kind == "f"), (s, k)
            for k in ("dep_ptr", "dep_id", "dep_kind", "peer_delta", "tags"):
                assert np.array_equal(getattr(x, k), getattr(y, k)), (s, k)
            assert (x.peak_memory, x.resident_bytes, x.model_flops) == (y.peak_memory, y.resident_bytes, y.model_flops)
        assert list(a.trace.strings) == list(b.trace.strings)
    assert len(cache) == built  # nothing built anew


def test_programs_key_reads_what_the_programs_depend_on(ctx):
    def key(**kw):
        p = plan(**{**dict(dp=4, tp=2, pp=2, zero=1), **kw})
        return programs_key(train_setup(ctx.model, **synth_kwargs(ctx, p)).plan)

    base = key()
    # degrees over the same axes, micro-batches, schedule and buckets: not read
    assert key(dp=2, pp=4) == key(schedule="interleaved") == key(bucket=25) == key(mb=2) == base
    # ZeRO stage, recompute, sequence parallelism, which axes exist, pp == 1: read
    for other in (dict(zero=2), dict(rc=True), dict(sp=True), dict(tp=1, dp=8), dict(pp=1, dp=8)):
        assert key(**other) != base, other


def test_setup_stays_importable_from_synth():
    from ettools.converters.symbolic import setup

    for name in ("train_setup", "TrainSetup", "resolve_model", "merge_dims", "recompute_mode", "check_sizes",
                 "_check_divisible", "replicate_kv_heads", "model_symbols", "MAX_MICRO_BATCHES"):
        assert getattr(synth_mod, name) is getattr(setup, name)


@pytest.mark.parametrize("p", PLANS, ids=lambda p: " ".join(f"{k}={v}" for k, v in p.items()))
def test_dependency_bound_never_exceeds_the_replayed_step(ctx, p):
    reps = representatives(p)
    res = synthesize(ctx.model, ranks=reps, **synth_kwargs(ctx, p))
    pb = path_bound(res, reps, ctx)
    step = replay_trace(res.trace, system=ctx.system, network=ctx.network, collectives=ctx.collectives,
                        timing=ctx.timing, memory=False).step_time_us
    assert 0 < pb <= step * (1 + 1e-9)
    # over the whole rank the device lane alone gives each stage's compute: at least the stage bound's
    # largest stage (its pipeline term aside)
    assert pb >= stage_bound(res, reps, ctx, dict(p, schedule="interleaved")) * (1 - 1e-9)


def test_dependency_bound_sees_transfers_on_the_chains(ctx):
    # tensor parallelism over 8 GPUs: every layer's all-reduces sit between its GEMMs; ZeRO-3 gathers
    # each module's weights before its forward and backward
    for p in (plan(2, 8, 1, zero=0, mb=1), plan(4, 4, 1, zero=3, mb=1)):
        reps = representatives(p)
        res = synthesize(ctx.model, ranks=reps, **synth_kwargs(ctx, p))
        assert path_bound(res, reps, ctx) > 1.1 * stage_bound(res, reps, ctx, p)


def test_trial_pruned_by_the_dependency_bound(ctx):
    p = plan(4, 4, 1, zero=3, mb=1)
    full = ev.evaluate_plan(ctx, p)
    assert full["status"] == "replayed" and "path_bound_us" not in full  # no threshold: not computed
    res = synthesize(ctx.model, ranks=representatives(p), **synth_kwargs(ctx, p))
    pb = path_bound(res, representatives(p), ctx)
    sb = stage_bound(res, representatives(p), ctx, p)
    thr = (pb + sb) / 2  # beaten by the stage bound, not by the dependency bound
    t = ev.evaluate_plan(ctx, p, thr)
    assert t["status"] == "bound" and t["reason"].startswith("dependency bound")
    assert t["lower_bound_us"] == t["path_bound_us"] == pytest.approx(pb, rel=1e-12)
    assert "replay" not in t["seconds"]
    off = ev.evaluate_plan(ctx, p, thr, path=False)
    assert off["status"] == "replayed" and off["step_time_us"] == full["step_time_us"] > pb
