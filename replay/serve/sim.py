"""``ettools serve``: a serving simulation on top of the replay.

The GPUs are split into engines of ``tp × pp × ep`` GPUs (one model instance each; with ``ep`` > 1
the attention runs data-parallel over the ``ep`` ranks and the MoE layers expert-parallel);
requests go to the engines round-robin in arrival order and each engine runs its scheduler
(:mod:`.engine`) with iteration times from replays of synthesized steps (:mod:`.cost`) and a KV
cache of ``kv_fraction`` of the memory its GPUs have left after their weights.

Prefill/decode disaggregation (``prefill_gpus``): the first ``prefill_gpus`` GPUs form prefill
engines (a request leaves them with its first token), the rest decode engines; between the two
the prompt's KV cache (prompt tokens × KV bytes per token of the whole model) crosses the network
— each of the engine's GPUs sends its own share (the rank's KV bytes per token × prompt tokens) at
the same time, timed by the replay's network model (the hardware's default network unless one is
given) from the first prefill GPU to the first decode GPU; the decode engine then needs KV blocks
for the prompt.

Prefix caching (``prefix_caching``, on by default as in vLLM and SGLang): requests whose workload
names a shared prefix skip its cached blocks (:mod:`.engine`); the JSON's ``prefix_cache`` gives
the prompt tokens served from the cache, the hit rate over all prompt tokens and so the prefill
saved.

Routing (``routing``, :mod:`.routing`): round-robin (the default), least estimated backlog, or
prefix-aware (a prefix group's requests on one engine, so its cache is shared); a disaggregated
decode pool routes by least backlog unless round-robin.

Metrics (:class:`ServeResult`): TTFT (arrival → first token), TPOT ((finish − first token) /
(output tokens − 1)), end-to-end latency, throughput and goodput (requests meeting ``slo_ttft_ms``
and ``slo_tpot_ms`` per second), preemptions, KV-cache utilization over time, and the mean number of
requests in the system measured as the time average of the count of arrived, unfinished requests
over the arrival window (so Little's law ``L = λ·W`` can be checked against it).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .cost import StepCost, host_overhead
from .engine import EngineConfig, EngineResult, run_engine
from .routing import route
from .workload import Workload


def _pct(x: np.ndarray, keys=("p50", "p90", "p99"), mean: bool = True) -> dict[str, float | None]:
    x = x[np.isfinite(x)]
    out: dict[str, float | None] = {}
    if mean:
        out["mean"] = float(x.mean()) if len(x) else None
    for k in keys:
        out[k] = float(np.percentile(x, int(k[1:]))) if len(x) else None
    return out


@dataclass
class ServeResult:
    """Per-request times (s) and what the engines did."""

    workload: Workload
    first_s: np.ndarray
    finish_s: np.ndarray
    engines: list[EngineResult]
    kv_capacity_blocks: int
    block_tokens: int
    engine: dict[str, Any]
    options: dict[str, Any]
    kv_transfer_bytes: float = 0.0
    kv_transfer_s: np.ndarray | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ttft_s(self) -> np.ndarray:
        """Arrival → first token."""
        return self.first_s - self.workload.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        """Arrival → last token."""
        return self.finish_s - self.workload.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Mean time between output tokens after the first (NaN for one-token outputs)."""
        o = self.workload.output.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(o > 1, (self.finish_s - self.first_s) / (o - 1), np.nan)

    def mean_in_system(self) -> float:
        """Time-average over the arrival window [0, last arrival] of the requests arrived and not finished."""
        a = self.workload.arrival_s
        d = float(a.max()) if len(a) else 0.0
        if d <= 0:
            return 0.0
        held = np.isfinite(self.finish_s)  # a rejected request never entered the system
        return float((np.minimum(self.finish_s[held], d) - np.minimum(a[held], d)).clip(min=0).sum() / d)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (the issue's keys, plus goodput, iterations, KV and the engine)."""
        w = self.workload
        ok = np.isfinite(self.finish_s)
        start = float(w.arrival_s.min()) if len(w) else 0.0
        span = float(self.finish_s[ok].max() - start) if ok.any() else 0.0
        ttft_ms, tpot_ms, e2e_ms = self.ttft_s * 1e3, self.tpot_s * 1e3, self.e2e_s * 1e3
        out: dict[str, Any] = {
            "requests": int(len(w)),
            "rejected": int(self.options.get("rejected") or 0),
            "ttft_ms": _pct(ttft_ms), "tpot_ms": _pct(tpot_ms), "e2e_ms": _pct(e2e_ms),
            "throughput_rps": float(ok.sum() / span) if span > 0 else 0.0,
            "tokens_per_s": float(w.output[ok].sum() / span) if span > 0 else 0.0,
            "preemptions": int(sum(e.preemptions for e in self.engines)),
            "mean_in_system": self.mean_in_system(),
        }
        slo_t, slo_p = self.options.get("slo_ttft_ms"), self.options.get("slo_tpot_ms")
        good = ok.copy()
        if slo_t is not None:
            good &= ttft_ms <= slo_t
        if slo_p is not None:
            good &= ~(tpot_ms > slo_p)
        out["goodput_rps"] = float(good.sum() / span) if span > 0 else 0.0
        out["slo_attainment"] = float(good.mean()) if len(w) else None
        out["iterations"] = int(sum(e.iterations for e in self.engines))
        out["decode_iterations"] = int(sum(e.decode_iterations for e in self.engines))
        out["prefill_iterations"] = int(sum(e.prefill_iterations for e in self.engines))
        util = [e.kv_used / max(self.kv_capacity_blocks, 1) for e in self.engines if len(e.kv_used)]
        # a step function: each sample's use holds until the next sample (an iteration's start holds
        # what it runs with, its end what is left), over each engine's span from 0
        times = [np.diff(np.concatenate([e.kv_time, e.kv_time[-1:]])) for e in self.engines if len(e.kv_used)]
        span_us = sum(float(e.kv_time[-1]) for e in self.engines if len(e.kv_used))
        mean_u = (float(sum((u * dt).sum() for u, dt in zip(util, times)) / max(span_us, 1e-12)) if util else 0.0)
        out["kv"] = {"capacity_tokens_per_engine": int(self.kv_capacity_blocks * self.block_tokens),
                     "block_tokens": self.block_tokens, "mean_utilization": mean_u,
                     "peak_utilization": float(max((u.max() for u in util), default=0.0))}
        if self.workload.prefix is not None:
            hit = int(sum(e.prefix_hit_tokens for e in self.engines))
            prompt = int(w.prompt[ok].sum()) if ok.any() else 0
            out["prefix_cache"] = {"enabled": bool(self.options.get("prefix_caching")), "hit_tokens": hit,
                                   "prompt_tokens": prompt, "shared_tokens": int(w.prefix[ok].sum()),
                                   "hit_rate": hit / prompt if prompt else 0.0}
        out["kv_transfer_bytes"] = float(self.kv_transfer_bytes)
        if self.kv_transfer_s is not None and len(self.kv_transfer_s):
            out["kv_transfer_ms"] = _pct(self.kv_transfer_s * 1e3)
        out["span_s"] = span
        out["engine"] = self.engine
        out["options"] = self.options
        out["seconds"] = {k: round(v, 3) for k, v in self.seconds.items()}
        return out

    def summary_text(self) -> str:
        """A few human lines."""
        j = self.to_json()
        e = j["engine"]

        def f(d: dict[str, Any]) -> str:
            return " / ".join("-" if d[k] is None else f"{d[k]:.1f}" for k in ("p50", "p90", "p99"))

        lines = [
            f"{j['requests']:,} requests on {self.options['engines']} engine(s) of {e['gpus']} GPU(s) "
            f"({e['model']}, tp {e['tp']} pp {e['pp']} ep {e['ep']}, {self.options['scheduler']} batching"
            + (f"; closed loop of {self.options['concurrency']} clients" if "concurrency" in self.options else "")
            + ")",
            f"TTFT ms p50/p90/p99 {f(j['ttft_ms'])}; TPOT ms {f(j['tpot_ms'])}; E2E ms {f(j['e2e_ms'])}",
            f"throughput {j['throughput_rps']:.2f} req/s, {j['tokens_per_s']:,.0f} output tokens/s; "
            f"goodput {j['goodput_rps']:.2f} req/s; mean in system {j['mean_in_system']:.2f}",
            f"KV cache {j['kv']['capacity_tokens_per_engine']:,} tokens per engine, utilization mean "
            f"{100 * j['kv']['mean_utilization']:.1f} % peak {100 * j['kv']['peak_utilization']:.1f} %; "
            f"preemptions {j['preemptions']:,}; iterations {j['iterations']:,}",
        ]
        h = e.get("host_overhead") or {}
        if h:
            lines.append(f"host overhead per iteration {h.get('const_us', 0.0) / 1e3:.3f} ms + "
                         f"{h.get('per_seq_us', 0.0):.1f} us per sequence ({h.get('source', '?')}; "
                         "--host-overhead-ms to change)")
        if e.get("step_costs"):
            lines.append(f"step costs: {e['step_costs']}")
        lines += [f"note: {n}" for n in e.get("notes", ())]
        store = [f"{k} {e[k]}" for k in ("kv_dtype", "weight_dtype") if e.get(k) and e[k] != self.options.get("dtype")]
        if store:
            lines.append("storage: " + ", ".join(store))
        if not e.get("cuda_graphs", True):
            lines.append(f"eager (no CUDA graphs): each iteration's device part at least the host's launches, "
                         f"{e['eager_launch_us'] / 1e3:.2f} ms ({e['eager_launch_source']})")
        if "prefill" in e:
            p = e["prefill"]
            lines.append(f"prefill pool: {self.options['prefill_gpus']} GPU(s) of {p['system']}, engines of tp {p['tp']} "
                         f"pp {p['pp']} ep {p['ep']}; decode pool: the rest")
        if j["rejected"]:
            lines.append(f"rejected on arrival: {j['rejected']:,} request(s) whose prompt + output exceed the "
                         f"max model length {self.options['max_model_len']:,} (not in the latencies above)")
        pc = j.get("prefix_cache")
        if pc is not None:
            lines.append(f"prefix cache {'on' if pc['enabled'] else 'off'}: {pc['hit_tokens']:,} of "
                         f"{pc['prompt_tokens']:,} prompt tokens served from it ({100 * pc['hit_rate']:.1f} %; "
                         f"shared by their groups: {pc['shared_tokens']:,})")
        if j["kv_transfer_bytes"]:
            lines.append(f"KV transferred prefill → decode: {j['kv_transfer_bytes'] / 1e9:.2f} GB")
        lines.append(f"simulated in {sum(self.seconds.values()):.2f} s ({j['engine'].get('replays', 0)} step replays)")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """Latency CDFs (TTFT, TPOT, E2E) and KV-cache use over time of engine 0, as a PNG."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 4, figsize=(18, 4))
        for a, (name, x) in zip(ax[:3], (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2E", self.e2e_s))):
            x = np.sort(x[np.isfinite(x)] * 1e3)
            if len(x):
                a.plot(x, np.arange(1, len(x) + 1) / len(x))
            a.set_xlabel(f"{name} (ms)")
            a.set_ylabel("fraction of requests")
            a.grid(alpha=0.3)
        e = next((e for e in self.engines if len(e.kv_used)), None)
        if e is not None:
            step = max(1, len(e.kv_time) // 5000)
            ax[3].plot(e.kv_time[::step] / 1e6, 100 * e.kv_used[::step] / max(self.kv_capacity_blocks, 1))
        ax[3].set_xlabel("time (s)")
        ax[3].set_ylabel("KV cache used (%)")
        ax[3].grid(alpha=0.3)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def simulate_serving(
    model: str | Path,
    workload: Workload,
    *,
    gpus: int = 1,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    system: str | Path | dict[str, Any] = "H100",
    network: str | Path | dict[str, Any] | None = None,
    dims: dict[str, int] | None = None,
    dtype: str = "bf16",
    scheduler: str = "continuous",
    token_budget: int = 8192,
    max_seqs: int = 256,
    block_tokens: int = 16,
    kv_fraction: float = 0.9,
    kv_tokens: int | None = None,
    spec_tokens: int = 1,
    acceptance: float = 1.0,
    draft_model: str | None = None,
    prefill_gpus: int | None = None,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    seed: int = 0,
    timing: str = "measured",
    cost: StepCost | None = None,
    prefill_cost: StepCost | None = None,
    host_overhead_ms: float | None = None,
    host_per_seq_us: float | None = None,
    max_model_len: int | None = None,
    prefix_caching: bool = True,
    kv_dtype: str | None = None,
    weight_dtype: str | None = None,
    cuda_graphs: bool = True,
    prefill_system: str | Path | dict[str, Any] | None = None,
    prefill_tp: int | None = None,
    routing: str = "round-robin",
    engine: str | None = None,
    concurrency: int | None = None,
) -> ServeResult:
    """Simulate serving ``workload`` (see the module docstring). ``kv_tokens`` overrides the KV
    capacity per engine (tokens); ``cost`` reuses a :class:`StepCost` (its replays are cached);
    ``prefill_cost`` (with ``prefill_gpus``) gives the prefill pool its own engine plan (its
    ``tp``/``pp``/``ep``), the decode pool keeping ``cost``'s. ``host_overhead_ms`` /
    ``host_per_seq_us`` replace the per-iteration host overhead of every engine (the cost's own:
    its serving fit's, else :data:`.cost.DEFAULT_HOST`). ``max_model_len``: a request whose prompt
    plus output tokens exceed it is rejected on arrival, as engines refuse it (it gets no first
    token and no finish; counted as ``rejected``). ``prefix_caching``: reuse the cached blocks of
    the workload's shared prefixes (see the module docstring). ``kv_dtype``, ``weight_dtype`` and
    ``cuda_graphs`` configure the engines' step costs (:class:`.cost.StepCost`); with
    ``prefill_gpus``, ``prefill_system`` and ``prefill_tp`` give the prefill pool another GPU type
    and tensor parallelism (mixed pools; the KV transfer runs on ``network``, else the decode
    system's network). ``network`` (an ASTRA-sim network YAML or a fit of measured collective tables,
    ``ettools calibrate --network``) also times every engine's collectives in place of the
    hardware's default network. ``routing``: how requests are spread over the engines (:mod:`.routing`).
    ``engine`` (``vllm``, ``sglang``): the host overhead measured on that engine's real traces
    (:data:`.cost.ENGINE_HOST`) instead of all engines' (ignored with a given ``cost``).
    ``concurrency`` C: a closed loop of C clients instead of the workload's arrival times, as
    genai-perf and ``vllm bench serve --max-concurrency`` load an engine: client j sends requests
    j, j + C, … of the workload, each the moment its previous one finishes; its first request at
    the workload's arrival time of request j. Clients are spread over the engines in turn (client j
    on engine j mod engines); the result's workload carries the arrival times the clients made."""
    t0 = time.perf_counter()
    engine_kw = {"dims": dims, "dtype": dtype, "timing": timing, "kv_dtype": kv_dtype, "weight_dtype": weight_dtype,
                 "cuda_graphs": cuda_graphs, "network": network, "engine": engine}
    if cost is None:
        cost = StepCost(model, tp=tp, pp=pp, ep=ep, system=system, **engine_kw)
    if (prefill_system is not None or prefill_tp is not None) and prefill_cost is None:
        if not prefill_gpus:
            raise ValueError("prefill_system and prefill_tp configure the prefill pool: give prefill_gpus too")
        prefill_cost = StepCost(model, tp=prefill_tp or tp, pp=pp, ep=ep,
                                system=prefill_system if prefill_system is not None else system, **engine_kw)
    eg = cost.gpus  # a given cost carries its engine's plan
    draft = (StepCost(draft_model, tp=tp, pp=1, ep=1, system=system, dtype=dtype, timing=timing, engine=engine)
             if draft_model else None)
    pcost = prefill_cost if (prefill_cost is not None and prefill_gpus) else cost
    if host_overhead_ms is not None or host_per_seq_us is not None:
        def rehost(c: StepCost) -> StepCost:
            # a shallow copy shares the replay caches; only its host model differs from the caller's
            c = copy.copy(c)
            c.host = host_overhead(host_overhead_ms, host_per_seq_us, c.host)
            return c

        same = pcost is cost
        cost = rehost(cost)
        pcost = cost if same else rehost(pcost)
        draft = rehost(draft) if draft is not None else None

    def blocks(c: StepCost) -> int:
        if kv_tokens is not None:
            cap_tokens = int(kv_tokens)
        else:
            if not 0 < kv_fraction <= 1:
                raise ValueError("kv_fraction must be within (0, 1]")
            cap_tokens = c.kv_capacity_tokens(kv_fraction)
        b = cap_tokens // block_tokens
        if b < 1:
            raise ValueError(f"no room for the KV cache: weights take {c.weights_bytes / 2**30:.1f} GiB of "
                             f"{c.memory_bytes / 2**30:.1f} GiB per GPU (more tp/pp, or a smaller model)")
        return b

    cap_blocks = blocks(cost)
    pre_blocks = blocks(pcost) if pcost is not cost else cap_blocks
    t1 = time.perf_counter()

    def engine_cfg(role: str, k: int, clients: int = 0) -> EngineConfig:
        return EngineConfig(policy=scheduler, token_budget=token_budget, max_seqs=max_seqs, block_tokens=block_tokens,
                            kv_blocks=pre_blocks if role == "prefill" else cap_blocks,
                            spec_tokens=spec_tokens if role != "prefill" else 1,
                            acceptance=acceptance, draft_cost=draft, role=role, seed=seed + k, clients=clients)

    n = len(workload)
    arr_us = workload.arrival_s * 1e6

    def prefix_of(idx: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        return workload.subset(idx) if prefix_caching else (None, None)

    def spread(ids: np.ndarray, at_us: np.ndarray, n_engines: int, c: StepCost, policy: str) -> list[np.ndarray]:
        """The requests ``ids`` (ascending ``at_us``) of each of ``n_engines`` engines."""
        grp = workload.group[ids] if workload.group is not None else None
        eng = route(at_us[ids], workload.prompt[ids], workload.output[ids], n_engines, policy, c, grp)
        return [ids[eng == k] for k in range(n_engines)]

    admitted = np.arange(n) if max_model_len is None else \
        np.flatnonzero(workload.prompt + workload.output <= int(max_model_len))
    if len(admitted):
        # a request whose KV blocks exceed an engine's whole cache is never admitted (or is preempted
        # forever): the engine loop would not end. Refused here, naming the way out.
        longest = int((workload.prompt[admitted] + workload.output[admitted]).max())
        need = -(-(longest + 1) // block_tokens)
        if need > min(cap_blocks, pre_blocks):
            raise ValueError(f"a request of {longest:,} tokens needs {need:,} KV blocks of {block_tokens} tokens; "
                             f"an engine's cache holds {min(cap_blocks, pre_blocks):,}: it could never run "
                             "(--max-model-len rejects such requests; or more KV: --kv-tokens, --kv-fraction, tp/pp)")
    first = np.full(n, np.nan)
    fin = np.full(n, np.nan)
    results: list[EngineResult] = []
    xfer_bytes = 0.0
    xfer_s = None
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if prefill_gpus or routing != "round-robin":
            raise ValueError("a closed loop (concurrency) is modelled on colocated engines with clients spread "
                             "in turn: not with prefill_gpus or another routing")
    if concurrency is not None:
        n_eng = gpus // eg
        if n_eng < 1 or gpus % eg:
            raise ValueError(f"{gpus} GPUs do not make whole engines of tp×pp×ep = {eg}")
        arr_us = arr_us.copy()
        for k in range(n_eng):
            idx = admitted[k::n_eng]
            clients = len(range(k, int(concurrency), n_eng))
            if not len(idx) or not clients:
                continue
            # client j's first request at the workload's arrival of request j; later ones follow finishes
            start = np.maximum.accumulate(arr_us[idx])
            r = run_engine(start, workload.prompt[idx], workload.output[idx], cost, engine_cfg("both", k, clients),
                           *prefix_of(idx))
            arr_us[idx] = r.arrival
            first[idx] = r.first_token
            fin[idx] = r.finish
            results.append(r)
        workload = Workload(arr_us / 1e6, workload.prompt, workload.output, workload.prefix, workload.group)
    elif prefill_gpus:
        eg_p = pcost.gpus
        n_pre, n_dec = prefill_gpus // eg_p, (gpus - prefill_gpus) // eg
        if n_pre < 1 or n_dec < 1 or prefill_gpus % eg_p or (gpus - prefill_gpus) % eg:
            raise ValueError(f"prefill_gpus ({prefill_gpus}) must leave whole engines of {eg_p} (prefill) and "
                             f"{eg} (decode) GPUs out of {gpus}")
        pre_first = np.full(n, np.nan)
        for k, idx in enumerate(spread(admitted, arr_us, n_pre, pcost, routing)):
            r = run_engine(arr_us[idx], workload.prompt[idx], workload.output[idx], pcost, engine_cfg("prefill", k),
                           *prefix_of(idx))
            pre_first[idx] = r.finish
            results.append(r)
        from ettools.replay import compute as cm
        from ettools.replay.network import default_network, load_network, load_system

        net = (load_network(network, load_system(None)) if network is not None
               else default_network(gpus, cm.load_hardware(system, gpus)))
        per_rank = workload.prompt * pcost.kv_bytes_per_token_rank  # every GPU of the engine sends its share
        xfer_us = np.array([net.send_time(0, prefill_gpus, int(b)) for b in per_rank]) / 1e3
        xfer_bytes = float((workload.prompt * cost.kv_bytes_per_token).sum())
        xfer_s = xfer_us / 1e6
        ready = pre_first + xfer_us
        order = admitted[np.argsort(ready[admitted], kind="stable")]
        dec_routing = "round-robin" if routing == "round-robin" else "least-work"
        for k, idx in enumerate(spread(order, ready, n_dec, cost, dec_routing)):
            r = run_engine(ready[idx], workload.prompt[idx], workload.output[idx], cost, engine_cfg("decode", n_pre + k))
            fin[idx] = r.finish
            results.append(r)
        first = pre_first
        n_eng = n_pre + n_dec
    else:
        n_eng = gpus // eg
        if n_eng < 1 or gpus % eg:
            raise ValueError(f"{gpus} GPUs do not make whole engines of tp×pp×ep = {eg}")
        for k, idx in enumerate(spread(admitted, arr_us, n_eng, cost, routing)):
            r = run_engine(arr_us[idx], workload.prompt[idx], workload.output[idx], cost, engine_cfg("both", k),
                           *prefix_of(idx))
            first[idx] = r.first_token
            fin[idx] = r.finish
            results.append(r)
    t2 = time.perf_counter()
    desc = cost.describe()
    desc["replays"] = cost.replays + (draft.replays if draft else 0) + (pcost.replays if pcost is not cost else 0)
    if pcost is not cost:
        desc["prefill"] = {"tp": pcost.tp, "pp": pcost.pp, "ep": pcost.ep, "gpus": pcost.gpus,
                           "system": pcost.hw.name or str(pcost.system)}
    opts = {"scheduler": scheduler, "engines": n_eng, "dtype": dtype, "gpus": gpus, "token_budget": token_budget,
            "max_seqs": max_seqs, "kv_fraction": kv_fraction, "kv_tokens": kv_tokens, "spec_tokens": spec_tokens,
            "acceptance": acceptance, "draft_model": draft_model, "prefill_gpus": prefill_gpus,
            "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "timing": cost.timing,
            "host_overhead_us": cost.host["const_us"], "host_per_seq_us": cost.host["per_seq_us"], "system": str(system) if not isinstance(system, dict) else "custom",
            "max_model_len": max_model_len, "rejected": int(n - len(admitted)),
            "prefix_caching": bool(prefix_caching and workload.prefix is not None), "routing": routing,
            **({"concurrency": int(concurrency)} if concurrency is not None else {})}
    return ServeResult(workload, first / 1e6, fin / 1e6, results, cap_blocks, block_tokens, desc, opts,
                       xfer_bytes, xfer_s, {"setup_s": t1 - t0, "simulate_s": t2 - t1})
