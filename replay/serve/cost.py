"""Per-iteration cost of a serving engine, from replays of synthesized inference steps.

An engine is one model instance: ``tp`` × ``pp`` GPUs, times ``ep`` data-parallel attention
ranks whose MoE layers are split over the same ``ep`` ranks (attention-DP + EP). One iteration
processes ``n`` new tokens (decode tokens and prefill chunks together), attends over the contexts
of its sequences and projects the logits of the tokens that yield a next token. Its time is

    body(n) + head(n_logits) + α · Σ decode context + β · Σ prefill q·(c − q/2)

plus the engine's host time the GPU waits for, ``host_us(sequences)`` (:data:`DEFAULT_HOST`),
where ``body``/``head`` come from replays (:func:`ettools.replay.replay_trace`: the replay's
compute models for the hardware — fitted op models where the GPU has them, else the roofline —
and the hardware's network) of synthesized decode steps of ``n`` sequences at context 1 (``head``:
the replayed durations of the last module's nodes, the LM head), at geometric token buckets,
interpolated linearly between buckets and cached; ``body`` keeps the step's attention at context 1
(a decode-attention kernel's per-launch floor, paid by every iteration) and ``α`` is the slope of
the replayed attention time per cached token read (decode steps at a reference batch and at one and
two reference contexts: the kernels stream the cache, so the time is affine in it, and a slope
taken through zero would charge the floor once per cached token); ``β`` is the replayed attention
time per causal query-key pair of a prefill step. So every number is a replayed duration of the
synthesized step for that batch shape; only its split into pieces is interpolated.

Host overhead: a serving engine's host work per iteration (scheduler, input preparation, attention
metadata, launches, sampling, output processing) leaves the GPU idle unless the engine overlaps it
with the previous iteration. The replay of a synthesized step holds none of it, so each iteration
adds ``const_us + per_seq_us · sequences``: the GPU's wait for the host measured on real serving
traces (``device_wait_us`` of :func:`.steps.host_times`, fitted by :func:`.fit.fit_host`; ``ettools
calibrate --serving`` writes it into the fit, ``serve --host-overhead-ms`` overrides it).

Eager execution (``cuda_graphs=False``): without CUDA graphs the host launches every kernel of an
iteration itself, one PyTorch op at a time, and the GPU cannot run ahead of it; the device part of
an iteration is then at least the host's launch time, ``max(device, launch)`` (the host overhead
above still adds). The launch time is the sum, over the device ops of the busiest pipeline
stage's rank in the replayed step, of the host-cost table's per-op cost (``top_op_us`` +
``launch_op_us`` of the op's class: GEMM, attention or other; ``replay/data/host_costs.json``,
measured on real profiled traces — see :mod:`ettools.converters.emulate.host_fit`). Python outside
the ops is not counted (engines differ too much), so an eager prediction is a lower bound on
the host. With CUDA graphs (the default; what vLLM and SGLang run decode with) a whole iteration
is one graph launch and only the host overhead remains.

:func:`roofline_breakdown` classifies a graph's compute nodes as memory- or compute-bound.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ettools.graph import NodeType
from ettools.replay.devices import Hardware

# The GPU's per-iteration wait for the host when no calibration is given: ``fit_host`` (``ettools
# calibrate --serving``) on the four iterations of ../shared/traces/inference — SGLang Qwen3-8B
# decode (32 seqs, 656 µs) and prefill (15 seqs, 1,024 µs), vLLM GPT-OSS-20B decode (32 seqs, 0 µs)
# and mixed (46 seqs, 0 µs), MI300X, both engines overlapping host work with the GPU. No positive
# per-sequence trend across them, so the per-sequence term is 0. tests/test_serve_host.py
# recomputes it from the traces.
DEFAULT_HOST: dict[str, Any] = {"const_us": 420.1, "per_seq_us": 0.0,
                                "source": "calibrate --serving on ../shared/traces/inference (4 iterations)"}
# The same fit on one engine's iterations (``engine=``/``serve --engine``): vLLM's two iterations
# (full and piecewise CUDA graphs) keep the GPU fed (0 µs); SGLang's wait 656 and 1,024 µs (no
# positive per-sequence trend: their mean). tests/test_serve_host.py recomputes both.
ENGINE_HOST: dict[str, dict[str, Any]] = {
    "vllm": {"const_us": 0.0, "per_seq_us": 0.0,
             "source": "calibrate --serving on ../shared/traces/inference/vllm_mi300x_cudagraphs (2 iterations)"},
    "sglang": {"const_us": 840.2, "per_seq_us": 0.0,
               "source": "calibrate --serving on ../shared/traces/inference/sglang_qwen3_8b_mi300x (2 iterations)"},
}


def engine_host(engine: str | None) -> dict[str, Any]:
    """The host overhead measured on ``engine``'s real serving traces (:data:`ENGINE_HOST`), or
    on all of them (:data:`DEFAULT_HOST`) when ``engine`` is None."""
    if engine is None:
        return dict(DEFAULT_HOST)
    h = ENGINE_HOST.get(engine.lower())
    if h is None:
        raise ValueError(f"unknown engine {engine!r} (measured: {', '.join(sorted(ENGINE_HOST))})")
    return dict(h)


def host_overhead(const_ms: float | None = None, per_seq_us: float | None = None,
                  base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A host-overhead model: ``base`` (default :data:`DEFAULT_HOST`) with the given terms replaced."""
    h = dict(DEFAULT_HOST if base is None else base)
    if const_ms is not None:
        if const_ms < 0:
            raise ValueError("host overhead must be >= 0 ms")
        h["const_us"], h["source"] = float(const_ms) * 1e3, "given"
    if per_seq_us is not None:
        if per_seq_us < 0:
            raise ValueError("host overhead per sequence must be >= 0 us")
        h["per_seq_us"], h["source"] = float(per_seq_us), "given"
    return h


@lru_cache(maxsize=1)
def launch_costs() -> dict[str, Any]:
    """The shipped host-cost table (``replay/data/host_costs.json``)."""
    return json.loads(resources.files("ettools.replay").joinpath("data/host_costs.json").read_text())


def launch_host_us(graph: Any, rows: np.ndarray) -> float:
    """Host time of launching the device ops ``rows`` of ``graph`` one eager PyTorch op each: per op
    ``top_op_us`` + ``launch_op_us`` of its class (see :func:`launch_costs`)."""
    from ettools.replay.opfeatures import ATTENTION, GEMM, op_class

    t = launch_costs()
    per_class = t["launch_op_us"]
    names, counts = np.unique(graph.name[rows], return_counts=True)
    total = 0.0
    for i, c in zip(names.tolist(), counts.tolist()):
        k = op_class(graph.strings[i])
        cls = "gemm" if k == GEMM else "attention" if k == ATTENTION else "other"
        total += c * (float(t["top_op_us"]) + float(per_class[cls]))
    return total


_DEVICE_TYPES = [int(NodeType.COMP_NODE), int(NodeType.COMM_COLL_NODE), int(NodeType.COMM_SEND_NODE),
                 int(NodeType.COMM_RECV_NODE)]


def _span(res: Any) -> float:
    sc = res.schedule
    return float(sc.end.max() - sc.start.min()) if len(sc.end) else 0.0


def roofline_breakdown(graph: Any, hw: Hardware) -> dict[str, float]:
    """Roofline time of a rank's compute nodes split into memory-bound (bytes/bandwidth ≥
    FLOPs/peak) and compute-bound µs, and the bytes and FLOPs of each part."""
    from ettools.replay import compute as cm

    comp = (graph.type == int(NodeType.COMP_NODE)) & (graph.num_ops >= 0) & (graph.tensor_size >= 0)
    f = graph.num_ops[comp].astype(np.float64)
    b = graph.tensor_size[comp].astype(np.float64)
    tf = f / cm.peak_flops(hw) * 1e6
    tb = b / (float(hw.hbm_gbps) * 1e9) * 1e6
    mem = tb >= tf
    return {"memory_bound_us": float(tb[mem].sum()), "compute_bound_us": float(tf[~mem].sum()),
            "memory_bound_bytes": float(b[mem].sum()), "compute_bound_flops": float(f[~mem].sum()),
            "bytes": float(b.sum()), "flops": float(f.sum())}


class StepCost:
    """Iteration times of one engine (see the module docstring)."""

    def __init__(self, model: str | Path, *, tp: int = 1, pp: int = 1, ep: int = 1,
                 system: str | Path | dict[str, Any] = "H100", dims: dict[str, int] | None = None,
                 dtype: str = "bf16", ref_context: int = 2048, timing: str = "measured",
                 host: dict[str, Any] | None = None, kv_dtype: str | None = None,
                 weight_dtype: str | None = None, cuda_graphs: bool = True,
                 network: str | Path | dict[str, Any] | None = None, engine: str | None = None) -> None:
        from ettools.converters.symbolic.synth import resolve_model
        from ettools.replay import compute as cm

        self.model, self.dims, self.dtype = model, dict(dims or {}), dtype
        self.kv_dtype, self.weight_dtype, self.cuda_graphs = kv_dtype, weight_dtype, bool(cuda_graphs)
        # the engine's collectives on this network (a fit of measured tables, a system JSON, ...)
        # instead of the hardware's default one
        self.network = network
        self._launch: float | None = None
        self.tp, self.pp, self.ep = tp, pp, ep
        self.system = system
        # "measured": the replay's chain for synthesized steps (their estimates are dropped): the
        # GPU's fitted op models where they exist, the roofline last; "roofline": roofline only
        self.timing = timing
        # the host overhead: the given one, else the one measured on ``engine``'s traces (all engines')
        self.engine = engine
        self.host = host_overhead(base=host if host is not None else engine_host(engine))
        self.hw: Hardware = cm.load_hardware(system, tp * pp * ep)
        m, _, _, self.label = resolve_model(model)
        self.head_module = m.uses[-1].module
        self.gpus = tp * pp * ep
        self._bucket: dict[int, tuple[float, float]] = {}
        self.ref_context = ref_context
        self.replays = 0
        # memory: weights and KV bytes per token on the fullest rank, and of the whole model
        probe = self._synth("decode", ep, ref_context, ranks=self._stage_ranks())
        self.notes: list[str] = list(getattr(probe, "notes", None) or [])  # what the synthesis assumed
        self.weights_bytes = max(int(sg.resident_bytes) for sg in probe.stages.values())
        per_tok = [sg.kv_cache_bytes / ref_context for sg in probe.stages.values()]  # one sequence per rank
        self.kv_bytes_per_token_rank = max(per_tok)
        whole = self._synth("decode", 1, ref_context, tp=1, pp=1, ep=1, ranks=[0])
        self.kv_bytes_per_token = whole.stages[0].kv_cache_bytes / ref_context
        self.memory_bytes = int(self.hw.memory_bytes)
        self._alpha: float | None = None
        self._beta: float | None = None

    # ---- synthesis and replay --------------------------------------------------------------------
    def _stage_ranks(self) -> list[int]:
        per_stage = self.tp * self.ep
        return [s * per_stage for s in range(self.pp)]

    def _synth(self, phase: str, batch: int, context: int, seq: int | None = None, tp: int | None = None,
               pp: int | None = None, ep: int | None = None, ranks: list[int] | None = None):
        from ettools.converters.symbolic import synthesize

        tp = self.tp if tp is None else tp
        pp = self.pp if pp is None else pp
        ep = self.ep if ep is None else ep
        return synthesize(self.model, self.dims, dp=ep, tp=tp, pp=pp, ep=ep, phase=phase, batch=batch,
                          context=context, seq=seq, dtype=self.dtype, ranks=ranks, kv_dtype=self.kv_dtype,
                          weight_dtype=self.weight_dtype)

    def replay(self, phase: str, batch: int, context: int, seq: int | None = None) -> tuple[float, dict[str, float]]:
        """Replayed span (µs) of one synthesized step, and the replayed µs of its attention and
        LM-head nodes summed over one rank per pipeline stage (what one micro-batch passes);
        ``parts["launch"]``: the eager host launch time of the busiest stage's rank."""
        from ettools.replay.api import replay_trace

        r = self._synth(phase, batch, context, seq)
        res = replay_trace(r.trace, system=self.system, timing=self.timing, symmetric=True, memory=False,
                           network=self.network)
        self.replays += 1
        parts = {"attention": 0.0, "head": 0.0, "launch": 0.0}
        for rank in self._stage_ranks():
            a, z = res.rank_nodes(rank)
            g = res.built.preps[res.built.rep_of[rank]].graph
            dev_rows = np.flatnonzero(np.isin(g.type, _DEVICE_TYPES))
            parts["launch"] = max(parts["launch"], launch_host_us(g, dev_rows))
            dur = np.nan_to_num(res.built.program.dur[a:z])
            names = np.asarray(g.name)
            for key, test in (("attention", lambda s: s.startswith("attention ")),
                              ("head", lambda s, hm=self.head_module: f" {hm}." in s)):
                ids = [i for i in np.unique(names).tolist() if test(g.strings[i])]
                if ids:
                    parts[key] += float(dur[np.isin(names, ids) & (g.type == int(NodeType.COMP_NODE))].sum())
        return _span(res), parts

    def _tokens_bucket(self, n: int) -> tuple[float, float]:
        """(body µs, head µs) of a decode step of ``n`` sequences at context 1 (cached); the body
        keeps that step's attention: its kernels' floor, the part :attr:`alpha_us` does not scale."""
        hit = self._bucket.get(n)
        if hit is None:
            span, parts = self.replay("decode", n, 1)
            hit = self._bucket[n] = (span - parts["head"], parts["head"])
        return hit

    @staticmethod
    def buckets_around(n: float) -> tuple[int, int]:
        """The geometric buckets (1, 2, 3, 4, 6, 8, 12, 16, …) bracketing ``n``."""
        if n <= 1:
            return 1, 1
        k = math.floor(math.log2(n))
        lo = 1 << k
        mid = 3 << (k - 1) if k >= 1 else 1
        if n <= mid:
            return lo, mid
        return mid, lo << 1

    def _interp(self, n: float, which: int) -> float:
        if n <= 0:
            return 0.0
        a, b = self.buckets_around(n)
        ya = self._tokens_bucket(a)[which]
        if a == b:
            return ya
        yb = self._tokens_bucket(b)[which]
        return ya + (yb - ya) * (n - a) / (b - a)

    def body_us(self, n_tokens: float) -> float:
        """Replayed time of everything but attention and the LM head for ``n_tokens`` new tokens."""
        return self._interp(n_tokens, 0)

    def head_us(self, n_logits: float) -> float:
        """Replayed LM-head time for ``n_logits`` tokens (0 when none yields a token)."""
        return self._interp(n_logits, 1) if n_logits > 0 else 0.0

    @property
    def alpha_us(self) -> float:
        """Replayed decode attention µs per cached token read (one query token): the slope between
        decode steps at the reference context and twice it (the intercept, the kernels' floor, is
        in :meth:`body_us`)."""
        if self._alpha is None:
            b, c = 8 * self.ep, self.ref_context
            one = self.replay("decode", b, c)[1]["attention"]
            two = self.replay("decode", b, 2 * c)[1]["attention"]
            self._alpha = max(two - one, 0.0) / (b * c)
        return self._alpha

    @property
    def beta_us(self) -> float:
        """Replayed prefill attention µs per causal query-key pair (``q·(c − q/2)`` pairs)."""
        if self._beta is None:
            b, c = self.ep, self.ref_context
            _, parts = self.replay("prefill", b, c)
            self._beta = parts["attention"] / (b * c * c / 2)
        return self._beta

    @property
    def launch_us(self) -> float:
        """Eager mode: the host's time to launch one iteration's ops (0 with CUDA graphs)."""
        if self.cuda_graphs:
            return 0.0
        if self._launch is None:
            _, parts = self.replay("decode", self.ep, 1)
            self._launch = parts["launch"]
        return self._launch

    def host_us(self, n_seqs: float) -> float:
        """Host time the GPU waits for in an iteration of ``n_seqs`` sequences (0 when empty)."""
        return self.host["const_us"] + self.host["per_seq_us"] * n_seqs if n_seqs > 0 else 0.0

    def iteration_us(self, n_tokens: float, n_logits: float, decode_context: float, prefill_pairs: float,
                     n_seqs: float | None = None, floor: bool = True) -> float:
        """One iteration: ``n_tokens`` new tokens, ``n_logits`` of which yield a token, decode
        attention over ``decode_context`` cached tokens in all, ``prefill_pairs`` causal pairs, and
        the host overhead of its ``n_seqs`` sequences (default ``n_logits``). In eager mode the
        device part is at least :attr:`launch_us` (``floor=False``: the device part alone, affine
        in the context, for callers that apply the floor themselves)."""
        if n_tokens <= 0:
            return 0.0
        t = self.body_us(n_tokens) + self.head_us(n_logits)
        if decode_context:
            t += self.alpha_us * decode_context
        if prefill_pairs:
            t += self.beta_us * prefill_pairs
        if floor and not self.cuda_graphs:
            t = max(t, self.launch_us)
        return t + self.host_us(n_logits if n_seqs is None else n_seqs)

    def kv_capacity_tokens(self, kv_fraction: float) -> int:
        """Tokens of KV cache the engine holds: ``kv_fraction`` of each rank's memory left after its
        weights, divided by the rank's KV bytes per token, times the ``ep`` attention-DP ranks."""
        free = kv_fraction * max(self.memory_bytes - self.weights_bytes, 0)
        if self.kv_bytes_per_token_rank <= 0:
            return 1 << 40
        return int(free // self.kv_bytes_per_token_rank) * self.ep

    def step_cost_source(self) -> str:
        """Where the replayed step times come from: the hardware and, unless the roofline was asked
        for, which op models time its kernels (its own fit, classes borrowed from other GPUs)."""
        if self.timing == "roofline":
            return f"replays of synthesized steps on {self.hw.label}, roofline (data sheet)"
        from ettools.replay.api import op_model_origin
        from ettools.replay.opclass import DECODE_KEY
        from ettools.replay.opregistry import op_models_for

        models = op_models_for(self.hw)
        origin = op_model_origin(models, self.hw.preset or self.hw.label)
        if not any(m is not None and DECODE_KEY in m.classes for m in models):
            origin += "; decode attention by the memory class (no decode kernels measured on it or its vendor)"
        how = "no measured durations: every op by the op models" if self.timing == "measured" else f"timing {self.timing}"
        return f"replays of synthesized steps on {self.hw.label} ({how}); op models: {origin}"

    def describe(self) -> dict[str, Any]:
        """What the engine is: model, plan, memory figures, where its step times come from."""
        return {"model": self.label, "step_costs": self.step_cost_source(), "tp": self.tp, "pp": self.pp, "ep": self.ep, "gpus": self.gpus,
                "weights_bytes_per_gpu": self.weights_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_rank, "memory_bytes_per_gpu": self.memory_bytes,
                "host_overhead": dict(self.host), "kv_dtype": self.kv_dtype or self.dtype,
                "weight_dtype": self.weight_dtype or self.dtype, "cuda_graphs": self.cuda_graphs,
                **({"notes": list(self.notes)} if self.notes else {}),
                **({} if self.cuda_graphs else {"eager_launch_us": self.launch_us,
                                                "eager_launch_source": "replay/data/host_costs.json per op; "
                                                                       "Python outside ops not counted"})}
