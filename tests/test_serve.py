"""``ettools serve`` (issue 17): Little's law, KV pressure, disaggregation, speculative decoding.

Workloads are written here (numpy draws, JSONL files) and the properties are checked from them
and from the model's published dimensions, not from the simulator's own bookkeeping.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.replay.serve import StepCost, simulate_serving, synthetic

KEYS = {"requests", "ttft_ms", "tpot_ms", "e2e_ms", "throughput_rps", "tokens_per_s", "preemptions", "mean_in_system"}
LLAMA8B_KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # layers × KV heads × head dim × (K, V) × bf16


@pytest.fixture(scope="module")
def cost8b():
    """One engine cost model for Llama-3-8B on an H100 (its replays are cached across tests)."""
    return StepCost("llama3-8b", system="H100")


def _write_requests(path, arrivals, prompt, output):
    with open(path, "w") as f:
        for a, p, o in zip(arrivals, prompt, output):
            f.write(json.dumps({"arrival": float(a), "prompt_tokens": int(p), "output_tokens": int(o)}) + "\n")


def _serve_json(*args):
    res = CliRunner().invoke(main, ["serve", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_littles_law_in_steady_state(tmp_path):
    """Poisson arrivals drawn here: the time-average requests in the system equals the arrival
    rate (counted from the file) × the mean end-to-end latency, within 5 %."""
    rng = np.random.default_rng(7)
    arr = np.cumsum(rng.exponential(1 / 6.0, 4000))
    prompt = rng.integers(64, 1024, len(arr))
    output = rng.integers(16, 256, len(arr))
    path = tmp_path / "req.jsonl"
    _write_requests(path, arr, prompt, output)
    d = _serve_json("--model", "llama3-8b", "--requests", str(path), "--system", "H100")
    assert KEYS <= set(d) and {"p50", "p90", "p99"} <= set(d["ttft_ms"]) and {"mean", "p50", "p90", "p99"} <= set(d["e2e_ms"])
    assert d["requests"] == len(arr)
    lam = len(arr) / arr[-1]
    little = lam * d["e2e_ms"]["mean"] / 1e3
    assert abs(d["mean_in_system"] - little) / little < 0.05, (d["mean_in_system"], little)
    assert d["mean_in_system"] > 1.0  # requests overlap: the check is not trivial


def test_small_kv_cache_preempts_and_ttft_grows(cost8b):
    """A KV cache far smaller than the load needs preempts requests and raises TTFT."""
    w = synthetic(8.0, None, 60, "1024-2048", "256-512", seed=3)
    big = simulate_serving("llama3-8b", w, cost=cost8b).to_json()
    small = simulate_serving("llama3-8b", w, cost=cost8b, kv_tokens=12000).to_json()
    assert big["preemptions"] == 0
    assert small["preemptions"] > 0
    assert small["ttft_ms"]["p50"] > big["ttft_ms"]["p50"]
    assert small["kv"]["peak_utilization"] <= 1.0 + 1e-9


def test_disaggregation_moves_prompt_kv_bytes(tmp_path):
    """Prefill pool of 1 GPU, decode pool of 1: the KV bytes sent equal prompt tokens × (32 layers
    × 8 KV heads × 128 × 2 × 2 B); TTFT comes from the prefill pool, E2E includes the transfer."""
    rng = np.random.default_rng(1)
    arr = np.sort(rng.uniform(0, 30, 100))
    prompt = rng.integers(100, 3000, 100)
    output = rng.integers(2, 64, 100)
    path = tmp_path / "req.jsonl"
    _write_requests(path, arr, prompt, output)
    d = _serve_json("--model", "llama3-8b", "--requests", str(path), "--gpus", "2", "--prefill-gpus", "1")
    assert d["kv_transfer_bytes"] == float(prompt.sum() * LLAMA8B_KV_PER_TOKEN)
    assert d["requests"] == 100 and d["ttft_ms"]["p50"] > 0
    assert d["e2e_ms"]["p50"] > d["ttft_ms"]["p50"]


def test_speculative_decoding_divides_decode_iterations(cost8b):
    """Requests far apart (each alone in the engine), 129 output tokens: 128 decode iterations
    each; with 4 tokens per step at acceptance 1.0, 32."""
    n = 20
    w = synthetic(None, 5.0, 5.0 * n, 256, 129)
    base = simulate_serving("llama3-8b", w, cost=cost8b).to_json()
    spec = simulate_serving("llama3-8b", w, cost=cost8b, spec_tokens=4, acceptance=1.0).to_json()
    assert base["decode_iterations"] == n * 128
    assert spec["decode_iterations"] * 4 == base["decode_iterations"]
    assert spec["tpot_ms"]["p50"] < base["tpot_ms"]["p50"]


def test_schedulers_and_bad_requests(tmp_path, cost8b):
    """Every scheduler finishes every request; a malformed JSONL line is one error naming the file."""
    w = synthetic(4.0, None, 20, "exp:400", "exp:100", seed=5)
    for policy in ("static", "continuous", "chunked"):
        d = simulate_serving("llama3-8b", w, cost=cost8b, scheduler=policy).to_json()
        assert np.isfinite(d["e2e_ms"]["p99"]) and d["requests"] == len(w)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival": 0.1, "prompt_tokens": 12}\n')
    res = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--requests", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl" in res.output


# ---- real serving traces ---------------------------------------------------------------------------

INFERENCE = {
    "sglang_qwen3_8b_mi300x/decode_bs32.json.gz": "decode",
    "sglang_qwen3_8b_mi300x/prefill_extend_bs15.json.gz": "prefill",
    "vllm_mi300x_cudagraphs/decode_full_graph_execution.json.gz": "decode",
    "vllm_mi300x_cudagraphs/prefilldecode_piecewise_graph_execution.json.gz": "mixed",
}


@pytest.mark.parametrize("rel", sorted(INFERENCE))
def test_real_serving_iterations_recognised(shared_traces, rel):
    """ettools info reports each execute span of the SGLang/vLLM traces as a prefill, decode or
    mixed iteration with the span's duration and its sequences, as read from the raw gzip JSON."""
    import gzip

    path = shared_traces / "inference" / rel
    raw = json.loads(gzip.open(path).read())
    spans = [e for e in raw["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("execute_")]
    assert len(spans) == 1
    name = spans[0]["name"]
    res = CliRunner().invoke(main, ["info", str(path), "--json"])
    assert res.exit_code == 0, res.output
    steps = json.loads(res.output)["serving_steps"]
    assert len(steps) == 1
    s = steps[0]
    assert s["kind"] == INFERENCE[rel]
    assert abs(s["span_us"] - float(spans[0]["dur"])) < 1.0
    n_ctx = int(name.split("_context_")[1].split("(")[0])
    n_gen = int(name.split("_generation_")[1].split("(")[0])
    assert (s["prefill_seqs"], s["decode_seqs"]) == (n_ctx, n_gen)
    assert s["device_us"] > 0


class _FlatCost:
    """Every iteration takes 1 ms whatever it holds (no attention term): times count iterations."""

    alpha_us = 0.0

    def iteration_us(self, *_args) -> float:
        return 1000.0


def test_static_batch_runs_to_its_longest_member():
    """Static batching, 4 sequences per batch, 8 requests at t=0 with outputs 2..9: the first batch
    is one prefill + (longest output − 1) = 4 decode iterations, finished members waiting as padding,
    and the second batch's first tokens come one prefill after the first batch ends."""
    from ettools.replay.serve.engine import EngineConfig, run_engine

    out = np.arange(2, 10)
    cfg = EngineConfig(policy="static", max_seqs=4, kv_blocks=64, block_tokens=16)
    r = run_engine(np.zeros(8), np.full(8, 32), out, _FlatCost(), cfg)
    ms = 1000.0
    assert np.allclose(r.first_token[:4], 1 * ms)
    assert np.allclose(r.finish[:4], (1 + out[:4] - 1) * ms)  # each finishes on its own last token
    end1 = (1 + out[:4].max() - 1) * ms
    assert np.allclose(r.first_token[4:], end1 + ms)
    assert np.allclose(r.finish[4:], end1 + ms + (out[4:] - 1) * ms)
    assert r.iterations == 2 + (out[:4].max() - 1) + (out[4:].max() - 1)


def test_kv_mean_utilization_weights_what_a_batch_holds_while_it_runs(tmp_path):
    """A static batch of 240 requests arriving together holds all its blocks from its first
    iteration to its last: the time-weighted mean is close to the peak (it read 0.022 against a
    0.925 peak when each sample was the use left after its iteration's finishes)."""
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"arrival": 0.0, "prompt_tokens": 512, "output_tokens": 256}) + "\n"
                            for _ in range(240)))
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--requests", str(reqs), "--scheduler", "static",
                                  "--max-seqs", "240", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    kv = json.loads(r.output)["kv"]
    assert kv["peak_utilization"] > 0.1
    assert kv["mean_utilization"] >= 0.9 * kv["peak_utilization"], kv
