"""ettools search: pruning keeps the optimum, OOM plans are never replayed, engines agree, the cache
is reused, and the representative replay equals the full symmetric replay.

Small GPT-3-5B variants (4 layers, short sequences) on 16 GPUs keep each search to seconds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.converters.symbolic import synth_summary, synthesize
from ettools.replay.api import replay_trace
from ettools.replay.search import Space, evaluate_plan, search
from ettools.replay.search import engines as search_engines
from ettools.replay.search.evaluate import Context, synth_kwargs
from ettools.replay.search.space import canonical

MODEL = "gpt3-5b"
DIMS = {"L": 4}
GPUS = 16
BATCH = 16
SEQ = 512


def small_space(**over) -> Space:
    sp = Space()
    for axis, vals in {"tp": [1, 2, 4], "pp": [1, 2], "zero": [0, 1], "recompute": [False, True],
                       "micro_batch": [1, 2], "schedule": ["1f1b", "gpipe"], "sp": [False]}.items():
        sp.restrict(axis, over.get(axis, vals))
    return sp


def run(space: Space, **kw):
    args = dict(batch=BATCH, dims=DIMS, seq=SEQ, space=space, cache_dir=None, workers=1, progress=False)
    args.update(kw)
    return search(MODEL, GPUS, **args)


def test_pruning_never_drops_the_optimum():
    space = small_space(zero=[1])
    full = run(space, prune=False, top=1)
    pruned = run(space, prune=True, top=1)
    # the true optimum: the least step time over every replayed plan of the unpruned search
    replayed = [t for t in full.trials if t["status"] == "replayed"]
    assert len(replayed) > 10
    opt = min(replayed, key=lambda t: t["step_time_us"])
    assert pruned.best["key"] == opt["key"]
    assert pruned.best["step_time_us"] == pytest.approx(opt["step_time_us"], rel=1e-9)
    # pruning did prune, and every plan was accounted for exactly once
    counts = pruned.to_json()
    assert counts["pruned"]["bound"] > 0
    assert counts["replayed"] < len(replayed)
    assert counts["considered"] == len(full.trials) == len({t["key"] for t in pruned.trials})
    assert counts["considered"] == counts["replayed"] + sum(counts["pruned"].values())
    # the bound is a bound: no replay beat it
    for t in replayed:
        assert t["step_time_us"] >= t["lower_bound_us"]
    assert full.bound_violations == 0


def test_oom_plan_is_pruned_and_never_replayed(monkeypatch):
    import ettools.replay.api as api

    replayed_plans = []
    real = api.replay_trace

    def spy(trace, **kw):
        replayed_plans.append(dict(trace.meta.extra["synth"]["plan"]))
        return real(trace, **kw)

    monkeypatch.setattr(api, "replay_trace", spy)
    limit_gib = 6.0
    res = run(small_space(pp=[1], schedule=["1f1b"]), prune=False, memory_gib=limit_gib)
    mem = [t for t in res.trials if t["status"] == "memory"]
    ok = [t for t in res.trials if t["status"] == "replayed"]
    assert mem and ok
    limit = limit_gib * 2**30
    for t in mem:
        p = t["plan"]
        # the OOM is real: the synthesizer's own summary of the plan says so
        r = synthesize(MODEL, ranks=[0], **synth_kwargs(Context(MODEL, dict(DIMS), GPUS, BATCH, SEQ), p))
        assert synth_summary(r, ranks=[0])["ranks"]["0"]["peak_memory_bytes"] > limit or \
            t["reason"].startswith("weights, gradients and optimizer states")
        # and it never reached the replay
        assert not any(q["tp"] == p["tp"] and q["dp"] == p["dp"] and q["zero"] == p["zero"]
                       and q["recompute"] == p["recompute"] and q["micro_batches"] == BATCH // (p["dp"] * p["micro_batch"])
                       for q in replayed_plans)
    assert len(replayed_plans) == len(ok)
    assert all(t["peak_memory_bytes"] <= limit for t in ok)


def test_cache_hits_on_rerun(tmp_path, monkeypatch):
    calls = []
    real = search_engines.evaluate_plan

    def counting(ctx, plan, *args):
        calls.append(plan)
        return real(ctx, plan, *args)

    monkeypatch.setattr(search_engines, "evaluate_plan", counting)
    space = small_space(tp=[2, 4], pp=[1], recompute=[False], zero=[1])
    first = run(space, cache_dir=tmp_path, prune=False)
    n_first = len(calls)
    assert n_first > 0 and list(tmp_path.glob("*.jsonl"))
    calls.clear()
    again = run(space, cache_dir=tmp_path, prune=False)
    assert calls == []  # every trial came from the cache
    assert again.cache_hits == n_first
    assert [(t["key"], t.get("step_time_us")) for t in again.trials] == \
        [(t["key"], t.get("step_time_us")) for t in first.trials]
    # a widened space evaluates only the new plans
    wider = small_space(tp=[1, 2, 4], pp=[1], recompute=[False], zero=[1])
    calls.clear()
    run(wider, cache_dir=tmp_path, prune=False)
    assert calls and all(p["tp"] == 1 for p in calls)


def test_representative_replay_equals_full_symmetric_replay():
    ctx = Context(MODEL, dict(DIMS), GPUS, BATCH, SEQ)
    plan = canonical(dict(dp=2, tp=4, pp=2, ep=1, cp=1, sp=True, zero=1, recompute=False, micro_batch=2,
                          schedule="1f1b", vpp=1, bucket_mb=None))
    t = evaluate_plan(ctx, plan)
    assert t["status"] == "replayed" and t["replayed_ranks"] == 2
    full = synthesize(MODEL, **synth_kwargs(ctx, plan))
    assert len(full.trace.graphs) == GPUS
    res = replay_trace(full.trace, symmetric=True, memory=False)
    assert t["step_time_us"] == pytest.approx(res.step_time_us, rel=1e-9)


def test_ray_and_local_rank_the_same():
    pytest.importorskip("ray", reason="Ray is the optional 'search' extra (pip install 'ettools[search]')")
    space = small_space(tp=[2, 4], pp=[1, 2], recompute=[False], zero=[1], micro_batch=[2])
    local = run(space, top=3, workers=2)
    ray_res = run(space, top=3, workers=2, backend="ray")
    assert [(t["key"], t["step_time_us"]) for t in local.ranked[:3]] == \
        [(t["key"], t["step_time_us"]) for t in ray_res.ranked[:3]]
    assert local.best["key"] == ray_res.best["key"]


def test_cli_json_object_and_bad_input(tmp_path):
    r = CliRunner().invoke(main, ["search", "--model", MODEL, "--dim", "L=4", "--gpus", "16", "--batch", "16",
                                  "--seq", "512", "--tp", "2,4", "--fix", "pp=1", "--zero", "1", "--recompute", "0",
                                  "--sp", "0", "--no-cache", "--workers", "1", "--json", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output)
    assert set(obj) == {"considered", "pruned", "replayed", "seconds", "best", "trials"}
    assert set(obj["pruned"]) == {"invalid", "memory", "bound"}
    assert set(obj["best"]) == {"plan", "step_time_us", "peak_memory_bytes"}
    assert obj["best"]["plan"]["pp"] == 1 and obj["best"]["plan"]["tp"] in (2, 4)
    assert obj["considered"] == len(obj["trials"]) == obj["replayed"] + sum(obj["pruned"].values())
    # the files: every trial in the CSV, the JSON the same object
    csv_rows = (tmp_path / "trials.csv").read_text().strip().splitlines()
    assert len(csv_rows) == 1 + obj["considered"]
    assert json.loads((tmp_path / "trials.json").read_text())["best"] == obj["best"]
    steps = [t["step_time_us"] for t in obj["trials"] if t["status"] == "replayed"]
    assert obj["best"]["step_time_us"] == pytest.approx(float(np.min(steps)))
    bad = CliRunner().invoke(main, ["search", "--model", MODEL, "--gpus", "16", "--batch", "16", "--tp", "x"])
    assert bad.exit_code == 2


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_sampler_respects_its_budget(strategy):
    if strategy == "tpe":
        pytest.importorskip("optuna", reason="TPE is Optuna's (pip install 'ettools[search]')")
    space = small_space(zero=[1])
    n_space = len(list(space.canonical_plans(GPUS)))
    res = run(space, strategy=strategy, trials=8, workers=2, top=1)
    keys = [t["key"] for t in res.trials]
    assert len(keys) == len(set(keys)) == 8 < n_space
    assert res.best is not None and res.best["status"] == "replayed"
    assert res.best["step_time_us"] == min(t["step_time_us"] for t in res.trials if t["status"] == "replayed")


def test_tokens_per_second_uses_the_models_sequence_when_seq_is_not_given():
    # without --seq the preset's sequence sets tokens/s: GPT-3 models train on 2,048-token contexts
    space = small_space(tp=[1], pp=[1], zero=[0], recompute=[False], micro_batch=[2], schedule=["1f1b"])
    r = search("gpt3-125m", 2, batch=4, dims={"L": 2}, space=space, cache_dir=None, workers=1, progress=False,
               top=1)
    best = r.best
    assert best["tokens_per_s_per_gpu"] == pytest.approx(4 * 2048 / (best["step_time_us"] * 1e-6) / 2)
