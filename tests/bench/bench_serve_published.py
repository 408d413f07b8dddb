"""``ettools serve`` against published measured serving latencies (issue 17).

Run: ``python tests/bench/bench_serve_published.py``. Each case repeats a published vLLM
measurement's setup (model, GPU, tensor/pipeline parallelism, prompt and output lengths, load) in
the simulator and prints predicted vs published with the error. Nothing in ettools is fitted to
these figures; the hardware is each GPU's data-sheet preset, the step costs are the replay's
compute models (op models fitted on other data, see ``replay/data/op_models``).

Published figures (quoted here only; the setup each states):

* [IB] InferenceBench concurrency-sweep recipe, https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/ :
  Llama-3.1-8B-Instruct fp16, one H100-80GB-HBM3, vLLM 0.21.0, closed loop at concurrency 1 and 4:
  TPOT p50 6.48 and 6.59 ms. Its "chatbot-short" lengths are not stated: 128 in / 128 out assumed
  (at batch ≤ 4 the weights dominate a decode step; the context changes TPOT by a few %).
* [JM] J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100",
  https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on : Llama-3.1-8B-Instruct BF16, one
  A100 40GB, vLLM 0.23.0, 1,024 in / 128 out, concurrency 1: "about 75 tokens/sec" (TPOT 13.3 ms).
* [AZ] vLLM performance-benchmark runs on Azure (gists by surajssd,
  https://gist.github.com/surajssd/eef8ebf83cadd690f6fb4ee87b30fe1a and .../c8bbcb244b210a3607ad952a7bdda759):
  Llama-3.3-70B-Instruct, 200 ShareGPT prompts, Poisson QPS 1 and 4. TP 4 on
  Standard_NC96ads_A100_v4 (4 × A100 80GB PCIe): median TPOT 44.63 ms / median TTFT 128.39 ms at
  QPS 1, 73.83 / 219.60 ms at QPS 4; TP 4 × PP 2 on Standard_ND96asr_v4 (8 × A100 40GB SXM):
  43.55 / 96.98 ms at QPS 1. Mean lengths from the published throughputs: output tok/s ÷ req/s
  ≈ 214 output tokens, (total − output) tok/s ÷ req/s ≈ 213 prompt tokens; drawn here as
  geometric (ShareGPT's lengths are heavy-tailed). Their TTFT includes the HTTP server and the
  tokenizer, which the simulator does not model. The PCIe VM's collectives are timed on Vidur's
  measured NCCL tables of 4 × A100 80GB joined in NVLink pairs over PCIe
  (``../shared/data/vidur_profiling/network/a100_pairwise_nvlink``, fitted like ``ettools calibrate
  --network DIR``): a data-sheet PCIe link (32 GB/s, 2 µs) gives 19 µs for a small 4-GPU
  all-reduce where the tables measure ~60 µs. The SXM VM runs on the A100 preset's default
  network, itself fitted on Vidur's DGX A100 tables.
* [NIM] NVIDIA NIM for LLMs, benchmarking guide 1.0.0, "Performance",
  https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance : Llama-3.3-70B-Instruct, NIM
  1.8.0 (TensorRT-LLM, CUDA graphs), 2 × H100 80GB, FP8, TP 2, concurrency 1: 5,000 in / 500 out
  TTFT 406.77 ms, ITL 18.58 ms; 500 in / 2,000 out TTFT 47.77 ms, ITL 18.91 ms. Simulated with
  ``dtype="fp8"``: FP8 serving as engines run FP8 checkpoints (W8A8: FP8 weights and GEMMs, each
  GEMM input quantized by its own kernel, BF16 activations, norms and all-reduces, the KV cache in
  FP8; the page does not state the KV cache's dtype).

``--readme`` prints the table of ``replay/README.md`` (the block ``<!-- bench:serve_published -->``)
between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``, and the fidelity line of
``README.md`` (its block ``<!-- bench:serve_published -->`` there) between ``<!-- readme:begin
README.md -->`` and ``<!-- readme:end -->``: ``python tests/bench/run_all.py --update-readme
serve_published`` puts them there.

Each case runs twice: without host overhead (``host 0``) and with its engine's per-iteration host
overhead as measured on that engine's real traces (``replay/serve/cost.py: ENGINE_HOST``, ``serve
--engine``; not on these figures): the vLLM cases vLLM's (0 µs: its CUDA-graph iterations keep the
GPU fed), the NIM cases (TensorRT-LLM, no trace of it here) the mean of all engines' traces
(``DEFAULT_HOST``).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np

from ettools.replay.serve import StepCost, simulate_serving, synthetic
from ettools.replay.serve.workload import Workload

PRESETS = Path(__file__).resolve().parents[2] / "replay" / "hardware" / "presets.json"
PAIRWISE_NVLINK = Path(__file__).resolve().parents[3] / "shared" / "data" / "vidur_profiling" / "network" / \
    "a100_pairwise_nvlink"


# NIM 1.8.0, Llama-3.3-70B-Instruct FP8 TP 2 on 2 × H100: (input, output, concurrency, TTFT ms,
# ITL ms, output tokens/s). Concurrency 100-250 is left out: there the engine's batch limit, which
# the page does not state, sets the queueing.
NIM_ROWS = [(5000, 500, 1, 406.77, 18.58, 51.67), (5000, 500, 5, 546.7, 21.83, 218.48),
            (5000, 500, 25, 688.69, 38.75, 623.4), (5000, 500, 50, 834.51, 59.73, 814.37),
            (500, 2000, 1, 47.77, 18.91, 52.85)]


def _a100_pcie() -> dict:
    """A100 80GB PCIe from its data sheet: 1,935 GB/s HBM2e, 300 W; GPUs joined by PCIe Gen4
    x16 (64 GB/s bidirectional, 32 each way) instead of NVLink."""
    hw = copy.deepcopy(json.loads(PRESETS.read_text())["A100"])
    hw["name"] = "NVIDIA A100 80GB PCIe"
    hw["hbm_gbps"] = 1935.0
    hw["network"]["scale_up_gbps"] = 32.0
    hw["network"]["scale_up_latency_ns"] = 2000.0
    return hw


def _pairwise_network() -> dict | None:
    """The network fit of Vidur's measured 4 × A100 (NVLink pairs over PCIe) NCCL tables (None, and
    the data-sheet PCIe link, where ../shared is not beside the repository)."""
    from ettools.replay.netfit import fit_nccl_tables, read_nccl_tables

    if not PAIRWISE_NVLINK.is_dir():
        return None
    # each size's fastest repetition, as the shipped GPU fits (replay/data/make_network_fits.py)
    return fit_nccl_tables(read_nccl_tables(PAIRWISE_NVLINK, statistic="min"),
                           source="vidur_profiling/network/a100_pairwise_nvlink (per-size minimum)").to_dict()


def closed_loop(model: str, cost: StepCost, conc: int, n: int, prompt: int, output: int, **kw) -> dict:
    """A closed loop of ``conc`` clients (``vllm bench serve --max-concurrency C``, genai-perf's
    concurrency mode; ``simulate_serving(concurrency=C)``): each client sends its next request when
    its previous one finishes. The clients' first requests are spread over one lone request's
    latency (a long run's clients drift apart; started together, identical requests would stay in
    lockstep in a deterministic simulation), and the figures are taken over the steady part: the
    first and the last ``conc`` requests are left out. Throughput: output tokens per second by the
    response-time law, ``conc · output / mean E2E``."""
    lone = simulate_serving(model, Workload(np.zeros(1), np.full(1, prompt), np.full(1, output)), cost=cost, **kw)
    arr = np.zeros(n)
    arr[:conc] = np.arange(conc) * float(lone.finish_s[0]) / conc
    r = simulate_serving(model, Workload(arr, np.full(n, prompt), np.full(n, output)), cost=cost, concurrency=conc, **kw)
    keep = slice(conc, max(n - conc, conc + 1))
    ttft = (r.first_s - r.workload.arrival_s)[keep] * 1e3
    tpot = ((r.finish_s - r.first_s) / max(output - 1, 1))[keep] * 1e3
    e2e = (r.finish_s - r.workload.arrival_s)[keep]
    return {"ttft_ms": {"mean": float(ttft.mean()), "p50": float(np.median(ttft))},
            "tpot_ms": {"mean": float(tpot.mean()), "p50": float(np.median(tpot))},
            "tokens_per_s": conc * output / float(e2e.mean())}


def main() -> None:
    from ettools.replay.serve.cost import DEFAULT_HOST, ENGINE_HOST

    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", action="store_true", help="print the README block")
    args = ap.parse_args()

    rows = []
    for h in (0.0, None):  # no host overhead, then the engine's measured one
        kw = {"host_overhead_ms": h}
        c = StepCost("llama3-8b", system="H100", engine="vllm")
        for conc, pub in ((1, 6.48), (4, 6.59)):
            d = closed_loop("llama3-8b", c, conc, 20 * conc, 128, 128, gpus=1, **kw)
            rows.append((f"[IB] Llama-3.1-8B, 1×H100, C={conc}, 128/128", "TPOT p50", d["tpot_ms"]["p50"], pub))
        c = StepCost("llama3-8b", system="A100_40GB", engine="vllm")
        d = closed_loop("llama3-8b", c, 1, 20, 1024, 128, gpus=1, **kw)
        rows.append(("[JM] Llama-3.1-8B, 1×A100-40GB, C=1, 1024/128", "TPOT", d["tpot_ms"]["mean"], 1000 / 75))
        pcie = _a100_pcie()
        c70 = StepCost("llama3-70b", system=pcie, tp=4, network=_pairwise_network(), engine="vllm")
        for qps, tpot, ttft in ((1.0, 44.63, 128.39), (4.0, 73.83, 219.60)):
            w = synthetic(qps, None, 200 / qps, "exp:213", "exp:214", seed=0)
            d = simulate_serving("llama3-70b", w, cost=c70, gpus=4, tp=4, **kw).to_json()
            rows.append((f"[AZ] Llama-3.3-70B, 4×A100-80GB PCIe TP4, QPS {qps:g}", "TPOT p50", d["tpot_ms"]["p50"], tpot))
            rows.append(("", "TTFT p50", d["ttft_ms"]["p50"], ttft))
        c70 = StepCost("llama3-70b", system="H100", tp=2, dtype="fp8")
        nim = {"gpus": 2, "tp": 2, "scheduler": "chunked", "token_budget": 8192}  # in-flight batching
        for isl, osl, conc, ttft, itl, tput in NIM_ROWS:
            d = closed_loop("llama3-70b", c70, conc, max(6 * conc, 3), isl, osl, **nim, **kw)
            rows.append((f"[NIM] Llama-3.3-70B FP8, 2×H100 TP2, C={conc}, {isl}/{osl}", "ITL", d["tpot_ms"]["mean"], itl))
            rows.append(("", "TTFT", d["ttft_ms"]["mean"], ttft))
            rows.append(("", "tokens/s", d["tokens_per_s"], tput))
        c70 = StepCost("llama3-70b", system="A100_40GB", tp=4, pp=2, engine="vllm")
        w = synthetic(1.0, None, 200.0, "exp:213", "exp:214", seed=0)
        d = simulate_serving("llama3-70b", w, cost=c70, gpus=8, tp=4, pp=2, **kw).to_json()
        rows.append(("[AZ] Llama-3.3-70B, 8×A100-40GB TP4 PP2, QPS 1", "TPOT p50", d["tpot_ms"]["p50"], 43.55))
        rows.append(("", "TTFT p50", d["ttft_ms"]["p50"], 96.98))
    half = len(rows) // 2
    v = ENGINE_HOST["vllm"]
    print(f"host overhead: 0 | the engine's: vLLM {v['const_us'] / 1e3:.3f} ms per iteration ({v['source']}); "
          f"NIM {DEFAULT_HOST['const_us'] / 1e3:.3f} ms + {DEFAULT_HOST['per_seq_us']:.1f} us/seq ({DEFAULT_HOST['source']})")
    print(f"{'case':<52} {'metric':<9} {'host 0':>9} {'engine':>9} {'published':>10} {'error 0':>8} {'error':>8}")
    errs0, errs = [], []
    readme = ["| case | metric | predicted, no host overhead | predicted, the engine's host overhead | published | error | "
              "error (engine's) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (case, metric, p0, pub), (_, _, p1, _) in zip(rows[:half], rows[half:]):
        e0, e1 = (p0 - pub) / pub * 100, (p1 - pub) / pub * 100
        errs0.append(abs(e0))
        errs.append(abs(e1))
        u = "" if metric == "tokens/s" else " ms"
        print(f"{case:<52} {metric:<9} {p0:>7.2f}{u:3} {p1:>7.2f}{u:3} {pub:>8.2f}{u:3} {e0:>+7.1f}% {e1:>+7.1f}%")
        readme.append(f"| {case} | {metric} | {p0:.2f}{u} | {p1:.2f}{u} | {pub:.2f}{u} | {e0:+.1f} % | {e1:+.1f} % |")
    metric = np.array([m.split()[0] for _, m, _, _ in rows[:half]])
    prefill, tput = metric == "TTFT", metric == "tokens/s"
    decode = ~prefill & ~tput
    e = np.array(errs)
    summary = (f"mean |error| {np.mean(errs0):.1f} % without host overhead, {np.mean(errs):.1f} % with the engine's, "
               f"over {len(errs)} figures: decode (TPOT/ITL) {e[decode].mean():.1f} % over {int(decode.sum())}, "
               f"prefill (TTFT) {e[prefill].mean():.1f} % over {int(prefill.sum())}, "
               f"throughput {e[tput].mean():.1f} % over {int(tput.sum())}")
    print(summary)
    if args.readme:
        print("<!-- readme:begin -->")
        print("\n".join(readme))
        print(f"\nAll predictions (nothing fitted to these figures); {summary}.")
        print("<!-- readme:end -->")
        print("<!-- readme:begin README.md -->")
        print(f"- **Serving** (prediction): published measurements of real engines (vLLM ×3 sources, NVIDIA NIM), "
              f"mean |error| {np.mean(errs):.1f} % over {len(errs)} figures: decode {e[decode].mean():.1f} %, "
              f"prefill (TTFT) {e[prefill].mean():.1f} % (targets ≤ 10 %), throughput {e[tput].mean():.1f} % "
              f"(target ≤ 15 %) — [replay/README.md](replay/README.md#inference-and-serving).")
        print("<!-- readme:end -->")


if __name__ == "__main__":
    main()
