"""Top level of symbolic synthesis: model + plan → :class:`~ettools.graph.Trace` (and Chakra files).

:func:`synthesize` takes plain values (what ``ettools synth`` passes): a preset name, a built-in
template name or a template file; dimension overrides; parallel degrees; training options. It
returns a :class:`SynthResult`: the trace (the ranks asked for, or all), how long each phase
took, and a :class:`~.instantiate.Stamper` that builds any other rank on demand.
:func:`write_synth` writes Chakra files (``<name>.<rank>.et`` + ``comm_group.json``) for every
rank or a subset, encoding one representative rank per class with the Chakra writer and
stamping the rest at the byte level (ranks of a class differ only in group ids and peers).
:func:`synth_summary` is the ``--json`` summary.

Conventions (documented choices):

* ``batch`` and ``micro_batch`` are *global* sample counts, as in STAGE: each rank runs
  ``batch / micro_batch`` micro-batches of ``micro_batch / dp`` samples (``B/dp`` in templates);
* comm sizes are bytes with Chakra's ``comm_size`` meaning (per-rank buffer);
* ``grad_sync="iteration"`` reduces gradients once per iteration, after each module's last
  micro-batch backward (gradient accumulation in between); ``"microbatch"`` after every
  micro-batch's backward (what STAGE's published counts assume);
* ``sp`` is Megatron sequence parallelism over the TP group (``sp`` must be 1 or ``tp``; a
  separate sequence split is ``cp``);
* ranks are laid out ``tp`` fastest, then ``cp``, ``ep``, the rest of ``dp``, ``pp`` slowest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.graph import NodeType, StringTable, Trace, TraceMeta

from .distribute import DTYPE_BYTES, Plan, build_programs
from .inference import PHASES, inference_model
from .instantiate import (
    DEFAULT_DEVICE,
    Mesh,
    StageGraph,
    Stamper,
    assign_stages,
    build_stage,
    compile_program,
)
from .ir import Model
from .plan import STORAGE_BYTES

# resolving a model and a plan moved to .setup; importable from here as before
from .setup import (  # noqa: F401
    MAX_MICRO_BATCHES,
    MAX_MODULE_USES,
    MAX_TENSOR_BYTES,
    RECOMPUTE_MODES,
    TrainSetup,
    _check_divisible,
    check_sizes,
    merge_dims,
    model_symbols,
    recompute_mode,
    replicate_kv_heads,
    resolve_model,
    train_setup,
)


@dataclass
class SynthResult:
    """What :func:`synthesize` built."""

    trace: Trace
    plan: Plan
    model: str
    dims: dict[str, int]
    stamper: Stamper
    stages: dict[int, StageGraph]
    timings: dict[str, float] = field(default_factory=dict)
    batch: int = 1
    micro_batch: int = 1
    notes: list[str] = field(default_factory=list)  # dimensions derived from overridden ones

    @property
    def world_size(self) -> int:
        """Total ranks of the plan."""
        return self.plan.world

    def rank_graph(self, rank: int):
        """Graph of any rank (built on demand, sharing its stage's columns)."""
        g = self.trace.graphs.get(rank)
        return g if g is not None else self.stamper.rank_graph(rank)


def synthesize(
    model: str | Path | Model = "gpt3-5b",
    dims: dict[str, int] | None = None,
    *,
    dp: int = 1,
    tp: int = 1,
    sp: int | bool = 1,
    cp: int = 1,
    pp: int = 1,
    ep: int = 1,
    zero: int | None = None,
    fsdp: bool = False,
    schedule: str = "1f1b",
    vpp: int | None = None,
    recompute: bool | str = False,
    batch: int | None = None,
    micro_batch: int | None = None,
    seq: int | None = None,
    dtype: str = "bf16",
    grad_dtype: str | None = None,
    grad_sync: str | None = None,
    optimizer: str | None | bool = True,
    bucket_mb: float | None = None,
    vocab_parallel: bool | None = None,
    ranks: list[int] | None = None,
    device: dict[str, float] | None = None,
    materialize: bool | None = None,
    phase: str = "train",
    context: int | None = None,
    pp_scatter_gather: bool | None = None,
    dp_after_backward: bool = False,
    tie_embeddings: bool | None = None,
    gemm_dtype: str | None = None,
    grad_accumulation: str | None = None,
    kv_dtype: str | None = None,
    weight_dtype: str | None = None,
    programs_cache: dict | None = None,
) -> SynthResult:
    """Synthesize the per-rank execution graphs of ``model`` under a parallel plan.

    ``model``: a preset (``"llama3-70b"``), a built-in template (``"gpt"``) or a template file.
    ``dims``: symbol overrides (``{"L": 4, "H": 1024}``); ``seq`` sets ``S``. ``sp``: 1/False
    (off), True or ``tp`` (Megatron sequence parallelism). ``zero``: 0 DDP, 1/2 sharded optimizer
    (and gradients), 3 = ``fsdp``. ``recompute``: ``none``, ``full`` (each module's forward again in
    its backward; True) or ``selective`` (only the core attention: Megatron's
    ``--recompute-granularity selective``). ``batch``/``micro_batch`` are global (default: ``dp`` and one
    micro-batch). ``bucket_mb``: DDP-style gradient buckets across modules (first bucket 1 MiB,
    then this many MiB; default one bucket per module). ``vocab_parallel``: split ``@vocab``
    parameters over tp (default: yes unless the preset says otherwise). ``ranks``: the ranks to put in the trace (all when None and ``materialize``);
    others stay available through :meth:`SynthResult.rank_graph`. ``device``: peak FLOP/s and
    memory bandwidth for the compute durations (default: H100 dense bf16).
    ``schedule``: ``gpipe``, ``1f1b``, ``interleaved`` (``vpp`` chunks per stage) or ``deepspeed``
    (DeepSpeed's pipeline engine: its ``TrainSchedule`` steps, a step's output sent at the start of
    the next step, every gradient reduction after the last step; ZeRO stage 0 or 1; its activations
    cross stages partitioned over the TP group and all-gathered, as Megatron's scatter/gather) or
    ``zb-h1`` (zero-bubble ZB-H1: each backward split into input and weight gradients, the weight
    gradients deferred into the pipeline's bubbles; see :mod:`.schedule`) or ``dualpipe`` (DeepSeek-V3's
    DualPipe, :mod:`.dualpipe`: two copies of the model, rank r running stage r of one and stage
    pp − 1 − r of the other, half the micro-batches entering at each end, forward/backward pairs
    overlapped, the copies' gradients all-reduced between ranks r and pp − 1 − r; pp even,
    micro-batches even and at least 2·pp).
    ``pp_scatter_gather``: Megatron's pipeline scatter/gather (each TP rank sends 1/tp of a boundary
    tensor, the receiver all-gathers it over TP); default on when tp > 1 and pp > 1 without SP.
    ``dp_after_backward``: every gradient collective after the last backward node (default: each
    bucket as soon as its gradients exist, overlapped with the backward). ``tie_embeddings``: honour
    the template's ``tie`` statements (GPT: LM head = token embedding; default) or keep two weights.
    ``gemm_dtype``: ``fp8`` runs the linear layers' GEMMs in FP8 as Transformer Engine trains
    (forward, dgrad and wgrad; operands cast and transposed by their own kernels; weights cast once
    per step; the vocabulary projection, attention and every other op in ``dtype``); default: ``dtype``.
    ``grad_accumulation``: ``fused`` (the weight-gradient GEMMs add into the accumulated gradients,
    as Megatron-LM's gradient-accumulation fusion; default) or ``separate`` (an in-place add over
    every local gradient per micro-batch after the first, as autograd accumulates: DeepSpeed's
    pipeline engine; the default under ``schedule="deepspeed"``).

    ``phase``: ``train`` (default), or an inference step (:mod:`.inference`): ``prefill`` (``seq``
    new prompt tokens per sequence, causal over ``context`` tokens, default ``seq``: a whole
    prompt) or ``decode`` (``seq`` new tokens per sequence, default 1, attending over ``context``
    cached tokens + the new ones, default the model's ``S``). ``batch`` is then the global
    number of sequences (one micro-batch unless ``micro_batch`` says otherwise; a batch that does
    not divide over ``dp`` gives the largest share to every rank); no backward, no optimizer.
    Inference only: ``kv_dtype`` stores the KV cache in another dtype (``fp8``: half the cache
    bytes and attention reads of bf16), ``weight_dtype`` the weights (weight-only quantization:
    ``int8``, ``int4``, ``mxfp4``, ``nvfp4``, ``fp8``; the GEMMs read the quantized bytes and
    multiply in ``dtype``).
    ``programs_cache``: a dict kept by the caller across calls (a search worker's): the symbolic
    programs are reused from an earlier call that reads the same of the plan
    (:func:`.distribute.programs_key`); the result is the same as without it.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    recompute = recompute_mode(recompute)
    if phase != "train":
        return _synthesize_inference(model, dims, phase=phase, context=context, dp=dp, tp=tp, sp=sp, cp=cp,
                                     pp=pp, ep=ep, zero=zero, fsdp=fsdp, vpp=vpp, batch=batch,
                                     micro_batch=micro_batch, seq=seq, dtype=dtype,
                                     vocab_parallel=vocab_parallel, ranks=ranks, device=device,
                                     materialize=materialize, recompute=recompute, kv_dtype=kv_dtype,
                                     weight_dtype=weight_dtype, gemm_dtype=gemm_dtype,
                                     programs_cache=programs_cache)
    if kv_dtype is not None or weight_dtype is not None:
        raise ValueError("kv_dtype and weight_dtype are inference storage options (phase prefill or decode)")
    t0 = time.perf_counter()
    s = train_setup(model, dims, dp=dp, tp=tp, sp=sp, cp=cp, pp=pp, ep=ep, zero=zero, fsdp=fsdp, schedule=schedule,
                    vpp=vpp, recompute=recompute, batch=batch, micro_batch=micro_batch, seq=seq, dtype=dtype,
                    grad_dtype=grad_dtype, grad_sync=grad_sync, optimizer=optimizer, bucket_mb=bucket_mb,
                    vocab_parallel=vocab_parallel, pp_scatter_gather=pp_scatter_gather,
                    dp_after_backward=dp_after_backward, tie_embeddings=tie_embeddings, gemm_dtype=gemm_dtype,
                    grad_accumulation=grad_accumulation)
    return _with_notes(s.notes, _build(s.model, s.values, s.plan, s.label, s.batch, s.micro_batch, ranks, device,
                                       materialize, s.meta, t0, programs_cache))


def _synthesize_inference(model, dims, *, phase: str, context: int | None, dp: int, tp: int, sp, cp: int,
                          pp: int, ep: int, zero: int | None, fsdp: bool, vpp: int | None, batch: int | None,
                          micro_batch: int | None, seq: int | None, dtype: str, vocab_parallel: bool | None,
                          ranks, device, materialize, recompute: str, kv_dtype: str | None = None,
                          weight_dtype: str | None = None, gemm_dtype: str | None = None,
                          programs_cache: dict | None = None) -> SynthResult:
    """:func:`synthesize` for ``phase`` prefill or decode (see :mod:`.inference`).

    FP8 serving (``dtype`` or ``gemm_dtype`` fp8) is what FP8 checkpoints run as in TensorRT-LLM,
    vLLM and SGLang (W8A8): FP8 weights, the linear layers' GEMMs in FP8 with each GEMM's input
    quantized by a kernel of its own, and activations, norms, residual adds and the TP all-reduces
    in BF16 (the shared B200 vLLM trace: ``scaled_fp8_quant`` before its GEMMs, BF16 norms and
    all-reduces); the KV cache in FP8 unless ``kv_dtype`` says otherwise."""
    t0 = time.perf_counter()
    if cp != 1:
        raise ValueError("context parallelism is not modelled for inference steps (use tp/pp/ep/dp)")
    if fsdp or zero or recompute != "none":
        raise ValueError("ZeRO/FSDP and recomputation are training options (an inference step has no backward)")
    if sp not in (1, 0, False):
        raise ValueError("sequence parallelism is not modelled for inference steps")
    m0, preset_dims, opts, label = resolve_model(model)
    m = inference_model(m0, phase)
    values, notes = merge_dims(m0, preset_dims, label, dims)
    replicate_kv_heads(values, tp, notes)
    if phase == "prefill":
        s = int(seq) if seq is not None else int(context) if context is not None else int(values.get("S", 1))
        t = int(context) if context is not None else s
        head = 1
    else:
        s = int(seq) if seq is not None else 1
        t = int(context) if context is not None else int(values.get("S", 1))
        head = s
    if s < 1 or t < s:
        raise ValueError(f"context ({t}) must be at least the new tokens per sequence ({s})")
    values.update({"S": s, "T": t, "SH": head})
    act = DTYPE_BYTES.get(dtype.lower())
    if act is None:
        raise ValueError(f"unknown dtype {dtype!r} ({', '.join(sorted(DTYPE_BYTES))})")
    fp8_gemms = gemm_dtype is not None and gemm_dtype.lower() in ("fp8", "float8")
    if gemm_dtype is not None and not fp8_gemms and DTYPE_BYTES.get(gemm_dtype.lower()) != act:
        raise ValueError(f"gemm_dtype {gemm_dtype!r}: only fp8 (or the activation dtype {dtype!r}) is modelled")
    if act == 1 or fp8_gemms:  # no engine serves with FP8 activations everywhere
        if act == 1:
            notes.append(f"--dtype {dtype} serves as FP8 engines do (W8A8): FP8 weights and GEMMs, each GEMM "
                         "input quantized by its own kernel, BF16 activations, norms and all-reduces, the KV "
                         "cache in FP8 unless --kv-dtype says otherwise")
            kv_dtype = kv_dtype or "fp8"
        dtype, act, fp8_gemms = "bf16", 2, True
        weight_dtype = weight_dtype or "fp8"
    kv_b, w_b = (_storage_bytes(x, what) if x is not None else None
                 for x, what in ((kv_dtype, "kv_dtype"), (weight_dtype, "weight_dtype")))
    if batch is None:
        batch = micro_batch or dp
    if micro_batch is None:
        micro_batch = batch
    if batch % micro_batch:
        raise ValueError(f"batch ({batch}) must be a multiple of micro_batch ({micro_batch})")
    plan = Plan(tp=tp, cp=1, dp=dp, ep=ep, pp=pp, vpp=vpp or 1, schedule="interleaved" if (vpp or 1) > 1 else "1f1b",
                micro_batches=batch // micro_batch, act_bytes=act, param_bytes=w_b or act, grad_bytes=act,
                optimizer=None, phase=phase, kv_bytes=kv_b or 0.0, fp8_gemms=fp8_gemms,
                vocab_parallel=bool(opts.get("vocab_parallel", True)) if vocab_parallel is None else vocab_parallel)
    values["B"] = micro_batch
    check_sizes(m, values, plan)
    for k in ("NH", "KV", "E"):
        d = plan.ep if k == "E" else plan.tp
        if k in values and values[k] % d and values[k] >= d:
            raise ValueError(f"{k} = {values[k]} does not divide over {'ep' if k == 'E' else 'tp'} = {d}")
    return _with_notes(notes, _build(m, values, plan, label, batch, micro_batch, ranks, device, materialize,
                  {"dp": dp, "tp": tp, "sp": False, "cp": 1, "pp": pp, "ep": ep, "zero": 0,
                   "schedule": plan.schedule, "vpp": plan.vpp, "micro_batches": plan.micro_batches,
                   "dtype": dtype, "optimizer": None, "vocab_parallel": plan.vocab_parallel,
                   "phase": phase, "context": t, "new_tokens": s,
                   "kv_dtype": kv_dtype or dtype, "weight_dtype": weight_dtype or dtype,
                   **({"gemm_dtype": "fp8"} if fp8_gemms else {})},
                  t0, programs_cache))


def _storage_bytes(name: str, option: str) -> float:
    """Bytes per element of an inference storage dtype (see :data:`.plan.STORAGE_BYTES`)."""
    b = STORAGE_BYTES.get(name.lower())
    if b is None:
        raise ValueError(f"unknown {option} {name!r} ({', '.join(sorted(STORAGE_BYTES))})")
    return b


def _with_notes(notes: list[str], result: SynthResult) -> SynthResult:
    result.notes = notes
    return result


def _build(m: Model, values: dict[str, int], plan: Plan, label: str, batch: int, micro_batch: int,
           ranks, device, materialize, plan_meta: dict[str, Any], t0: float,
           programs_cache: dict | None = None) -> SynthResult:
    """Programs, stage graphs and the rank stamper of ``m`` under ``plan`` (both phases)."""
    tp, cp, dp, ep, pp = plan.tp, plan.cp, plan.dp, plan.ep, plan.pp
    env: dict[str, Any] = dict(values)
    env.update({"tp": tp, "cp": cp, "ep": ep, "edp": dp // ep, "dp": dp})
    timings: dict[str, float] = {}

    programs = build_programs(m, plan, programs_cache)
    t1 = time.perf_counter()
    timings["symbolic_s"] = t1 - t0

    strings = StringTable()
    slots: dict[tuple, int] = {}
    dev = dict(DEFAULT_DEVICE)
    dev.update(device or {})
    compiled = {}
    for _name, mp in programs.items():
        for prog in (mp.fwd, mp.bwd, mp.sync, mp.step):
            try:
                compiled[prog.key] = compile_program(prog, env, strings, slots, dev)
            except KeyError as e:
                raise TraceError(m.source or label, f"{e.args[0]} (give it with dims)") from None
    out_bytes = {name: [int(np.ceil(float(e.value(env)))) for e in mp.out_bytes] for name, mp in programs.items()}
    uses = []
    for use in m.uses:
        try:
            count = use.repeat.int_value(env)
        except KeyError as e:
            raise TraceError(m.source or label, f"{e.args[0]} (give it with dims)") from None
        uses.append((use.module, count, not use.repeat.is_const() or count > 1))
    mods, vst = assign_stages(uses, plan.pp * plan.vpp)
    mesh = Mesh({"tp": tp, "cp": cp, "ep": ep, "edp": dp // ep, "pp": pp})
    if materialize is None:
        materialize = plan.world <= 4096
    want = list(range(plan.world)) if (ranks is None and materialize) else sorted(set(ranks or []))
    bad = [r for r in want if not 0 <= r < plan.world]
    if bad:
        raise ValueError(f"ranks {bad[:5]} outside 0..{plan.world - 1}")
    if ranks is None:
        stage_ids = list(range(pp))
    else:
        stage_ids = sorted({int(s) for s in mesh.coords(np.asarray(want, np.int64))["pp"]}) or [0]
    stages = {s: build_stage(s, plan, mods, vst, programs, compiled, out_bytes, strings, mesh, slots, dev)
              for s in stage_ids}
    t2 = time.perf_counter()
    timings["instantiate_s"] = t2 - t1

    meta = TraceMeta(world_size=plan.world, source=f"ettools synth {label}")
    meta.extra["synth"] = {"model": label, "dims": values, "batch": batch, "micro_batch": micro_batch,
                           "plan": plan_meta}
    # durations are roofline estimates for ``dev``, not measurements: a replay re-times them
    stamper = Stamper(mesh, [stages.get(s) for s in range(pp)], slots, strings,
                      meta_extra={"durations": "estimated", "estimated_for": dev.get("name", "H100"),
                                  "dtype": plan_meta.get("dtype", "bf16"),
                                  **({"gemm_dtype": "fp8"} if plan.fp8_gemms else {})})
    stamper.register_groups(meta)
    trace = Trace(meta, {}, strings)
    for r in want:
        trace.graphs[r] = stamper.rank_graph(r)
    t3 = time.perf_counter()
    timings["stamp_s"] = t3 - t2
    timings["total_s"] = t3 - t0
    return SynthResult(trace, plan, label, values, stamper, stages, timings, batch, micro_batch)


def synth_summary(result: SynthResult, ranks: list[int] | None = None) -> dict[str, Any]:
    """The ``--json`` summary: ``ettools info``'s per-rank object plus op classes and peak memory.

    Ranks of one stage have identical counts and bytes, so each stage is summarized once and
    reported for every rank asked for (default: the ranks in the trace, or all if it has none).
    """
    from ettools.classify import CLASSES, classify_names
    from ettools.summary import rank_summary

    if ranks is None:
        ranks = sorted(result.trace.graphs) or list(range(result.world_size))
    per_stage: dict[int, dict[str, Any]] = {}
    out_ranks: dict[str, Any] = {}
    for r in ranks:
        st = result.stamper.stage_of(r)
        if st not in per_stage:
            g = result.rank_graph(r)
            s = rank_summary(g)
            comp = g.type == NodeType.COMP_NODE
            codes = classify_names(g.name[comp], result.trace.strings)
            counts = np.bincount(codes, minlength=len(CLASSES)) if len(codes) else np.zeros(len(CLASSES), int)
            s["ops"] = {c: int(counts[i]) for i, c in enumerate(CLASSES) if c in ("GeMM", "Attention", "ElementWise", "Others")}
            s["ops"]["Others"] += int(counts[CLASSES.index("Memory")]) + int(counts[CLASSES.index("Communication")])
            sg = result.stages[st]
            s["peak_memory_bytes"] = int(sg.peak_memory)
            s["resident_bytes"] = int(sg.resident_bytes)
            s["activation_bytes"] = int(sg.activation_bytes)
            s["flops"] = int(g.num_ops[comp & (g.num_ops > 0)].sum())
            s["kv_cache_bytes"] = int(sg.kv_cache_bytes)
            s["stage"] = st
            per_stage[st] = s
        out_ranks[str(r)] = per_stage[st]
    return {
        "source": result.trace.meta.source,
        "model": result.model,
        "world_size": result.world_size,
        "plan": result.trace.meta.extra.get("synth", {}).get("plan", {}),
        "dims": result.dims,
        "ranks": out_ranks,
        "timings": {k: round(v, 4) for k, v in result.timings.items()},
    }
