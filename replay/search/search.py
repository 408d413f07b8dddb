"""The search loop of ``ettools search``: enumerate or sample plans, prune, replay, rank.

**Exhaustive** (default): every distinct plan of the space (:mod:`.space`). Invalid plans are
dropped arithmetically; the others are visited in order of a closed-form lower bound on their step
time (:func:`.evaluate.closed_form_bound`), branch-and-bound style: a plan whose bound cannot beat
the K-th best step time replayed so far (K = ``top``) is pruned without synthesis. Then the trial's
own checks before its replay are made here, still without synthesizing the plan
(:class:`.bound.StageWork`: per-stage compute and memory from programs cached across the plans
that share them): the synthesizer's peak memory per rank, then the stage bound
(:func:`.evaluate.stage_bound`: each stage's compute as the replay times it). A plan they prune is
never sent to a worker; the rest go to the engine (:mod:`.engines`), which synthesizes, checks
memory, takes that bound, tries the tighter dependency bound of the synthesized graphs
(:func:`.pathbound.path_bound`) and replays (:func:`.evaluate.evaluate_plan`). Pruning against the K-th
best (not the best) keeps the top K exact whatever order trials finish in, so every engine ranks
the same.

**Samplers** (``random``, ``tpe``, ``cmaes``) visit at most ``trials`` distinct plans: ``random``
draws them uniformly (no extra dependency); ``tpe``/``cmaes`` use Optuna (``pip install
'ettools[search]'``) with one integer parameter per axis (an index into its values) so CMA-ES applies;
pruned and invalid trials are told as pruned.

Objectives: ``step_time`` (default), ``tokens`` (tokens/s/GPU) and ``mfu`` rank as step time does
(batch, sequence and GPUs are fixed); ``memory`` ranks by peak memory per GPU among plans whose
replayed step time is within ``time_bound_us`` (the bound prunes plans that cannot meet it).
"""

from __future__ import annotations

import csv
import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .bound import StageWork
from .cache import TrialCache, default_cache_dir
from .engines import make_engine
from .evaluate import INF, Context, closed_form_bound, synth_kwargs
from .space import PLAN_KEYS, Space, canonical, invalid_reason, plan_key, plan_label, state_key

OBJECTIVES = ("step_time", "tokens", "mfu", "memory")
STRATEGIES = ("exhaustive", "random", "tpe", "cmaes")
CSV_FIELDS = ("rank", "key", "status", *PLAN_KEYS, "step_time_us", "tokens_per_s_per_gpu", "mfu",
              "peak_memory_bytes", "lower_bound_us", "compute_us", "comm_us", "exposed_comm_us",
              "bubble_us", "cached", "synth_s", "replay_s", "reason")


def reference_flops(model: str, dims: dict[str, int], seq: int | None, dtype: str, recompute: bool) -> float:
    """FLOPs of one sample through the whole model on one rank (the synthesizer's own count;
    no optimizer): what parallelism splits but never removes."""
    from ettools.converters.symbolic import synthesize
    from ettools.graph import NodeType

    r = synthesize(model, dict(dims), batch=1, micro_batch=1, seq=seq, dtype=dtype, recompute=recompute,
                   optimizer=None, ranks=[0])
    g = r.rank_graph(0)
    comp = (g.type == NodeType.COMP_NODE) & (g.num_ops > 0)
    return float(g.num_ops[comp].astype(np.float64).sum())


def make_context(model: str, gpus: int, *, dims: dict[str, int] | None = None, batch: int, seq: int | None = None,
                 dtype: str = "bf16", system: str | None = None, network: str | None = None,
                 collectives: str | None = None, timing: str = "measured",
                 memory_gib: float | None = None) -> tuple[Context, dict[str, int]]:
    """The shared :class:`.evaluate.Context` of a search and the model's resolved dimensions."""
    from ettools.converters.symbolic.synth import resolve_model
    from ettools.replay import compute as cm

    m, preset_dims, _opts, _label = resolve_model(model)
    resolved = {**m.defaults, **preset_dims, **(dims or {})}
    if seq is not None:
        resolved["S"] = int(seq)
    hw = cm.load_hardware(system, gpus) if system is not None else cm.load_hardware("H100", gpus)
    mem = int(memory_gib * 2**30) if memory_gib else int(hw.memory_bytes or 0)
    ctx = Context(model=str(model), dims=dict(dims or {}), gpus=int(gpus), batch=int(batch), seq=seq, dtype=dtype,
                  system=system, network=None if network is None else str(network),
                  collectives=None if collectives is None else str(collectives), timing=timing,
                  memory_bytes=mem, peak_flops=cm.peak_flops(hw))
    ctx.sample_flops = reference_flops(model, ctx.dims, seq, dtype, False)
    ctx.sample_flops_rc = reference_flops(model, ctx.dims, seq, dtype, True)
    ctx.default_seq = int(resolved.get("S") or 0)
    return ctx, resolved


@dataclass
class SearchResult:
    """Every trial of a search, the counts, the ranking."""

    context: Context
    objective: str
    top: int
    trials: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    strategy: str = "exhaustive"
    cache_hits: int = 0
    cache_path: str | None = None
    bound_violations: int = 0  # replayed faster than their lower bound (would make pruning unsafe)
    # the stage bounds computed in this process without synthesis (:attr:`.bound.StageWork.stats`)
    stage_work: dict[str, Any] = field(default_factory=dict)

    def count(self, status: str) -> int:
        """Trials with ``status``."""
        return sum(1 for t in self.trials if t["status"] == status)

    @property
    def ranked(self) -> list[dict[str, Any]]:
        """Replayed trials best first (feasible ones under the memory objective)."""
        ok = [t for t in self.trials if t["status"] == "replayed" and t.get("feasible", True)]
        return sorted(ok, key=lambda t: (_objective_value(t, self.objective), t["key"]))

    @property
    def best(self) -> dict[str, Any] | None:
        """The best trial, or None when nothing was replayed."""
        r = self.ranked
        return r[0] if r else None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (the keys scripts rely on)."""
        b = self.best
        return {
            "considered": len(self.trials),
            "pruned": {"invalid": self.count("invalid"), "memory": self.count("memory"), "bound": self.count("bound")},
            "replayed": self.count("replayed"),
            "seconds": round(self.seconds, 3),
            "best": None if b is None else {"plan": b["plan"], "step_time_us": b["step_time_us"],
                                            "peak_memory_bytes": int(b["peak_memory_bytes"])},
            "trials": self.trials,
        }

    def table(self, k: int | None = None) -> str:
        """The ranked table (top ``k``)."""
        from tabulate import tabulate

        rows = []
        for i, t in enumerate(self.ranked[: k or self.top], 1):
            rows.append([i, plan_label(t["plan"]), f"{t['step_time_us'] / 1e3:,.1f}",
                         f"{t['tokens_per_s_per_gpu']:,.0f}" if t.get("tokens_per_s_per_gpu") else "-",
                         f"{100 * t['mfu']:.1f}%" if t.get("mfu") else "-",
                         f"{t['peak_memory_bytes'] / 2**30:.1f}", f"{t['compute_us'] / 1e3:,.1f}",
                         f"{t['exposed_comm_us'] / 1e3:,.1f}", f"{t['bubble_us'] / 1e3:,.1f}"])
        return tabulate(rows, headers=["#", "plan", "step ms", "tok/s/GPU", "MFU", "peak GiB", "compute ms",
                                       "exposed comm ms", "bubble ms"], tablefmt="simple")

    def summary(self) -> str:
        """The counts line."""
        return (f"{len(self.trials):,} plans considered in {self.seconds:.1f} s: {self.count('replayed'):,} replayed, "
                f"pruned {self.count('invalid'):,} invalid, {self.count('memory'):,} over memory, "
                f"{self.count('bound'):,} by the bound ({self.cache_hits:,} from the cache)")

    def write(self, outdir: str | Path, plot: bool = True) -> dict[str, Path]:
        """``trials.json``, ``trials.csv`` and (matplotlib installed) ``pareto.png`` in ``outdir``."""
        import orjson

        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        out = {"json": outdir / "trials.json", "csv": outdir / "trials.csv"}
        out["json"].write_bytes(orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        with open(out["csv"], "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for t in self.trials:
                row = {**t, **t["plan"]}
                row["synth_s"] = t.get("seconds", {}).get("synth")
                row["replay_s"] = t.get("seconds", {}).get("replay")
                w.writerow(row)
        if plot:
            try:
                out["plot"] = self.pareto_plot(outdir / "pareto.png")
            except ImportError:
                pass
        return out

    def pareto_plot(self, path: str | Path) -> Path:
        """Step time vs peak memory per GPU: replayed plans, their Pareto front, pruned plans grey
        (at their lower bound, hollow), the device's memory as a line."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        gib = 2**30
        pr = [t for t in self.trials if t["status"] in ("memory", "bound") and t.get("lower_bound_us")
              and t.get("peak_memory_bytes")]
        if pr:
            ax.scatter([t["peak_memory_bytes"] / gib for t in pr], [t["lower_bound_us"] / 1e3 for t in pr],
                       facecolors="none", edgecolors="0.7", s=14, label=f"pruned by the bound ({len(pr)}, at it)")
        ok = [t for t in self.trials if t["status"] == "replayed"]
        if ok:
            x = np.array([t["peak_memory_bytes"] / gib for t in ok])
            y = np.array([t["step_time_us"] / 1e3 for t in ok])
            ax.scatter(x, y, s=16, color="tab:blue", label=f"replayed ({len(ok)})")
            order = np.lexsort((y, x))
            front, best = [], INF
            for i in order:
                if y[i] < best:
                    front.append(i)
                    best = y[i]
            ax.plot(x[front], y[front], "-o", color="tab:red", ms=4, label="Pareto front (replayed)")
            b = self.best
            if b is not None:
                ax.annotate(plan_label(b["plan"]), (b["peak_memory_bytes"] / gib, b["step_time_us"] / 1e3),
                            fontsize=7, xytext=(5, 5), textcoords="offset points")
        if self.context.memory_bytes:
            n_mem = self.count("memory")
            ax.axvline(self.context.memory_bytes / gib, color="0.4", ls="--", lw=1,
                       label=f"device memory ({n_mem} plans over it)")
        ax.set_xlabel("peak memory per GPU (GiB)")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{self.context.model} on {self.context.gpus:,} GPUs ({self.context.system or 'H100'})", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return Path(path)

    def emit_best(self, outdir: str | Path, progress: bool = False) -> dict[str, Any]:
        """Write the best plan's Chakra traces (every rank) to ``outdir``."""
        from ettools.converters.symbolic import synthesize, write_synth

        b = self.best
        if b is None:
            raise ValueError("no plan was replayed: nothing to emit")
        res = synthesize(self.context.model, materialize=False, **synth_kwargs(self.context, b["plan"]))
        return write_synth(res, outdir, name="best", progress=progress)


def _objective_value(t: dict[str, Any], objective: str) -> float:
    if objective == "memory":
        return float(t["peak_memory_bytes"])
    return float(t["step_time_us"])  # tokens/s/GPU and MFU are monotone in it


def search(model: str, gpus: int, *, batch: int, space: Space | None = None, dims: dict[str, int] | None = None,
           seq: int | None = None, dtype: str = "bf16", system: str | None = None, network: str | None = None,
           collectives: str | None = None, timing: str = "measured", objective: str = "step_time",
           time_bound_us: float | None = None, top: int = 5, strategy: str = "exhaustive",
           trials: int | None = None, seed: int = 0, backend: str = "local", workers: int = 2,
           address: str | None = None, cache_dir: str | Path | None = "default", prune: bool = True,
           memory_gib: float | None = None, progress: bool = True) -> SearchResult:
    """Search the parallel plans of ``model`` on ``gpus`` GPUs of ``system`` (see the module docstring).

    ``space``: the values per axis (default :data:`.space.DEFAULTS`). ``cache_dir``: ``"default"``
    (:func:`.cache.default_cache_dir`), a directory, or None (no cache). ``prune=False`` replays every
    valid plan that fits in memory (the bound is off; memory pruning stays: an OOM plan is never
    replayed). ``memory_gib`` overrides the device memory. Returns a :class:`SearchResult`.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} ({', '.join(OBJECTIVES)})")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} ({', '.join(STRATEGIES)})")
    if objective == "memory" and not time_bound_us:
        raise ValueError("the memory objective needs a time bound (--time-bound MS)")
    if strategy != "exhaustive" and not trials:
        raise ValueError(f"strategy {strategy} needs a trial budget (--trials N)")
    from ..api import _timing

    _timing(timing)  # an unknown timing (or a missing fit) is refused here, not as a KeyError in a worker
    t0 = time.perf_counter()
    space = space or Space()
    ctx, resolved = make_context(model, gpus, dims=dims, batch=batch, seq=seq, dtype=dtype, system=system,
                                 network=network, collectives=collectives, timing=timing, memory_gib=memory_gib)
    cache = TrialCache(default_cache_dir() if cache_dir == "default" else cache_dir, ctx.key())
    result = SearchResult(ctx, objective, max(int(top), 1), strategy=strategy,
                          cache_path=str(cache.path) if cache.path else None)
    plans = list(space.canonical_plans(gpus))
    loop = _Loop(ctx, result, cache, resolved, objective, time_bound_us, prune)
    engine = make_engine(ctx, backend, workers, address)
    finished = False
    try:
        if strategy == "exhaustive":
            loop.run_ordered(plans, engine, progress)
        elif strategy == "random":
            rng = np.random.default_rng(seed)
            pick = rng.permutation(len(plans))[: int(trials)]
            loop.run_ordered([plans[i] for i in sorted(pick.tolist())], engine, progress)
        else:
            loop.run_optuna(plans, space, engine, int(trials), strategy, seed, progress)
        finished = True
    finally:
        # interrupted (SIGINT/SIGTERM, an error): stop the workers now, not after their trials
        engine.close(abort=not finished)
        cache.close()
    result.cache_hits = cache.hits
    if loop.work is not None:
        result.stage_work = dict(loop.work.stats)
    # trials in a stable order (the plan key), ranks on the ranked ones
    result.trials.sort(key=lambda t: t["key"])
    for i, t in enumerate(result.ranked, 1):
        t["rank"] = i
    result.seconds = time.perf_counter() - t0
    return result


class _Loop:
    """Book-keeping shared by the strategies: thresholds, recording, the engine pump."""

    def __init__(self, ctx: Context, result: SearchResult, cache: TrialCache, dims: dict[str, int],
                 objective: str, time_bound_us: float | None, prune: bool) -> None:
        self.ctx, self.result, self.cache, self.dims = ctx, result, cache, dims
        self.objective, self.time_bound, self.prune = objective, time_bound_us, prune
        self.k = result.top
        self.best_k: list[float] = []  # max-heap (negated) of the K best objective values
        self.seen: set[str] = set()
        self.state_oom: dict[str, str] = {}  # state key -> the plan whose resident state alone is OOM
        # stage bounds before synthesis (also handed to the trial, which then need not time its graph)
        self.work = StageWork(ctx) if prune else None
        self.bar = None

    # thresholds ------------------------------------------------------------------------------
    def threshold(self) -> float:
        """The step time a plan must beat to matter (INF until K plans are known)."""
        if not self.prune:
            return INF
        if self.objective == "memory":
            return float(self.time_bound)
        return -self.best_k[0] if len(self.best_k) >= self.k else INF

    def memory_threshold(self) -> float:
        """Under the memory objective: the peak a plan must beat."""
        if not self.prune or self.objective != "memory" or len(self.best_k) < self.k:
            return INF
        return -self.best_k[0]

    # recording -------------------------------------------------------------------------------
    def record(self, key: str, trial: dict[str, Any], cached: bool = False) -> None:
        t = dict(trial)
        t["key"] = key
        t["cached"] = cached
        t.setdefault("reason", None)
        res_b = t.get("resident_bytes")
        if res_b and self.ctx.memory_bytes and res_b > self.ctx.memory_bytes:
            self.state_oom.setdefault(state_key(t["plan"]), plan_label(t["plan"]))
        if t["status"] == "replayed":
            if self.objective == "memory":
                t["feasible"] = t["step_time_us"] <= self.time_bound
            lb = t.get("lower_bound_us")
            if lb is not None and t["step_time_us"] < lb * (1 - 1e-9):
                self.result.bound_violations += 1
            if t.get("feasible", True):
                v = _objective_value(t, self.objective)
                if len(self.best_k) < self.k:
                    heapq.heappush(self.best_k, -v)
                elif v < -self.best_k[0]:
                    heapq.heapreplace(self.best_k, -v)
        self.result.trials.append(t)
        if self.bar is not None:
            self.bar.update(1)
            b = self.result  # cheap counters only: the bar refreshes often
            best = (-max(self.best_k) if self.best_k else None)
            self.bar.set_postfix_str(
                f"replayed {b.count('replayed')} pruned {len(b.trials) - b.count('replayed')}"
                + (f" best {best / 1e3:,.1f} ms" if best is not None and self.objective != "memory" else ""),
                refresh=False)

    def collect(self, engine: Any) -> list[tuple[str, dict[str, Any]]]:
        done = engine.wait()
        for key, trial in done:
            self.cache.put(key, trial)
            self.record(key, trial)
        return done

    def try_plan(self, plan: dict[str, Any], engine: Any) -> str | None:
        """Prune or submit one plan; the status it ended with when decided here, else None."""
        key = plan_key(plan)
        if key in self.seen:
            return "duplicate"
        self.seen.add(key)
        why = invalid_reason(plan, self.ctx.gpus, self.ctx.batch, self.dims)
        if why is not None:
            self.record(key, {"plan": plan, "status": "invalid", "reason": why})
            return "invalid"
        hit = self.cache.get(key)
        thr = self.threshold()
        if hit is not None and hit["status"] in ("invalid", "memory", "replayed"):
            self.record(key, hit, cached=True)
            return hit["status"]
        proof = self.state_oom.get(state_key(plan))
        if proof is not None:
            # the synthesizer's resident state of a sibling (same degrees, ZeRO stage, chunks,
            # buckets) already exceeds the device: activations only add to it
            self.record(key, {"plan": plan, "status": "memory",
                              "reason": f"weights, gradients and optimizer states alone exceed the device ({proof})"})
            return "memory"
        lb0 = closed_form_bound(self.ctx, plan)
        if lb0 >= thr:
            self.record(key, {"plan": plan, "status": "bound", "lower_bound_us": lb0,
                              "reason": f"closed-form bound {lb0 / 1e3:.1f} ms >= {thr / 1e3:.1f} ms"})
            return "bound"
        if hit is not None and hit["status"] == "bound":
            lb = hit.get("lower_bound_us") or 0.0
            mem_thr = self.memory_threshold()
            if lb >= thr or hit.get("peak_memory_bytes", 0) >= mem_thr:
                self.record(key, hit, cached=True)
                return "bound"
        fig = self.work.figures(plan) if self.work is not None else None
        lb = None
        if fig is not None:
            # the trial's own first checks, in its order (memory, then the bound), on the same
            # figures the synthesized plan would give: a plan they prune is never synthesized
            peak, lb = max(fig.peak_memory), fig.bound_us
            early = {"plan": plan, "peak_memory_bytes": peak, "resident_bytes": max(fig.resident),
                     "synthesized": False}
            mem = self.ctx.memory_bytes
            if mem and peak > mem:
                self.record(key, {**early, "status": "memory",
                                  "reason": f"peak {peak / 2**30:.1f} GiB per GPU > {mem / 2**30:.1f} GiB"})
                return "memory"
            if lb >= thr:
                self.record(key, {**early, "status": "bound", "lower_bound_us": lb,
                                  "reason": f"lower bound {lb / 1e3:.1f} ms >= {thr / 1e3:.1f} ms (not synthesized)"})
                return "bound"
        engine.submit(plan, thr, lb)
        return None

    # strategies ------------------------------------------------------------------------------
    def run_ordered(self, plans: list[dict[str, Any]], engine: Any, progress: bool) -> None:
        """Visit ``plans`` in closed-form-bound order (branch and bound)."""
        from ettools.progress import bar

        self.bar = bar(len(plans), "search", unit="plan") if progress else None
        order = sorted(plans, key=lambda p: (closed_form_bound(self.ctx, p), plan_key(p)))
        i = 0
        while i < len(order) or engine.in_flight():
            while i < len(order) and engine.in_flight() < engine.capacity:
                self.try_plan(order[i], engine)
                i += 1
            if engine.in_flight():
                self.collect(engine)
        if self.bar is not None:
            self.bar.close()

    def run_optuna(self, plans: list[dict[str, Any]], space: Space, engine: Any, budget: int, strategy: str,
                   seed: int, progress: bool) -> None:
        """Optuna's TPE or CMA-ES over per-axis value indices, ``budget`` distinct plans at most."""
        try:
            import optuna
        except ImportError:
            raise RuntimeError(f"strategy {strategy} needs Optuna: pip install 'ettools[search]' "
                               f"(or use --strategy random)") from None
        from ettools.progress import bar

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = (optuna.samplers.TPESampler(seed=seed) if strategy == "tpe"
                   else optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False))
        study = optuna.create_study(direction="minimize", sampler=sampler)
        in_space = {plan_key(p) for p in plans}
        axes = [a for a, v in space.values.items() if len(v) > 1]
        budget = min(budget, len(plans))
        self.bar = bar(budget, "search", unit="plan") if progress else None
        waiting: dict[str, list[Any]] = {}  # plan key -> optuna trials told when it finishes
        asks = 0
        while (len(self.seen) < budget or engine.in_flight()) and asks < 50 * budget:
            while len(self.seen) < budget and engine.in_flight() < engine.capacity and asks < 50 * budget:
                ot = study.ask()
                asks += 1
                raw = {a: space.values[a][0] for a in space.values}
                for a in axes:
                    raw[a] = space.values[a][ot.suggest_int(a, 0, len(space.values[a]) - 1)]
                n = raw["tp"] * raw["cp"] * raw["pp"]
                plan = canonical({**raw, "dp": self.ctx.gpus // n if self.ctx.gpus % n == 0 else self.ctx.gpus / n})
                key = plan_key(plan)
                if key not in in_space:
                    study.tell(ot, state=optuna.trial.TrialState.PRUNED)
                    continue
                if key in self.seen:
                    prev = next((t for t in self.result.trials if t["key"] == key), None)
                    if prev is None:
                        waiting.setdefault(key, []).append(ot)
                    else:
                        self._tell(study, ot, prev)
                    continue
                status = self.try_plan(plan, engine)
                if status is None:
                    waiting.setdefault(key, []).append(ot)
                else:
                    self._tell(study, ot, self.result.trials[-1])
            if engine.in_flight():
                for key, _trial in self.collect(engine):
                    for ot in waiting.pop(key, []):
                        self._tell(study, ot, self.result.trials[-1] if self.result.trials[-1]["key"] == key
                                   else next(t for t in self.result.trials if t["key"] == key))
            elif len(self.seen) >= budget:
                break
        for key, ots in waiting.items():
            t = next((x for x in self.result.trials if x["key"] == key), None)
            for ot in ots:
                self._tell(study, ot, t)
        if self.bar is not None:
            self.bar.close()

    def _tell(self, study: Any, ot: Any, trial: dict[str, Any] | None) -> None:
        import optuna

        if trial is not None and trial["status"] == "replayed" and trial.get("feasible", True):
            study.tell(ot, _objective_value(trial, self.objective))
        else:
            study.tell(ot, state=optuna.trial.TrialState.PRUNED)
