"""Synthesized training steps against published measured training throughput (issue 12).

Run: ``python tests/bench/bench_train_published.py``. Each case repeats one of Megatron-LM's
published GPT runs on DGX A100 nodes (D. Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC'21, Table 1: parameters, heads, hidden size,
layers, tensor/pipeline-parallel size, GPUs, global batch, achieved TFLOP/s per GPU; sequence 2,048,
vocabulary 51,200) as those runs were trained: activation recomputation, no sequence parallelism,
the data-parallel gradient all-reduce after the backward (Megatron-LM's DDP of that time),
unfused attention (template ``gpt_unfused``: the scores as batched GEMMs over the whole s × s
square, a softmax and a dropout over them — fused attention kernels came after), the
interleaved pipeline schedule (two virtual stages) where the pipeline has stages, micro-batches of
one sequence per data-parallel rank under a pipeline and of four without one (the paper does not
list its micro-batch sizes: an assumption). ``ettools`` synthesizes the step, replays it on the
``A100`` preset (op models fitted on kernels, DGX A100 NCCL tables) and prints the predicted step
time next to the published one, and beside it the same plan with fused (FlashAttention-style)
attention (the ``gpt3-*`` presets' template ``gpt``), which those runs did not have.

The published step time is derived from the paper's own FLOP count per iteration,
``F = 96·B·s·l·h²·(1 + s/6h + V/16lh)`` (forward, backward and the recomputed forward), divided by
GPUs × achieved TFLOP/s; its "% of peak" is that same hardware-FLOP convention, which the replay's
HFU column follows (its MFU counts model FLOPs without the recomputation).

Second table: Llama 3 405B pre-training on H100s (Llama Team, "The Llama 3 Herd of Models", 2024,
Table 4: TP 8, CP 1, PP 16, DP 64 / 128 on 8,192 / 16,384 GPUs, sequence 8,192, 16 M tokens per
batch, BF16 MFU 43 % / 41 %), synthesized with sequence parallelism, the interleaved schedule and
one sequence per micro-batch and data-parallel rank, replayed on the H100 preset; the paper does not
state its number of virtual stages per rank, so both 2 and 4 are shown (8 would need 128 layers); Meta's MFU counts model FLOPs, as the replay's MFU does. Nothing in ettools is fitted to
these figures.

Third table: selective against full activation recomputation (V. Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", MLSys 2023, Tables 3 and 5: 22B / 175B /
530B / 1T on 8 / 64 / 280 / 512 A100s, TP 8, PP 1 / 8 / 35 / 64, no data parallelism, global
batch 4 / 64 / 280 / 512 with micro-batch 4 / 1 / 1 / 1, sequence 2,048, vocabulary 51,200, the
interleaved schedule with three chunks per stage for 175B and 530B; iteration seconds with full
recompute and no sequence parallelism, and with selective recompute + sequence parallelism).
Unfused attention (the scores materialized, as Megatron-LM then), replayed on the A100 preset.

Fourth table: MT-NLG 530B, trained with DeepSpeed's pipeline engine and Megatron's tensor
slicing (S. Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", 2022:
105 layers, hidden 20,480, 128 heads, TP 8 × PP 35 on 280 / 350 / 420 DGX A100 nodes, global
batch 1,920, sequence 2,048; 60.1 / 50.2 / 44.4 s per iteration), synthesized with
``schedule="deepspeed"``, ZeRO-1 and full recomputation (unfused attention, as ``gpt_unfused``).
The paper states no micro-batch size: 1 and 2 sequences are both shown. (The published times
scale 1 : 0.835 : 0.739 over the three node counts; the pipeline bubble alone gives
1 : 0.825 : 0.708 at micro-batch 1 and 1 : 0.844 : 0.740 at 2.)

Fifth table: NVIDIA's FP8 pre-training throughput on DGX-H100 (Megatron-Bridge / NeMo 25.09
performance summary, ``docs/performance-summary.md``: Llama 3 8B on 8 GPUs FSDP, Llama 3 70B on 64
GPUs TP 4 PP 8 VP 5, Llama 3.1 405B on 1,024 GPUs TP 8 PP 8 CP 2 VP 8; micro-batch 1, sequence
8,192; tokens/s/GPU), synthesized with ``gemm_dtype="fp8"`` (Transformer Engine: the linear
layers' GEMMs in FP8, the rest in BF16) and sequence parallelism with TP, replayed on the H100
preset.

``--readme`` prints these tables in Markdown for ``replay/README.md`` (the block
``<!-- bench:train_published -->``) between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``,
and the fidelity line of ``README.md`` (its block ``<!-- bench:train_published -->`` there) between
``<!-- readme:begin README.md -->`` and ``<!-- readme:end -->``: ``python tests/bench/run_all.py
--update-readme train_published`` puts them there.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ettools.converters.symbolic.synth import synthesize
from ettools.replay import replay_trace

# name, heads, hidden, layers, tensor-parallel, pipeline-parallel, GPUs, global batch, TFLOP/s per GPU
PUBLISHED = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
]
SEQ, VOCAB, PEAK_TFLOPS = 2048, 51200, 312.0
# Llama 3 405B: GPUs, data-parallel size, published BF16 MFU %
LLAMA3_405B = [(8192, 64, 43.0), (16384, 128, 41.0)]
LLAMA3_TOKENS = 16 * 1024 * 1024
# Korthikanti et al.: name, heads, hidden, layers, TP, PP, GPUs, batch, micro-batch, chunks per
# stage, iteration s with full recompute, iteration s with selective recompute + SP
SELECTIVE = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]


# MT-NLG 530B: DGX A100 nodes, published seconds per iteration
MTNLG = [(280, 60.1), (350, 50.2), (420, 44.4)]
# NeMo DGX-H100 FP8: preset, GPUs, global batch, FSDP, TP, PP, CP, VP, published tokens/s/GPU
NEMO_H100_FP8 = [("llama3-8b", 8, 128, True, 1, 1, 1, 1, 14079),
                 ("llama3-70b", 64, 128, False, 4, 8, 1, 5, 1619),
                 ("llama3-405b", 1024, 512, False, 8, 8, 2, 8, 302)]


def published_step_s(h: int, layers: int, gpus: int, batch: int, tflops: float) -> float:
    """Seconds per iteration implied by the paper's FLOP count and achieved TFLOP/s per GPU."""
    f = 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))
    return f / (gpus * tflops * 1e12)


def megatron_step(template: str, nh: int, h: int, layers: int, tp: int, pp: int, gpus: int,
                  batch: int) -> tuple[float, Any, str]:
    """``(step s, first rank's report, plan label)`` of one published run synthesized with
    ``template`` as trained (module doc) and replayed on the A100 preset."""
    dp = gpus // (tp * pp)
    micro = dp * (1 if pp > 1 else max(1, min(4, batch // dp)))
    res = synthesize(template, {"L": layers, "H": h, "NH": nh, "F": 4 * h, "V": VOCAB, "S": SEQ}, dp=dp, tp=tp,
                     pp=pp, batch=batch, micro_batch=micro, seq=SEQ, recompute=True, dp_after_backward=True,
                     **({"schedule": "interleaved", "vpp": 2} if pp > 1 else {}))
    r = replay_trace(res.trace, system="A100", symmetric=True)
    plan = f"dp{dp} tp{tp} pp{pp} mb{micro // dp}" + (" v2" if pp > 1 else "")
    return max(x.step_time_us for x in r.ranks.values()) / 1e6, r.ranks[min(r.ranks)], plan


def _pct(x: float, places: int = 1) -> str:
    """A signed percentage with a typographic minus, as the README's prose writes it."""
    return f"{x:+.{places}f} %".replace("-", "\u2212")


def _span(xs: list[float], places: int = 1) -> str:
    """``lo … hi`` of signed percentages (the README's ranges)."""
    return f"{_pct(min(xs), places)[:-2]} … {_pct(max(xs), places)}"


def main() -> None:
    """Print predicted vs published step time, MFU/HFU per case and the mean |error|; with
    ``--readme``, the README blocks (module doc) after the tables."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", action="store_true", help="also print the README blocks")
    args = ap.parse_args()
    md: list[str] = []
    summary: dict[str, Any] = {}
    megatron_table(md, summary)
    llama_table(md)
    selective_table(md)
    mtnlg_table(md, summary)
    nemo_fp8_table(md, summary)
    if args.readme:
        print("<!-- readme:begin -->")
        print("\n".join(md).strip("\n"))
        print("<!-- readme:end -->")
        print("<!-- readme:begin README.md -->")
        print(f"- **Published training runs** (prediction, nothing fitted to them): Megatron-LM's GPT runs of "
              f"{summary['megatron_models']} on DGX A100 within {_span(summary['megatron_errs'])} of the published "
              f"step time (mean |error| {summary['megatron_mean']:.1f} %); NVIDIA's FP8 Llama 3 8B/70B/405B "
              f"throughput {' / '.join(_pct(e)[:-2] for e in summary['nemo_errs'])} %; MT-NLG 530B under DeepSpeed's "
              f"pipeline engine {_span(summary['mtnlg_errs'][2])} at two sequences per micro-batch "
              f"({_span(summary['mtnlg_errs'][1])} at one; the paper states neither) — "
              "[replay/README.md](replay/README.md#compute-model-timing-ops-without-a-measured-duration).")
        print("<!-- readme:end -->")


def megatron_table(md: list[str], summary: dict[str, Any]) -> None:
    """Megatron-LM's SC'21 runs as trained and with fused attention (module doc), predicted."""
    print(f"{'model':>7} {'plan':<22} {'published s':>11} {'predicted s':>11} {'error':>7} "
          f"{'pub %peak':>9} {'HFU':>6} {'MFU':>6} {'fused attn s':>12} {'error':>7} {'secs':>5}")
    md += ["**Megatron-LM's GPT runs on DGX A100** (Narayanan et al., SC'21, Table 1), seconds per iteration:", "",
           "| model | plan | published | predicted | error | published % of peak | predicted HFU | predicted MFU "
           "| fused attention: predicted | error |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    errs, fused_errs, peak, hfu, mfu = [], [], [], [], []
    for name, nh, h, layers, tp, pp, gpus, batch, tflops in PUBLISHED:
        t0 = time.perf_counter()
        pub = published_step_s(h, layers, gpus, batch, tflops)
        (pred, r0, plan), (fused, _, _) = (megatron_step(t, nh, h, layers, tp, pp, gpus, batch)
                                           for t in ("gpt_unfused", "gpt3-1.3b"))
        err, ferr = (100.0 * (x - pub) / pub for x in (pred, fused))
        errs.append(err)
        fused_errs.append(ferr)
        peak.append(100 * tflops / PEAK_TFLOPS)
        hfu.append(100 * (r0.hfu or 0))
        mfu.append(100 * (r0.mfu or 0))
        print(f"{name:>7} {plan:<22} {pub:>11.2f} {pred:>11.2f} {err:>+6.1f}% {peak[-1]:>8.1f}% "
              f"{hfu[-1]:>5.1f}% {mfu[-1]:>5.1f}% {fused:>12.2f} {ferr:>+6.1f}% "
              f"{time.perf_counter() - t0:>5.1f}", flush=True)
        md.append(f"| {name} | {plan} | {pub:.2f} s | {pred:.2f} s | {_pct(err)} | {peak[-1]:.1f} % | {hfu[-1]:.1f} % "
                  f"| {mfu[-1]:.1f} % | {fused:.2f} s | {_pct(ferr)} |")
    mean, fmean = (sum(map(abs, e)) / len(e) for e in (errs, fused_errs))
    print(f"mean |error| {mean:.1f} % over {len(errs)} runs as trained ({fmean:.1f} % with fused attention)")
    md += ["", f"As trained: {_span(errs)}, mean |error| {mean:.1f} % over {len(errs)} runs; with fused attention, "
           f"which those runs did not have: {_span(fused_errs)} (mean |error| {fmean:.1f} %). The published \"% of "
           f"peak\" ({min(peak):.1f}–{max(peak):.1f} %) counts the recomputed forward, as the predicted HFU does "
           f"({min(hfu):.1f}–{max(hfu):.1f} %); the MFU does not ({min(mfu):.1f}–{max(mfu):.1f} %).", ""]
    summary.update(megatron_errs=errs, megatron_mean=mean,
                   megatron_models=f"{PUBLISHED[0][0][:-1]} B–{PUBLISHED[-1][0][:-1]} B")


def llama_table(md: list[str]) -> None:
    """Llama 3 405B pre-training MFU on H100 with 2 and 4 virtual stages (module doc), predicted."""
    print(f"\n{'Llama 3 405B':>12} {'plan':<26} {'published MFU':>13} {'predicted MFU':>13} {'error':>7} {'secs':>5}")
    md += ["**Llama 3 405B pre-training on H100** (Llama 3 paper, Table 4; the paper does not state its virtual "
           "stages per rank: 2 and 4 are shown), BF16 MFU:", "",
           "| GPUs | plan | published MFU | predicted MFU | error |", "| ---: | --- | ---: | ---: | ---: |"]
    for (gpus, dp, mfu_pub), vpp in ((c, v) for c in LLAMA3_405B for v in (2, 4)):
        t0 = time.perf_counter()
        tp, pp = 8, 16
        res = synthesize("llama3-405b", dp=dp, tp=tp, pp=pp, sp=True, batch=LLAMA3_TOKENS // 8192, micro_batch=dp,
                         seq=8192, schedule="interleaved", vpp=vpp, ranks=[s * dp * tp for s in range(pp)])
        r = replay_trace(res.trace, system="H100")  # one rank per stage: the others are symmetric
        mfu = min(x.mfu for x in r.ranks.values())
        err = 100 * (mfu - mfu_pub / 100) / (mfu_pub / 100)
        plan = f"dp{dp} tp{tp} pp{pp} sp mb1 v{vpp}"
        print(f"{gpus:>12,} {plan:<26} {mfu_pub:>12.1f}% {100 * mfu:>12.1f}% "
              f"{err:>+6.1f}% {time.perf_counter() - t0:>5.1f}", flush=True)
        md.append(f"| {gpus:,} | {plan} | {mfu_pub:.1f} % | {100 * mfu:.1f} % | {_pct(err)} |")
    md.append("")


def mtnlg_table(md: list[str], summary: dict[str, Any]) -> None:
    """MT-NLG 530B with DeepSpeed's pipeline engine (module doc), predicted."""
    print(f"\n{'MT-NLG nodes':>12} {'plan':<28} {'published s':>11} {'predicted s':>11} {'error':>7} {'secs':>5}")
    md += ["**MT-NLG 530B, DeepSpeed's pipeline engine on DGX A100** (Smith et al. 2022; the paper does not state "
           "its micro-batch size: 1 and 2 sequences are shown), seconds per iteration:", "",
           "| nodes | plan | published | predicted | error |", "| ---: | --- | ---: | ---: | ---: |"]
    errs: dict[int, list[float]] = {1: [], 2: []}
    for mb in (1, 2):
        for nodes, pub in MTNLG:
            t0 = time.perf_counter()
            tp, pp = 8, 35
            dp = nodes * 8 // (tp * pp)
            res = synthesize("gpt_unfused", {"L": 105, "H": 20480, "NH": 128, "F": 4 * 20480, "V": VOCAB, "S": SEQ},
                             dp=dp, tp=tp, pp=pp, batch=1920, micro_batch=dp * mb, seq=SEQ, recompute="full", zero=1,
                             schedule="deepspeed", ranks=[s * dp * tp for s in range(pp)])
            r = replay_trace(res.trace, system="A100")  # one rank per stage: the others are symmetric
            step = max(x.step_time_us for x in r.ranks.values()) / 1e6
            errs[mb].append(100 * (step - pub) / pub)
            plan = f"dp{dp} tp{tp} pp{pp} mb{mb} deepspeed z1"
            print(f"{nodes:>12} {plan:<28} {pub:>11.1f} {step:>11.2f} "
                  f"{errs[mb][-1]:>+6.1f}% {time.perf_counter() - t0:>5.1f}", flush=True)
            md.append(f"| {nodes} | {plan} | {pub:.1f} s | {step:.2f} s | {_pct(errs[mb][-1])} |")
    summary["mtnlg_errs"] = errs
    md.append("")
    for mb, e in errs.items():
        print(f"micro-batch {mb}: mean |error| {sum(map(abs, e)) / len(e):.1f} %")
    line = "; ".join(f"micro-batch {mb}: {_span(e)}, mean |error| {sum(map(abs, e)) / len(e):.1f} %"
                     for mb, e in errs.items())
    md += [line[0].upper() + line[1:] + ".", ""]


def nemo_fp8_table(md: list[str], summary: dict[str, Any]) -> None:
    """NVIDIA's DGX-H100 FP8 Llama 3 pre-training rows (module doc), predicted."""
    print(f"\n{'NeMo FP8 H100':>13} {'plan':<26} {'published tok/s/GPU':>19} {'predicted':>9} {'error':>7} "
          f"{'MFU (bf16 peak)':>15} {'secs':>5}")
    md += ["**FP8 pre-training on DGX-H100** (Megatron-Bridge / NeMo 25.09 performance summary; micro-batch 1, "
           "sequence 8,192), tokens/s/GPU:", "",
           "| model | GPUs | plan | published | predicted | error | predicted MFU (BF16 peak) |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    errs = []
    for name, gpus, gbs, fsdp, tp, pp, cp, vp, pub in NEMO_H100_FP8:
        t0 = time.perf_counter()
        dp = gpus // (tp * pp * cp)
        sched = {"schedule": "interleaved", "vpp": vp} if vp > 1 else {}
        res = synthesize(name, dp=dp, tp=tp, pp=pp, cp=cp, sp=tp > 1, batch=gbs, micro_batch=dp, seq=8192,
                         fsdp=fsdp, gemm_dtype="fp8", ranks=[s * dp * tp * cp for s in range(pp)], **sched)
        r = replay_trace(res.trace, system="H100")  # one rank per stage: the others are symmetric
        step = max(x.step_time_us for x in r.ranks.values()) / 1e6
        tok = gbs * 8192 / step / gpus
        errs.append(100 * (tok - pub) / pub)
        plan = f"{'fsdp ' if fsdp else ''}dp{dp} tp{tp} pp{pp} cp{cp}" + (f" v{vp}" if vp > 1 else "")
        mfu = 100 * min(x.mfu for x in r.ranks.values())
        print(f"{name:>13} {plan:<26} {pub:>19,} {tok:>9,.0f} {errs[-1]:>+6.1f}% "
              f"{mfu:>14.1f}% {time.perf_counter() - t0:>5.1f}", flush=True)
        md.append(f"| {name} | {gpus:,} | {plan} | {pub:,} | {tok:,.0f} | {_pct(errs[-1])} | {mfu:.1f} % |")
    mean = sum(map(abs, errs)) / len(errs)
    print(f"mean |error| {mean:.1f} % over {len(errs)} runs")
    md += ["", f"Mean |error| {mean:.1f} % over {len(errs)} runs.", ""]
    summary.update(nemo_errs=errs)


def selective_table(md: list[str]) -> None:
    """Korthikanti et al.'s full vs selective recompute runs (module doc), predicted."""
    print(f"\n{'model':>6} {'plan':<20} {'full pub':>8} {'pred':>7} {'error':>7} {'sel+SP pub':>10} {'pred':>7} "
          f"{'error':>7} {'ratio pub':>9} {'pred':>6} {'MFU pub/pred':>13} {'secs':>5}")
    md += ["**Full against selective recompute on A100** (Korthikanti et al. 2023, Tables 3 and 5: full recompute "
           "without sequence parallelism, selective recompute with it), seconds per iteration:", "",
           "| model | plan | full: published | predicted | error | selective + SP: published | predicted | error "
           "| full / selective: published | predicted | MFU published / predicted |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    errs, ratios_pub, ratios = [], [], []
    pub_mfu = {"22B": 41.5, "175B": 51.4, "530B": 56.0, "1T": 56.3}
    for name, nh, h, layers, tp, pp, gpus, batch, mb, vpp, full_pub, sel_pub in SELECTIVE:
        assert gpus == tp * pp, name  # these runs have no data parallelism
        t0 = time.perf_counter()
        out = []
        for mode, sp in (("full", False), ("selective", True)):
            res = synthesize("gpt_unfused", {"L": layers, "H": h, "NH": nh, "F": 4 * h, "V": VOCAB, "S": SEQ},
                             tp=tp, pp=pp, sp=sp, batch=batch, micro_batch=mb, seq=SEQ, recompute=mode,
                             dp_after_backward=True, **({"schedule": "interleaved", "vpp": vpp} if vpp > 1 else {}))
            r = replay_trace(res.trace, system="A100", symmetric=True)
            out.append((max(x.step_time_us for x in r.ranks.values()) / 1e6, r.ranks[min(r.ranks)].mfu or 0))
        (full, _), (sel, mfu) = out
        e_full, e_sel = (100 * (x - p) / p for x, p in ((full, full_pub), (sel, sel_pub)))
        errs += [e_full, e_sel]
        ratios_pub.append(full_pub / sel_pub)
        ratios.append(full / sel)
        plan = f"tp{tp} pp{pp} mb{mb}" + (f" v{vpp}" if vpp > 1 else "")
        print(f"{name:>6} {plan:<20} {full_pub:>8.2f} {full:>7.2f} {e_full:>+6.1f}% {sel_pub:>10.2f} {sel:>7.2f} "
              f"{e_sel:>+6.1f}% {full_pub / sel_pub:>9.3f} {full / sel:>6.3f} {pub_mfu[name]:>6.1f}/{100 * mfu:>5.1f}% "
              f"{time.perf_counter() - t0:>5.1f}", flush=True)
        md.append(f"| {name} | {plan} | {full_pub:.2f} s | {full:.2f} s | {_pct(e_full)} | {sel_pub:.2f} s | {sel:.2f} s "
                  f"| {_pct(e_sel)} | {full_pub / sel_pub:.3f} | {full / sel:.3f} | {pub_mfu[name]:.1f} / "
                  f"{100 * mfu:.1f} % |")
    mean, worst = sum(map(abs, errs)) / len(errs), max(map(abs, errs))
    print(f"mean |error| {mean:.1f} % over {len(errs)} runs (worst {worst:.1f} %)")
    md += ["", f"{_span(errs)}, mean |error| {mean:.1f} % over {len(errs)} runs; the full / selective ratio "
           f"{min(ratios):.3f}–{max(ratios):.3f} against {min(ratios_pub):.3f}–{max(ratios_pub):.3f} published.", ""]


if __name__ == "__main__":
    main()
