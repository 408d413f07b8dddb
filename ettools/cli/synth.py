"""``ettools synth``: per-rank Chakra traces of a model under a parallel plan."""

from __future__ import annotations

from pathlib import Path

import click

from ettools.cli.common import _check_world, _name_option, _outdir, parse_rank_list
from ettools.cli_options import (
    MAX_DIM,
    MAX_WORLD,
    FiniteRange,
    _fail,
    handle_errors,
    parse_dims,
    print_json,
    quiet_option,
)


def _list_models(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``synth --list-models``: presets (with their dimensions and derived ones) and templates."""
    if not value or ctx.resilient_parsing:
        return
    from ettools.converters.symbolic.presets import PRESETS, derived_dims
    from ettools.converters.symbolic.templates import builtin_templates, load_template

    click.echo("presets (--model NAME; --dim NAME=N overrides a dimension):")
    for p in PRESETS.values():
        dims = " ".join(f"{k}={v}" for k, v in p.dims.items())
        rules = ", ".join(f"{k} = {r}" for k, r in derived_dims(p).items())
        click.echo(f"  {p.name:18s} template {p.template:12s} {dims}" + (f"  [derived: {rules}]" if rules else ""))
    click.echo("templates (--model NAME, or a template file path; dimensions default to):")
    for t in builtin_templates():
        m = load_template(t)
        click.echo(f"  {t:18s} " + " ".join(f"{k}={v}" for k, v in m.defaults.items()))
    ctx.exit(0)


@click.command()
@click.option("--model", required=True,
              help="Preset (gpt3-5b, llama3-70b, mixtral-8x7b, …), built-in template or template file "
                   "(--list-models lists them).")
@click.option("--list-models", is_flag=True, expose_value=False, is_eager=True, callback=_list_models,
              help="List the presets (dimensions, which derive from which) and templates, then exit.")
@click.option("--dim", "dims", multiple=True,
              help="Dimension override NAME=N (e.g. L=4, H=1024); an unknown NAME is refused. A preset's "
                   "derived dimensions follow their inputs unless given too (GPT: F = 4*H; Llama, Mixtral, "
                   "DeepSeekMoE: HD = H/NH; --list-models shows them).")
@click.option("--dp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Data-parallel ranks.")
@click.option("--tp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--sp", is_flag=True, help="Sequence parallelism over the tensor-parallel group (needs --tp > 1).")
@click.option("--cp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Context-parallel ranks.")
@click.option("--pp", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True, help="Pipeline stages.")
@click.option("--ep", type=click.IntRange(1, MAX_WORLD), default=1, show_default=True,
              help="Expert-parallel ranks (within dp).")
@click.option("--fsdp", is_flag=True, help="Fully sharded data parallel (ZeRO-3; same as --zero 3).")
@click.option("--zero", type=click.IntRange(0, 3), default=None, help="ZeRO stage 0-3.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "deepspeed", "zb-h1", "dualpipe"]),
              default="1f1b", show_default=True,
              help="Pipeline schedule (deepspeed: DeepSpeed's pipeline engine, ZeRO 0/1; zb-h1: zero-bubble "
                   "ZB-H1, weight gradients deferred into the bubbles; dualpipe: DeepSeek-V3's bidirectional "
                   "DualPipe, two parameter copies, even PP and micro-batches a multiple of 2 and >= 2 PP).")
@click.option("--vpp", type=click.IntRange(2, 1 << 10), default=None, help="Virtual stages per rank (with --schedule interleaved).")
@click.option("--recompute", type=click.Choice(["none", "full", "selective"]), is_flag=False, flag_value="full",
              default="none", show_default=True,
              help="Activation recomputation: full (each layer's forward again; a bare --recompute) or selective "
                   "(only the core attention, Megatron's --recompute-granularity selective).")
@click.option("--batch", type=click.IntRange(1, MAX_DIM), default=None, help="Global batch per iteration.")
@click.option("--micro-batch", type=click.IntRange(1, MAX_DIM), default=None, help="Global micro-batch size.")
@click.option("--seq", type=click.IntRange(1, MAX_DIM), default=None, help="Sequence length.")
@click.option("--dtype", default="bf16", show_default=True,
              help="Activation/parameter dtype (fp8: BF16 storage with FP8 GEMMs, as --gemm-dtype fp8; inference: FP8 weights and KV cache too).")
@click.option("--gemm-dtype", type=click.Choice(["fp8"]), default=None,
              help="Math dtype of the linear layers' GEMMs (fp8: Transformer Engine's FP8 training: forward, "
                   "dgrad and wgrad GEMMs in FP8 with cast kernels; the output layer, attention and every "
                   "other op stay in --dtype). Default: --dtype.")
@click.option("--grad-sync", type=click.Choice(["iteration", "microbatch"]), default=None,
              help="Gradient synchronization once per iteration or per micro-batch.")
@click.option("--bucket-mb", type=FiniteRange(0, 1 << 20, min_open=True), default=None,
              help="DDP-style gradient buckets of this many MiB (default: one per module).")
@click.option("--vocab-parallel/--no-vocab-parallel", default=None,
              help="Split embedding and LM head over tp (default: the preset's choice).")
@click.option("--dp-after-backward/--dp-overlap", default=False, show_default=True,
              help="Gradient collectives after the last backward op, or each bucket as soon as its gradients "
                   "exist (overlapped with the backward; default).")
@click.option("--grad-accumulation", type=click.Choice(["fused", "separate"]), default=None,
              help="How micro-batches' weight gradients add up: fused into the weight-gradient GEMMs "
                   "(Megatron-LM's gradient-accumulation fusion) or an in-place add per micro-batch after the "
                   "first (autograd's; DeepSpeed's pipeline engine).  [default: separate with --schedule "
                   "deepspeed, else fused]")
@click.option("--pp-scatter-gather/--no-pp-scatter-gather", default=None,
              help="Megatron's pipeline scatter/gather: each TP rank sends 1/tp of a stage-boundary tensor, the "
                   "receiver all-gathers it over TP (default: on when --tp > 1 and --pp > 1 without --sp).")
@click.option("--tie-embeddings/--untie-embeddings", default=None,
              help="One weight for the token embedding and the LM head (default: the template's choice; GPT ties).")
@click.option("--phase", type=click.Choice(["train", "prefill", "decode"]), default="train", show_default=True,
              help="Training iteration, or one inference step: prefill (prompts) or decode (one token per sequence).")
@click.option("--context", type=int, default=None,
              help="Inference: tokens attended over (prefill: the prompt; decode: cached tokens + new ones).")
@click.option("--ranks", "rank_text", default=None, help="Write only these ranks, e.g. 0-7,64.")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(path_type=Path),
              help="Output folder for <name>.<rank>.et and comm_group.json.")
@_name_option("synth")
@click.option("--json", "as_json", is_flag=True,
              help="Print per-rank counts/bytes, op classes, peak memory and wall time.")
@quiet_option
@handle_errors
def synth(model: str, dims: tuple[str, ...], dp: int, tp: int, sp: bool, cp: int, pp: int, ep: int,
          fsdp: bool, zero: int | None, schedule: str, vpp: int | None, recompute: str,
          batch: int | None, micro_batch: int | None, seq: int | None, dtype: str, gemm_dtype: str | None,
          grad_sync: str | None, bucket_mb: float | None, vocab_parallel: bool | None, dp_after_backward: bool,
          grad_accumulation: str | None, pp_scatter_gather: bool | None, tie_embeddings: bool | None, phase: str,
          context: int | None, rank_text: str | None, outdir: Path, name: str, as_json: bool) -> None:
    """Synthesize per-rank Chakra traces of a model under a parallel plan (a training iteration,
    or with --phase prefill|decode one inference step with its KV cache; --batch is then the
    number of sequences and --seq the new tokens per sequence)."""
    from ettools.converters.symbolic import synth_summary, synthesize, write_synth
    from ettools.progress import is_quiet

    if fsdp and zero not in (None, 3):
        raise click.UsageError(f"--fsdp is ZeRO-3: it contradicts --zero {zero}")
    if sp and tp < 2:
        raise click.UsageError("--sp splits the sequence over the tensor-parallel group: give --tp > 1")
    if vpp is not None and schedule != "interleaved":
        raise click.UsageError("--vpp sets virtual stages of the interleaved schedule: add --schedule interleaved")
    if grad_accumulation is not None and phase != "train":
        raise click.UsageError("--grad-accumulation is how training adds up gradients: inference has none")
    _check_world("--dp/--tp/--cp/--pp", dp=dp, tp=tp, cp=cp, pp=pp)
    ranks = parse_rank_list(rank_text, world=dp * tp * cp * pp)
    _outdir(outdir)
    try:
        result = synthesize(
            model, parse_dims(dims), dp=dp, tp=tp, sp=sp, cp=cp, pp=pp, ep=ep, zero=zero, fsdp=fsdp,
            schedule=schedule, vpp=vpp, recompute=recompute, batch=batch, micro_batch=micro_batch,
            seq=seq, dtype=dtype, grad_sync=grad_sync, bucket_mb=bucket_mb, vocab_parallel=vocab_parallel,
            ranks=ranks, phase=phase, context=context,
            **({"dp_after_backward": dp_after_backward, "pp_scatter_gather": pp_scatter_gather,
                "tie_embeddings": tie_embeddings, "gemm_dtype": gemm_dtype,
                "grad_accumulation": grad_accumulation} if phase == "train" else {}),
        )
        written = write_synth(result, outdir, name=name, ranks=ranks, progress=not is_quiet())
    except ValueError as e:
        _fail(f"synth {model}: {e}")
    for note in result.notes:
        click.echo(f"ettools: {note}", err=True)
    if as_json:
        summary = synth_summary(result, ranks=ranks)
        summary["files"] = {"count": len(written["paths"]), "bytes": written["bytes"],
                            "write_seconds": written["seconds"]}
        print_json(summary)
    else:
        t = result.timings
        click.echo(f"synthesized {result.model}: {result.world_size:,} ranks, "
                   f"built in {t.get('total_s', 0):.2f} s; wrote {len(written['paths']):,} files "
                   f"({written['bytes'] / 1e6:.1f} MB) to {outdir} in {written['seconds']:.2f} s")
