"""Per-iteration host overhead of ``ettools serve`` (issue 17).

The GPU's wait for the host in the real SGLang/vLLM serving traces is recomputed here from the raw
gzip JSON (events, correlation ids, plain Python), not from the reader or the code under test; the
serve properties are checked against the workload written here.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.formats import load_trace
from ettools.replay.serve import StepCost, simulate_serving
from ettools.replay.serve.cost import DEFAULT_HOST, ENGINE_HOST
from ettools.replay.serve.steps import host_times
from ettools.replay.serve.workload import Workload

TRACES = ["sglang_qwen3_8b_mi300x/decode_bs32.json.gz", "sglang_qwen3_8b_mi300x/prefill_extend_bs15.json.gz",
          "vllm_mi300x_cudagraphs/decode_full_graph_execution.json.gz",
          "vllm_mi300x_cudagraphs/prefilldecode_piecewise_graph_execution.json.gz"]
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}


def _blocks(name: str) -> bool:
    """A CUDA/HIP call that returns only when the device is done: synchronize, or a non-async copy/set."""
    n = name.lower()
    return "synchronize" in n or (("memcpy" in n or "memset" in n) and "async" not in n)


def _raw_host(path) -> dict:
    """Host measures of the one execute_… step of a raw trace, computed from its events."""
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("execute_"))
    s, e_ = step["ts"], step["ts"] + step["dur"]
    runtime = [e for e in ev if e.get("cat") == "cuda_runtime"]
    dev = sorted((e for e in ev if e.get("cat") in DEVICE), key=lambda e: e["ts"])
    pageable = {e["args"].get("correlation") for e in dev if "Pageable" in e["name"]}
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in runtime
             if _blocks(e["name"]) or e["args"].get("correlation") in pageable]
    launch_end = {}
    for e in runtime:
        c = e["args"].get("correlation")
        launch_end[c] = max(launch_end.get(c, -np.inf), e["ts"] + e["dur"])
    # time the host spent waiting inside the step (waits do not overlap on one thread)
    blocked = sum(max(0.0, min(b, e_) - max(a, s)) for a, b in waits)
    # walk the device timeline: a gap the device sat idle, with the host not waiting for it, that
    # ends with an op whose launch returned after the gap began, is the device waiting for the host
    busy = sorted([(d["ts"], d["ts"] + d["dur"], d) for d in dev] + [(a, b, None) for a, b in waits],
                  key=lambda x: x[0])
    inside = [d for d in dev if d["ts"] >= s]
    w0, w1 = inside[0]["ts"], max(d["ts"] + d["dur"] for d in inside)
    wait, end = 0.0, None
    for a, b, d in busy:
        if end is not None and a > end and d is not None and launch_end.get(d["args"].get("correlation"), -np.inf) > end:
            wait += max(0.0, min(a, w1) - max(end, w0))
        end = b if end is None else max(end, b)
    name = step["name"]
    seqs = int(name.split("_context_")[1].split("(")[0]) + int(name.split("_generation_")[1].split("(")[0])
    return {"host_us": step["dur"] - blocked, "device_wait_us": wait, "seqs": seqs}


@pytest.fixture(scope="module")
def raw(shared_traces):
    return {rel: _raw_host(shared_traces / "inference" / rel) for rel in TRACES}


@pytest.mark.parametrize("rel", TRACES)
def test_host_times_match_the_raw_trace(shared_traces, raw, rel):
    """Host busy time (span minus waits on the device) and the device's wait for the host of each
    real serving iteration equal what the raw events give, within 1 µs."""
    rows = host_times(load_trace([shared_traces / "inference" / rel]).trace)
    assert len(rows) == 1
    r, x = rows[0], raw[rel]
    assert abs(r["host_us"] - x["host_us"]) < 1.0, (r["host_us"], x["host_us"])
    assert abs(r["device_wait_us"] - x["device_wait_us"]) < 1.0, (r["device_wait_us"], x["device_wait_us"])
    assert r["prefill_seqs"] + r["decode_seqs"] == x["seqs"]


def test_default_host_overhead_is_the_shared_traces_fit(raw):
    """The default overhead is calibrate's fit on the four shared iterations: their waits do not
    grow with the sequence count (least-squares slope < 0), so the non-negative fit is their mean."""
    seqs = np.array([raw[r]["seqs"] for r in TRACES], float)
    wait = np.array([raw[r]["device_wait_us"] for r in TRACES])
    assert np.polyfit(seqs, wait, 1)[0] < 0
    assert DEFAULT_HOST["per_seq_us"] == 0.0
    assert abs(DEFAULT_HOST["const_us"] - wait.mean()) < 1.0, (DEFAULT_HOST["const_us"], wait.mean())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_engines_host_overhead_is_its_own_traces_fit(raw, engine):
    """``serve --engine E``: the mean wait of E's iterations (no positive per-sequence trend in
    either pair), from the raw events; vLLM's CUDA-graph iterations keep the GPU fed."""
    rels = [r for r in TRACES if r.startswith(engine)]
    assert len(rels) == 2
    wait = np.array([raw[r]["device_wait_us"] for r in rels])
    h = ENGINE_HOST[engine]
    assert h["per_seq_us"] == 0.0 and abs(h["const_us"] - wait.mean()) < 0.1, (h, wait)
    assert StepCost("llama3-8b", dims={"L": 1}, engine=engine).host["const_us"] == h["const_us"]
    with pytest.raises(ValueError, match="unknown engine"):
        StepCost("llama3-8b", dims={"L": 1}, engine="tgi")


def test_serve_engine_option(tmp_path):
    args = ["serve", "--model", "llama3-8b", "--dim", "L=2", "--rate", "2", "--duration", "2", "--json", "--quiet"]
    res = CliRunner().invoke(main, [*args, "--engine", "vllm"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["engine"]["host_overhead"]["const_us"] == ENGINE_HOST["vllm"]["const_us"]
    bad = CliRunner().invoke(main, [*args, "--engine", "tgi"])
    assert bad.exit_code == 2 and "tgi" in bad.output


def test_calibrate_writes_the_host_overhead(shared_traces, raw, tmp_path):
    """calibrate --serving on the two SGLang iterations: the fit's host part reproduces their waits
    (two sequence counts: constant + per-sequence term, or the constant alone when the slope is < 0)."""
    rels = TRACES[:2]
    out = tmp_path / "fit.json"
    res = CliRunner().invoke(main, ["calibrate", "--serving", *[str(shared_traces / "inference" / r) for r in rels],
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    h = json.loads(out.read_text())["host"]
    seqs = np.array([raw[r]["seqs"] for r in rels], float)
    wait = np.array([raw[r]["device_wait_us"] for r in rels])
    slope = (wait[1] - wait[0]) / (seqs[1] - seqs[0])
    if slope >= 0:
        assert abs(h["per_seq_us"] - slope) < 0.1 and abs(h["const_us"] - (wait[0] - slope * seqs[0])) < 1.0
    else:
        assert h["per_seq_us"] == 0.0 and abs(h["const_us"] - wait.mean()) < 1.0


@pytest.fixture(scope="module")
def cost8b():
    return StepCost("llama3-8b", system="H100")


def test_host_overhead_raises_tpot_at_low_load(cost8b):
    """One request at a time (arrivals 10 s apart, outputs of 64 tokens): every decode iteration
    carries the overhead once, so TPOT grows by at least h."""
    n = 20
    w = Workload(np.arange(n) * 10.0, np.full(n, 256), np.full(n, 64))
    h = 2.0
    base = simulate_serving("llama3-8b", w, cost=cost8b, host_overhead_ms=0.0).to_json()
    more = simulate_serving("llama3-8b", w, cost=cost8b, host_overhead_ms=h).to_json()
    assert base["options"]["host_overhead_us"] == 0.0
    assert more["tpot_ms"]["p50"] - base["tpot_ms"]["p50"] >= h - 1e-6
    assert more["ttft_ms"]["p50"] - base["ttft_ms"]["p50"] >= h - 1e-6  # the prefill iteration too
    # per sequence: at batch 1 a 1,000 µs/seq term adds 1 ms
    per = simulate_serving("llama3-8b", w, cost=cost8b, host_overhead_ms=0.0, host_per_seq_us=1000.0).to_json()
    assert per["tpot_ms"]["p50"] - base["tpot_ms"]["p50"] >= 1.0 - 1e-6


def test_littles_law_holds_with_host_overhead(cost8b):
    """Poisson arrivals drawn here, 1 ms of host overhead + 20 µs per sequence: the time-average
    number in the system equals rate × mean latency within 5 %."""
    rng = np.random.default_rng(11)
    arr = np.cumsum(rng.exponential(1 / 6.0, 3000))
    w = Workload(arr, rng.integers(64, 1024, len(arr)), rng.integers(16, 256, len(arr)))
    d = simulate_serving("llama3-8b", w, cost=cost8b, host_overhead_ms=1.0, host_per_seq_us=20.0).to_json()
    lam = len(arr) / arr[-1]
    little = lam * d["e2e_ms"]["mean"] / 1e3
    assert d["mean_in_system"] > 1.0
    assert abs(d["mean_in_system"] - little) / little < 0.05, (d["mean_in_system"], little)


def test_negative_host_overhead_is_refused():
    res = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--interval", "1", "--duration", "2",
                                    "--host-overhead-ms", "-1"])
    assert res.exit_code == 2
    assert "--host-overhead-ms" in res.output and len(res.output.strip().splitlines()) == 1
