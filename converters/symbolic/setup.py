"""A model and a training plan resolved and checked before anything is built: the template (a
preset, a built-in or a file), its dimension values (:func:`merge_dims`), the :class:`~.plan.Plan`
with its checks (:func:`check_sizes`), and :func:`train_setup`, which resolves a training step
exactly as :func:`~.synth.synthesize` does (``ettools search`` builds programs from it without
synthesizing). Inference steps share the helpers (:func:`~.synth.synthesize`'s inference branch).
Everything here stays importable from :mod:`.synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from .distribute import DTYPE_BYTES, Plan
from .expr import parse
from .hf_config import config_path, hf_model
from .ir import Model
from .presets import derived_dims, get_preset
from .templates import load_template

RECOMPUTE_MODES = ("none", "full", "selective")


def recompute_mode(value: bool | str | None) -> str:
    """``none``, ``full`` or ``selective`` from a mode name or a flag (True: full)."""
    if value is None or value is False:
        return "none"
    if value is True:
        return "full"
    if value not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {value!r}")
    return str(value)


def resolve_model(model: str | Path | Model) -> tuple[Model, dict[str, int], dict[str, Any], str]:
    """A model from a preset name, a built-in template name, a template path or a Hugging Face
    ``config.json`` (the file or its folder: :mod:`.hf_config`).

    Returns the model, the preset's dimension values, the preset's option defaults, a label.
    """
    if isinstance(model, Model):
        return model, {}, {}, model.name
    hf = config_path(model)  # a .json file or a folder holding config.json (templates are text)
    if hf is not None:
        m, p = hf_model(hf)
        return m, dict(p.dims), dict(p.options), p.name
    preset = get_preset(str(model)) if not Path(str(model)).exists() else None
    if preset is not None:
        return load_template(preset.template), dict(preset.dims), dict(preset.options), preset.name
    m = load_template(model)
    return m, {}, {}, m.name


def model_symbols(m: Model) -> set[str]:
    """Every dimension symbol a template's sizes, repeats and flop counts use (``B``, ``H``, …)."""
    out: set[str] = set(m.defaults)
    for mod in m.modules.values():
        for e in mod.sizes.values():
            out |= e.symbols
        for op in mod.ops:
            if "flops" in op.attrs:
                out |= parse(op.attrs["flops"]).symbols
    for u in m.uses:
        out |= u.repeat.symbols
    return out


def merge_dims(m: Model, preset_dims: dict[str, int], label: str,
               dims: dict[str, int] | None) -> tuple[dict[str, int], list[str]]:
    """Dimension values: the template's defaults, the preset's values, then ``dims`` overrides;
    dimensions the preset derives from an overridden one (:data:`.presets.DERIVED`) re-derived.

    Returns the values and one note per re-derived dimension; an unknown dimension, ``B`` (the
    micro-batch: ``micro_batch``) or a rule that gives no positive integer is a ValueError."""
    dims = dict(dims or {})
    known = (model_symbols(m) | set(preset_dims)) - {"B"}
    if "B" in dims:
        raise ValueError("B is the micro-batch: set it with --micro-batch (or --batch)")
    unknown = sorted(set(dims) - known)
    if unknown:
        raise ValueError(f"unknown dimension{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for "
                         f"{label}: known {', '.join(sorted(known))}")
    bad = sorted(k for k, v in dims.items() if not isinstance(v, int) or v < 1)
    if bad:
        raise ValueError(f"dimension {bad[0]} = {dims[bad[0]]}: dimensions are positive integers")
    values = dict(m.defaults)
    values.update(preset_dims)
    values.update(dims)
    notes = []
    preset = get_preset(label) if preset_dims else None
    for d, rule in (derived_dims(preset) if preset else {}).items():
        e = parse(rule)
        if d in dims or not (e.symbols & set(dims)):
            continue
        v = e.value(values)
        if v.denominator != 1 or v < 1:
            raise ValueError(f"{label} derives {d} = {rule}, which is {float(v):g} with "
                             + ", ".join(f"{k}={values[k]}" for k in sorted(e.symbols))
                             + f": give --dim {d}=… too")
        values[d] = int(v)
        notes.append(f"derived {d} = {rule} = {int(v)} (from --dim {', '.join(sorted(e.symbols & set(dims)))})")
    return values, notes


def replicate_kv_heads(values: dict[str, int], tp: int, notes: list[str]) -> None:
    """With fewer key/value heads than tensor-parallel GPUs, each KV head is replicated on
    ``tp / KV`` GPUs, as vLLM, SGLang and Megatron do (a GPU holds one whole head, never a slice):
    ``KV`` becomes ``tp`` — the replicas' projections, cache and weights are real per-GPU work and
    memory. ``tp`` must be a multiple of ``KV``."""
    kv = values.get("KV")
    if kv is None or kv >= tp:
        return
    if tp % kv:
        raise ValueError(f"tp = {tp} is not a multiple of the {kv} KV heads: a KV head cannot be split")
    values["KV"] = tp
    notes.append(f"KV = {kv} heads over tp = {tp}: each KV head is replicated on {tp // kv} GPUs (one whole "
                 "head per GPU, as vLLM/SGLang/Megatron do); projections, cache and weights count the replicas")


MAX_TENSOR_BYTES = 1 << 50  # one tensor of a simulated rank: beyond this no GPU holds it and sizes overflow
# per step: every one is a node instance of every stage (at 2^20 one rank of a 1-layer model built
# ~40M nodes, tens of GB); real steps run at most a few thousand
MAX_MICRO_BATCHES = 1 << 14
MAX_MODULE_USES = 1 << 20  # layers (module repeats) of a model: each is a chain position of its stage


def check_sizes(m: Model, values: dict[str, int], plan: Plan) -> None:
    """Refuse dimensions no run has before anything is built from them: a tensor of the model over
    :data:`MAX_TENSOR_BYTES` (whole, before any split), more than :data:`MAX_MICRO_BATCHES`
    micro-batches per step or more than :data:`MAX_MODULE_USES` layers."""
    if plan.micro_batches > MAX_MICRO_BATCHES:
        raise ValueError(f"{plan.micro_batches:,} micro-batches per step (batch / micro-batch): at most "
                         f"{MAX_MICRO_BATCHES:,}")
    uses = sum(int(u.repeat.value(values)) for u in m.uses)
    if uses > MAX_MODULE_USES:
        raise ValueError(f"{uses:,} module uses (layers) in the model: at most {MAX_MODULE_USES:,}")
    for mod in m.modules.values():
        for t in mod.tensors:
            try:
                n = int(mod.numel(t).value(values))
            except (KeyError, ValueError, ZeroDivisionError):
                continue  # a size the instantiation checks itself
            if n * plan.act_bytes > MAX_TENSOR_BYTES:
                raise ValueError(f"{mod.name}.{t} would hold {n:,} elements ({n * plan.act_bytes:.3g} B): "
                                 f"dimensions {', '.join(f'{k}={v:,}' for k, v in sorted(values.items()))} "
                                 f"are beyond what can be simulated (a tensor over 2^50 B)")


def _check_divisible(dims: dict[str, int], plan: Plan, micro_batch: int, batch: int) -> None:
    if batch % micro_batch:
        raise ValueError(f"batch ({batch}) must be a multiple of micro_batch ({micro_batch})")
    if micro_batch % plan.dp:
        raise ValueError(f"micro_batch ({micro_batch}, global) must be a multiple of dp ({plan.dp}): "
                         f"each data-parallel rank needs a whole number of samples")
    s = dims.get("S")
    split = plan.cp * (plan.tp if plan.sp else 1)
    if s is not None and s % split:
        raise ValueError(f"sequence length {s} does not divide over cp×(tp under sp) = {split}")
    for k in ("NH", "KV", "E"):
        if k in dims:
            d = plan.ep if k == "E" else plan.tp
            if dims[k] % d and dims[k] >= d:
                raise ValueError(f"{k} = {dims[k]} does not divide over {'ep' if k == 'E' else 'tp'} = {d}")


class TrainSetup(NamedTuple):
    """A training step as :func:`train_setup` resolves it, before anything is built."""

    model: Model
    values: dict[str, int]  # dimension values; ``B`` is the global micro-batch
    plan: Plan
    label: str
    batch: int
    micro_batch: int
    notes: list[str]
    meta: dict[str, Any]  # the plan as the trace's metadata records it (``dtype``: the activations')


def train_setup(model: str | Path | Model, dims: dict[str, int] | None = None, *, dp: int = 1, tp: int = 1,
                sp: int | bool = 1, cp: int = 1, pp: int = 1, ep: int = 1, zero: int | None = None,
                fsdp: bool = False, schedule: str = "1f1b", vpp: int | None = None, recompute: bool | str = False,
                batch: int | None = None, micro_batch: int | None = None, seq: int | None = None,
                dtype: str = "bf16", grad_dtype: str | None = None, grad_sync: str | None = None,
                optimizer: str | None | bool = True, bucket_mb: float | None = None,
                vocab_parallel: bool | None = None, pp_scatter_gather: bool | None = None,
                dp_after_backward: bool = False, tie_embeddings: bool | None = None,
                gemm_dtype: str | None = None, grad_accumulation: str | None = None) -> TrainSetup:
    """The model, dimension values and checked :class:`~.plan.Plan` of a training step, exactly as
    :func:`synthesize` (same arguments) resolves them before it builds anything: what a caller needs
    to build the step's programs itself (``ettools search`` bounds plans from them)."""
    recompute = recompute_mode(recompute)
    m, preset_dims, opts, label = resolve_model(model)
    values, notes = merge_dims(m, preset_dims, label, dims)
    notes.extend(opts.get("notes", ()))  # what a Hugging Face config's mapping left out
    replicate_kv_heads(values, tp, notes)
    if seq is not None:
        values["S"] = int(seq)
    if isinstance(sp, bool):
        sp_on = sp and tp > 1
    else:
        if sp not in (1, tp) and sp != 0:
            raise ValueError(f"sp must be 1 (off) or equal to tp ({tp}); use cp to split the sequence "
                             f"over a separate group")
        sp_on = sp == tp and tp > 1
    if fsdp:
        zero = 3
    if zero is None:
        zero = 0
    if micro_batch is None:
        micro_batch = dp
    if batch is None:
        batch = micro_batch
    act = DTYPE_BYTES.get(dtype.lower())
    if act is None:
        raise ValueError(f"unknown dtype {dtype!r} ({', '.join(sorted(DTYPE_BYTES))})")
    if act == 1 and gemm_dtype is None:  # nobody trains with FP8 activations and weights everywhere
        notes.append(f"--dtype {dtype} trains as Transformer Engine does: BF16 activations and weights, "
                     "the linear layers' GEMMs in FP8 (--dtype bf16 --gemm-dtype fp8)")
        dtype, act, gemm_dtype = "bf16", 2, "fp8"
    gbytes = DTYPE_BYTES[grad_dtype.lower()] if grad_dtype else act
    fp8_gemms = gemm_dtype is not None and gemm_dtype.lower() in ("fp8", "float8")
    if gemm_dtype is not None and not fp8_gemms and DTYPE_BYTES.get(gemm_dtype.lower()) != act:
        raise ValueError(f"gemm_dtype {gemm_dtype!r}: only fp8 (or the activation dtype {dtype!r}) is modelled")
    if fp8_gemms and act < 2:
        raise ValueError("gemm_dtype fp8 keeps activations and weights in a 16- or 32-bit dtype: "
                         f"--dtype {dtype} already stores them in FP8")
    if optimizer is True:
        optimizer = opts.get("optimizer", "adam")
    elif optimizer is False:
        optimizer = None
    if schedule == "interleaved" and vpp is None:
        vpp = 2
    if pp_scatter_gather is None:
        pp_scatter_gather = tp > 1 and pp > 1 and not sp_on
    elif pp_scatter_gather and sp_on:
        raise ValueError("pipeline scatter/gather splits what sequence parallelism already splits: "
                         "it applies without sp only")
    tie = bool(m.ties) if tie_embeddings is None else bool(tie_embeddings)
    if tie_embeddings and not m.ties:
        raise ValueError(f"{label} has no tied parameters (no 'tie' statement in its template)")
    plan = Plan(tp=tp, cp=cp, dp=dp, ep=ep, pp=pp, sp=sp_on, zero=zero,
                fsdp_modules=opts.get("fsdp_modules"), schedule=schedule,
                vpp=vpp if schedule == "interleaved" else 1, micro_batches=batch // micro_batch,
                recompute=recompute, act_bytes=act, param_bytes=act, grad_bytes=gbytes,
                grad_sync=grad_sync or opts.get("grad_sync", "iteration"), optimizer=optimizer,
                vocab_parallel=bool(opts.get("vocab_parallel", True)) if vocab_parallel is None else vocab_parallel,
                bucket_mb=bucket_mb, pp_scatter_gather=bool(pp_scatter_gather and tp > 1 and pp > 1),
                # DeepSpeed's engine reduces gradients only after its last pipeline step
                dp_after_backward=bool(dp_after_backward) or schedule == "deepspeed", tie=tie,
                fp8_gemms=fp8_gemms,
                # DeepSpeed's pipeline engine leaves accumulation to autograd; Megatron fuses it
                grad_accumulation=grad_accumulation or ("separate" if schedule == "deepspeed" else "fused"))
    values["B"] = micro_batch
    check_sizes(m, values, plan)
    _check_divisible(values, plan, micro_batch, batch)
    return TrainSetup(m, values, plan, label, batch, micro_batch, notes,
                      {"dp": dp, "tp": tp, "sp": sp_on, "cp": cp, "pp": pp, "ep": ep, "zero": zero,
                       "schedule": plan.schedule, "vpp": plan.vpp, "micro_batches": plan.micro_batches,
                       "recompute": recompute, "dtype": dtype, "grad_sync": plan.grad_sync,
                       "optimizer": optimizer, "bucket_mb": bucket_mb, "vocab_parallel": plan.vocab_parallel,
                       "pp_scatter_gather": plan.pp_scatter_gather, "dp_after_backward": plan.dp_after_backward,
                       "tied_embeddings": bool(tie and m.ties), "gemm_dtype": "fp8" if fp8_gemms else dtype,
                       "grad_accumulation": plan.grad_accumulation})
