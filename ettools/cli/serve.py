"""``ettools serve``: simulate an inference service (or search its plans)."""

from __future__ import annotations

from pathlib import Path

import click

from ettools.cli.common import _plot_file
from ettools.cli_options import FiniteRange, _fail, handle_errors, parse_dims, print_json, quiet_option

MAX_SERVE_GPUS = 65536  # serve simulates every engine: beyond this a run sizes memory past a machine


def _storage_dtype(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A KV-cache or weight storage dtype the synthesizer knows (checked before anything runs)."""
    if value is None:
        return None
    from ettools.converters.symbolic.plan import STORAGE_BYTES

    if value.lower() not in STORAGE_BYTES:
        raise click.BadParameter(f"unknown dtype {value!r} ({', '.join(sorted(STORAGE_BYTES))})")
    return value.lower()


@click.command()
@click.option("--model", required=True, help="Preset (llama3-8b, llama3-70b, mixtral-8x7b, …), template or template file.")
@click.option("--dim", "dims", multiple=True, help="Dimension override NAME=N (e.g. L=4).")
@click.option("--gpus", type=click.IntRange(1, MAX_SERVE_GPUS), default=1, show_default=True,
              help="GPUs in all (engines of tp×pp×ep GPUs each).")
@click.option("--tp", type=click.IntRange(1, 1024), default=1, show_default=True, help="Tensor-parallel GPUs per engine.")
@click.option("--pp", type=click.IntRange(1, 1024), default=1, show_default=True, help="Pipeline stages per engine.")
@click.option("--ep", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Expert-parallel GPUs per engine (attention data-parallel over the same GPUs).")
@click.option("--system", default="H100", show_default=True, help="Hardware preset or JSON file.")
@click.option("--network", type=click.Path(exists=True, path_type=Path), default=None,
              help="The network: an ASTRA-sim network YAML or a fit of measured collective tables (calibrate "
                   "--network), for the engines' collectives and the prefill→decode KV transfer (default: the "
                   "hardware's).")
@click.option("--rate", type=FiniteRange(0, 1e6, min_open=True), default=None, help="Poisson arrivals, requests per second.")
@click.option("--interval", type=FiniteRange(1e-9, 1e6), default=None, help="Fixed arrival interval in seconds (instead of --rate).")
@click.option("--duration", type=FiniteRange(0, 1e7, min_open=True), default=60.0, show_default=True, help="Seconds of arrivals.")
@click.option("--prompt-tokens", default="512", show_default=True, help="N, A-B (uniform) or exp:MEAN.")
@click.option("--output-tokens", default="128", show_default=True, help="N, A-B (uniform) or exp:MEAN.")
@click.option("--concurrency", type=click.IntRange(1, 1 << 20), default=None,
              help="A closed loop of this many clients (as genai-perf, vllm bench --max-concurrency): each sends "
                   "its next request when its previous one finishes, instead of --rate/--interval arrivals.")
@click.option("--num-requests", type=click.IntRange(1, 10_000_000), default=None,
              help="With --concurrency: requests in all (default 10 per client).")
@click.option("--requests", "requests_file", type=click.Path(path_type=Path), default=None,
              help="JSONL requests: arrival (s), prompt_tokens, output_tokens per line.")
@click.option("--scheduler", type=click.Choice(["continuous", "chunked", "static"]), default="continuous",
              show_default=True, help="Batching: continuous (prefill first), chunked prefill, or static.")
@click.option("--token-budget", type=click.IntRange(1, 1 << 24), default=8192, show_default=True, help="New tokens per iteration at most.")
@click.option("--max-seqs", type=click.IntRange(1, 1 << 20), default=256, show_default=True, help="Running sequences per engine at most.")
@click.option("--block-tokens", type=click.IntRange(1, 1 << 16), default=16, show_default=True, help="Tokens per KV-cache block.")
@click.option("--kv-fraction", type=FiniteRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="Share of the memory left after the weights that holds the KV cache.")
@click.option("--kv-tokens", type=click.IntRange(1, 1 << 40), default=None, help="KV-cache capacity per engine in tokens (overrides --kv-fraction).")
@click.option("--spec-tokens", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Speculative decoding: tokens verified per step (1: off; emits up to this many).")
@click.option("--acceptance", type=FiniteRange(0, 1), default=1.0, show_default=True, help="Speculative decoding: draft acceptance rate.")
@click.option("--draft-model", default=None, help="Speculative decoding: the draft model's preset (default: free drafts).")
@click.option("--prefill-gpus", type=click.IntRange(1, MAX_SERVE_GPUS), default=None,
              help="Prefill/decode disaggregation: GPUs of the prefill pool (the rest decode).")
@click.option("--slo-ttft", type=FiniteRange(0, 1e9, min_open=True), default=None, help="TTFT SLO in ms (goodput).")
@click.option("--slo-tpot", type=FiniteRange(0, 1e9, min_open=True), default=None, help="TPOT SLO in ms (goodput).")
@click.option("--dtype", default="bf16", show_default=True, help="Weight/activation/KV-cache dtype.")
@click.option("--seed", default=0, show_default=True,
              help="Random seed of the synthetic arrivals and token counts (same seed, same workload).")
@click.option("--timing", type=click.Choice(["measured", "roofline"]), default="measured", show_default=True,
              help="Step costs: the replay's compute models (fitted op models where the GPU has them) or the roofline only.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Write latency CDFs and KV use over time to this PNG.")
@click.option("--cost", "cost_fit", type=click.Path(path_type=Path), default=None,
              help="Iteration times from a serving fit (calibrate --serving), scaled to --model, instead of replays.")
@click.option("--host-overhead-ms", type=FiniteRange(0, 1e6), default=None,
              help="Host time the GPU waits for per iteration, ms (default: the --cost fit's, else the one "
                   "measured on --engine's real traces, else on all the shared SGLang/vLLM traces; 0: none).")
@click.option("--engine", "engine_name", type=click.Choice(["vllm", "sglang"]), default=None,
              help="The serving engine whose measured host overhead applies (its real traces in "
                   "../shared/traces/inference; default: all engines' traces).")
@click.option("--host-overhead-per-seq-us", type=FiniteRange(0, 1e9), default=None,
              help="Host time per sequence of an iteration added to --host-overhead-ms, us.")
@click.option("--max-model-len", type=click.IntRange(1, 1 << 31), default=None,
              help="Reject on arrival a request whose prompt + output tokens exceed this, as engines do "
                   "(default: no limit).")
@click.option("--kv-dtype", default=None, callback=_storage_dtype,
              help="KV-cache dtype when it differs from --dtype (fp8: half the cache bytes and attention reads).")
@click.option("--weight-dtype", default=None, callback=_storage_dtype,
              help="Weight-only quantization: int8, int4 (AWQ/GPTQ), mxfp4, nvfp4 or fp8 weights, GEMMs in --dtype.")
@click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
              help="Engines replay CUDA graphs (a step's launches cost nothing) or run eager (the host launches "
                   "every op: the step is at least those launches).")
@click.option("--shared-prefix", type=click.IntRange(0, 1 << 30), default=0, show_default=True,
              help="Synthetic requests: tokens of a shared prompt prefix (system prompt) ahead of --prompt-tokens.")
@click.option("--prefix-groups", type=click.IntRange(1, 1 << 20), default=1, show_default=True,
              help="Synthetic requests: distinct shared prefixes, one drawn per request.")
@click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True,
              help="Engines reuse the cached KV blocks of shared prefixes (vLLM/SGLang prefix caching).")
@click.option("--routing", type=click.Choice(["round-robin", "least-work", "prefix"]), default="round-robin",
              show_default=True,
              help="Requests to engines: in turn, to the least estimated backlog, or a prefix group to one engine.")
@click.option("--prefill-system", default=None,
              help="With --prefill-gpus: the prefill pool's GPU (preset or JSON; default --system).")
@click.option("--prefill-tp", type=click.IntRange(1, 1024), default=None,
              help="With --prefill-gpus: the prefill engines' tensor parallelism (default --tp).")
@click.option("--search", "search", is_flag=True,
              help="Plan search: try the --space plans (colocated and prefill/decode pools) on this workload, "
                   "rank by goodput per GPU under --slo-ttft/--slo-tpot.")
@click.option("--space", default="tp=1,2,4,8 pp=1 ep=1 prefill=0.25,0.5,0.75", show_default=True,
              help="--search: axis values per engine (tp, pp, ep) and prefill pool fractions of --gpus.")
@click.option("--slo-attainment", type=FiniteRange(0, 1, min_open=True), default=0.9, show_default=True,
              help="--search: share of requests within the SLOs for a plan to meet them.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@quiet_option
@handle_errors
def serve(model: str, dims: tuple[str, ...], gpus: int, tp: int, pp: int, ep: int, system: str,
          network: Path | None, rate: float | None, interval: float | None, duration: float, prompt_tokens: str,
          output_tokens: str, requests_file: Path | None, scheduler: str, token_budget: int, max_seqs: int,
          block_tokens: int, kv_fraction: float, kv_tokens: int | None, spec_tokens: int, acceptance: float,
          draft_model: str | None, prefill_gpus: int | None, slo_ttft: float | None, slo_tpot: float | None,
          dtype: str, seed: int, timing: str, plot_path: Path | None, as_json: bool,
          cost_fit: Path | None = None, search: bool = False, space: str = "", slo_attainment: float = 0.9,
          host_overhead_ms: float | None = None, host_overhead_per_seq_us: float | None = None,
          max_model_len: int | None = None, kv_dtype: str | None = None, weight_dtype: str | None = None,
          cuda_graphs: bool = True, shared_prefix: int = 0, prefix_groups: int = 1, prefix_caching: bool = True,
          prefill_system: str | None = None, prefill_tp: int | None = None, routing: str = "round-robin",
          engine_name: str | None = None, concurrency: int | None = None, num_requests: int | None = None) -> None:
    """Simulate serving requests: TTFT, TPOT, end-to-end latency, throughput, KV cache, with
    iteration times replayed from synthesized prefill/decode steps (or from a serving fit)."""
    from ettools.replay.serve import load_requests, simulate_serving, synthetic

    _plot_file(plot_path, "--plot")

    engine_opts = {"--kv-dtype": kv_dtype, "--weight-dtype": weight_dtype, "--prefill-system": prefill_system,
                   "--prefill-tp": prefill_tp, "--no-cuda-graphs": None if cuda_graphs else True,
                   "--routing": None if routing == "round-robin" else routing, "--engine": engine_name}
    given = [k for k, v in engine_opts.items() if v is not None]
    if given and (search or cost_fit is not None):
        _fail(f"serve: {', '.join(given)} not modelled with {'--search' if search else '--cost'} "
              "(its iteration times come from its own plans or fit)")
    if (prefill_system is not None or prefill_tp is not None) and not prefill_gpus:
        _fail("serve: --prefill-system and --prefill-tp configure the prefill pool: give --prefill-gpus too")
    if requests_file is not None and (shared_prefix or prefix_groups != 1):
        _fail("serve: --shared-prefix/--prefix-groups shape synthetic requests; a --requests file names its "
              "own prefix_group and prefix_tokens")
    if concurrency is not None and (rate is not None or interval is not None):
        _fail("serve: --concurrency is a closed loop (clients send requests as earlier ones finish); "
              "--rate/--interval set open-loop arrivals: give one or the other")
    if num_requests is not None and concurrency is None:
        _fail("serve: --num-requests sizes a closed loop: give --concurrency too")
    if concurrency is not None and (search or cost_fit is not None or prefill_gpus or routing != "round-robin"):
        _fail("serve: --concurrency is modelled on colocated engines (no --search, --cost, --prefill-gpus or "
              "--routing)")
    try:
        if requests_file is not None:
            wl = load_requests(requests_file)
        elif concurrency is not None:
            from ettools.replay.serve.workload import closed_loop_requests

            wl = closed_loop_requests(num_requests or 10 * concurrency, prompt_tokens, output_tokens, seed,
                                      shared_prefix, prefix_groups)
        else:
            if rate is None and interval is None:
                raise ValueError("give --rate, --interval or --requests")
            wl = synthetic(rate, interval, duration, prompt_tokens, output_tokens, seed, shared_prefix=shared_prefix,
                           prefix_groups=prefix_groups)
        if search:
            from ettools.replay.serve.fit import load_fit
            from ettools.replay.serve.search import parse_space, search_lines, search_serving

            rows = search_serving(
                model, wl, gpus=gpus, slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot, attainment=slo_attainment,
                system=system, dims=parse_dims(dims), dtype=dtype, timing=timing,
                fit=load_fit(cost_fit) if cost_fit is not None else None, **parse_space(space),
                scheduler=scheduler, token_budget=token_budget, max_seqs=max_seqs, block_tokens=block_tokens,
                kv_fraction=kv_fraction, kv_tokens=kv_tokens, network=network, seed=seed,
                host_overhead_ms=host_overhead_ms, host_per_seq_us=host_overhead_per_seq_us)
            if as_json:
                print_json({"plans": rows})
            else:
                click.echo("\n".join(search_lines(rows)))
            return
        cost = None
        if cost_fit is not None:
            from ettools.replay.serve.fit import FitCost, load_fit

            cost = FitCost(load_fit(cost_fit), model, tp=tp, pp=pp, ep=ep, system=system, dims=parse_dims(dims),
                           dtype=dtype)
        res = simulate_serving(
            model, wl, gpus=gpus, tp=tp, pp=pp, ep=ep, system=system, network=network, dims=parse_dims(dims),
            dtype=dtype, scheduler=scheduler, token_budget=token_budget, max_seqs=max_seqs,
            block_tokens=block_tokens, kv_fraction=kv_fraction, kv_tokens=kv_tokens, spec_tokens=spec_tokens,
            acceptance=acceptance, draft_model=draft_model, prefill_gpus=prefill_gpus, slo_ttft_ms=slo_ttft,
            slo_tpot_ms=slo_tpot, seed=seed, timing=timing, cost=cost, host_overhead_ms=host_overhead_ms,
            host_per_seq_us=host_overhead_per_seq_us, max_model_len=max_model_len, prefix_caching=prefix_caching,
            kv_dtype=kv_dtype, weight_dtype=weight_dtype, cuda_graphs=cuda_graphs, prefill_system=prefill_system,
            prefill_tp=prefill_tp, routing=routing, engine=engine_name, concurrency=concurrency)
    except ValueError as e:
        _fail(f"serve {model}: {e}")
    if plot_path is not None:
        res.plot(plot_path)
    if as_json:
        print_json(res.to_json())
    else:
        click.echo(res.summary_text())
