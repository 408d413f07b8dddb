"""One trial of ``ettools search``: synthesize a plan, check its memory, bound it, replay it.

:func:`evaluate_plan` is what a worker runs (a local process or a Ray task): plain values in, a plain
dict out, so any engine can carry it. Order of the checks, cheapest first:

1. **synthesis** of one rank per pipeline stage (``synthesize(ranks=…)`` builds only those stages);
   a plan the synthesizer refuses is ``invalid``;
2. **memory**: the synthesizer's own peak per rank (resident weights, gradients and optimizer
   states under the ZeRO stage + activations live along the schedule + the largest op's working
   set), the largest over stages; above the device's memory the plan is ``memory`` and is never
   replayed;
3. **bound**: a lower bound on the step time from the synthesized FLOPs (see :func:`stage_bound`);
   when it cannot beat ``bound_us`` (the K-th best step time found so far) the plan is ``bound``;
   else the dependencies' bound (:func:`.pathbound.path_bound`: transfers on the dependency chains,
   stages waiting for each other, the device lane) is tried the same way;
4. **replay** of the representatives only: ranks of one pipeline stage are the same graph up to
   group ids and peers (the synthesizer stamps them from one stage graph), so they are one symmetry
   class. The trace holds one rank per stage (all its peers on other stages, same tp/cp/dp
   coordinates, are representatives too, so pipeline sends and receives are replayed as pairs);
   collectives whose other members are absent take the network's closed-form time as if every
   member arrived together — exactly what symmetric members do. A 1,024-GPU plan costs its ``pp``
   distinct ranks, not 1,024.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .context import INF, Context, compute_us, synth_kwargs, timing_model

__all__ = ["INF", "Context", "compute_us", "evaluate_plan", "representatives", "stage_bound", "synth_kwargs",
           "timing_model"]


def representatives(plan: dict[str, Any]) -> list[int]:
    """One rank per pipeline stage: pp is the slowest mesh axis, so stage s starts at s·world/pp."""
    per = plan["dp"] * plan["tp"] * plan["cp"]
    return [s * per for s in range(plan["pp"])]


def pipeline_bound(work: float, micro_batches: int, pp: int) -> float:
    """Least step time of a ``pp``-stage pipeline whose stages sum to ``work`` per micro-batch × M.

    Stage k cannot start before micro-batch 0's forward crossed stages 0..k-1 and cannot finish
    before the last backward crossed them back, so ``T ≥ W_k + Σ_{s<k} W_s / M`` for every k, where
    ``W_s`` is stage s's work over the step. Over all splits of ``work`` into ``W_s`` the smallest
    such T makes every one of these bounds equal: ``T = work / (M (1 - (1 - 1/M)^pp))``
    (``work`` when pp or M is 1, ``work·(M+pp-1)/(M·pp)``-like for balanced stages).
    """
    m = max(int(micro_batches), 1)
    if pp <= 1:
        return work
    return work / (m * (1.0 - (1.0 - 1.0 / m) ** pp))  # M = 1: the whole pipeline's work


def closed_form_bound(ctx: Context, plan: dict[str, Any]) -> float:
    """Lower bound (µs) on the step time before synthesis: the pipeline's FLOPs at peak.

    Parallelism never removes work: the ranks of one pipeline replica together do at least a
    sample's FLOPs (``sample_flops``, measured on the unsplit model) times the samples they
    get, ``batch / dp`` — split over ``tp · cp`` ranks at best. The pipeline bound
    (:func:`pipeline_bound`) spreads it over the stages (interleaved: no bubble term).
    """
    f = ctx.sample_flops_rc if plan["recompute"] else ctx.sample_flops
    if not f or not ctx.peak_flops or ctx.collectives:  # an ASTRA-sim system file has its own peak
        return 0.0
    work = f * ctx.batch / (plan["dp"] * plan["tp"] * plan["cp"]) / ctx.peak_flops * 1e6
    m = ctx.batch // (plan["dp"] * plan["micro_batch"])
    if plan["schedule"] == "interleaved":
        return work / plan["pp"]
    return pipeline_bound(work, m, plan["pp"])


def _modelled_compute(result: Any, reps: list[int], ctx: Context) -> list[tuple[float, float]] | None:
    """Per representative: (µs of its compute nodes, µs of its optimizer nodes) as the replay will
    time them (the same compute model, hardware and timing), or None when an ASTRA-sim system file
    brings its own roofline (then no bound is claimed)."""
    from ettools.graph import NodeType
    from ettools.replay import compute as cm

    model = timing_model(ctx)
    if model is None:
        return None
    trace = cm.without_estimates(result.trace)  # synthesized durations: re-timed, as the replay does
    opt = result.plan.optimizer
    out = []
    memo: dict[int, tuple[float, float]] = {}
    for r in reps:
        g = trace.graphs[r]
        hit = memo.get(id(g.num_ops))  # ranks of one stage graph share their columns
        if hit is None:
            d = compute_us(g, model)
            o = 0.0
            if opt:
                comp = g.type == NodeType.COMP_NODE
                ids = np.unique(g.name[comp])
                mine = [i for i in ids.tolist() if str(g.strings[i]).startswith(f"{opt} ")]
                if mine:
                    o = float(d[np.isin(g.name, mine)].sum())
            hit = memo[id(g.num_ops)] = (float(d.sum()), o)
        out.append(hit)
    return out


def bound_of_stages(parts: list[tuple[float, float]], micro_batches: int, schedule: str) -> float:
    """The stage bound (see :func:`stage_bound`) of per-stage ``(W_k, O_k)``: each stage's compute
    µs and its optimizer's part, stages in pipeline order."""
    if not parts:
        return 0.0
    work = [w for w, _ in parts]
    optw = [o for _, o in parts]
    m = max(micro_batches, 1)
    best = max(work)
    if schedule != "interleaved" and len(work) > 1:
        before = 0.0
        for k in range(len(work)):
            best = max(best, work[k] - optw[k] + before / m)
            before += work[k] - optw[k]
    return best


def stage_bound(result: Any, reps: list[int], ctx: Context, plan: dict[str, Any]) -> float:
    """Lower bound (µs) on the step time from the synthesized stages: their compute, serialized.

    A rank runs its compute nodes one at a time (one compute stream), each as long as the replay's
    compute model says (on the roofline at least ``FLOPs / peak``), so a stage's step is at least
    the sum, ``W_k``. Off the interleaved schedule the pipeline adds, for stage k, one micro-batch's
    forward and backward through every stage before it (optimizer excluded: it runs after the
    stage's own last backward, alongside the others'): ``W_k - O_k + Σ_{s<k}(W_s - O_s)/M``.
    Communication is left out (it may overlap), so the bound stays below the replayed step time;
    :class:`~.search.SearchResult` counts any replay that beats it (``bound_violations``).
    :class:`.bound.StageWork` computes the same ``W_k``/``O_k`` without synthesizing the plan.
    """
    parts = _modelled_compute(result, reps, ctx)
    if not parts:
        return 0.0
    return bound_of_stages(parts, result.plan.micro_batches, plan["schedule"])


# the symbolic programs this process built for its trials, reused by the next trials that read the
# same of their plan (:func:`ettools.converters.symbolic.distribute.programs_key`): a worker of a
# search runs many plans of one model
_PROGRAMS: dict = {}


def evaluate_plan(ctx: Context, plan: dict[str, Any], bound_us: float = INF,
                  lower_bound_us: float | None = None, reuse: bool = True, path: bool = True) -> dict[str, Any]:
    """Run one trial (see the module docstring). Returns a dict with ``status`` (``invalid``,
    ``memory``, ``bound`` or ``replayed``), ``peak_memory_bytes``, ``lower_bound_us`` and, once
    replayed, ``step_time_us`` and the slowest rank's ``compute_us``/``comm_us``/``exposed_comm_us``/
    ``bubble_us`` (idle), ``tokens_per_s_per_gpu``, ``mfu``; ``seconds`` per phase.
    ``lower_bound_us``: the plan's :func:`stage_bound` when the caller has it already
    (:class:`.bound.StageWork`, the same value), so the synthesized graph is not timed again.
    ``reuse``: take the symbolic programs from this process's earlier trials where they apply
    (the same result either way). ``path``: when the stage bound does not prune the plan against a
    finite ``bound_us``, try the tighter :func:`.pathbound.path_bound` before replaying (its value:
    ``path_bound_us``; ``lower_bound_us`` is the larger of the two)."""
    from ettools.converters.symbolic import synthesize
    from ettools.errors import TraceError

    t0 = time.perf_counter()
    out: dict[str, Any] = {"plan": dict(plan), "status": "invalid", "reason": None}
    reps = representatives(plan)
    try:
        res = synthesize(ctx.model, ranks=reps, programs_cache=_PROGRAMS if reuse else None,
                         **synth_kwargs(ctx, plan))
    except (ValueError, TraceError) as e:
        out["reason"] = str(e).splitlines()[0]
        out["seconds"] = {"synth": time.perf_counter() - t0}
        return out
    t1 = time.perf_counter()
    peak = max(int(res.stages[s].peak_memory) for s in res.stages)
    out["peak_memory_bytes"] = peak
    # weights, gradients and optimizer states: the part of the peak that micro-batching, recompute
    # and the schedule leave alone (the search prunes such siblings of a plan whose state alone is OOM)
    out["resident_bytes"] = max(int(res.stages[s].resident_bytes) for s in res.stages)
    out["seconds"] = {"synth": t1 - t0}
    if ctx.memory_bytes and peak > ctx.memory_bytes:
        out["status"] = "memory"
        out["reason"] = f"peak {peak / 2**30:.1f} GiB per GPU > {ctx.memory_bytes / 2**30:.1f} GiB"
        return out
    lb = stage_bound(res, reps, ctx, plan) if lower_bound_us is None else float(lower_bound_us)
    what = "lower bound"
    if path and bound_us < INF and lb < bound_us:
        # the dependencies' bound (transfers on the chains, stages waiting for each other): it
        # costs a fraction of a replay, so only where a threshold could prune the plan
        from .pathbound import path_bound

        pb = path_bound(res, reps, ctx)
        out["path_bound_us"] = pb
        if pb > lb:
            lb, what = pb, "dependency bound"
    out["lower_bound_us"] = lb
    t1 = time.perf_counter()
    out["seconds"]["bound"] = t1 - t0 - out["seconds"]["synth"]
    if lb >= bound_us:
        out["status"] = "bound"
        out["reason"] = f"{what} {lb / 1e3:.1f} ms >= {bound_us / 1e3:.1f} ms"
        return out
    from ettools.replay.api import replay_trace

    rr = replay_trace(res.trace, system=ctx.system, network=ctx.network, collectives=ctx.collectives,
                      timing=ctx.timing, memory=False)
    t2 = time.perf_counter()
    ranks = rr.ranks
    slow = max(ranks.values(), key=lambda r: r.step_time_us)
    step = float(rr.step_time_us)
    out.update(status="replayed", step_time_us=step, compute_us=float(slow.compute_us),
               comm_us=float(slow.comm_us), exposed_comm_us=float(slow.exposed_comm_us),
               bubble_us=float(slow.idle_us), slowest_rank=int(slow.rank),
               replayed_ranks=len(reps))
    tokens = ctx.batch * (ctx.seq or ctx.dims.get("S") or ctx.default_seq or 0)
    out["tokens_per_s_per_gpu"] = tokens / (step * 1e-6) / ctx.gpus if step > 0 and tokens else None
    out["mfu"] = (ctx.sample_flops * ctx.batch / (step * 1e-6 * ctx.gpus * ctx.peak_flops)
                  if step > 0 and ctx.sample_flops and ctx.peak_flops else None)
    out["seconds"]["replay"] = t2 - t1
    return out
