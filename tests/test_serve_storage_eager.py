"""Serving options of issue 24: KV-cache dtype, weight-only quantized weights, eager execution.

Expected byte counts are written from the model's published dimensions (Llama-3-8B: 32 layers,
hidden 4,096, 32 query heads and 8 KV heads of 128, FFN 14,336, vocabulary 128,256, untied head),
not from the synthesizer.
"""

from __future__ import annotations

import numpy as np
import pytest

from ettools.converters.symbolic import synthesize
from ettools.replay.serve import StepCost, simulate_serving
from ettools.replay.serve.engine import _first_reaching, _run_us
from ettools.replay.serve.workload import Workload

L, H, NH, KV, HD, F, V = 32, 4096, 32, 8, 128, 14336, 128256


def _decode(**kw):
    return synthesize("llama3-8b", {}, phase="decode", batch=1, context=2048, ranks=[0], **kw).stages[0]


def test_kv_dtype_sets_cache_bytes():
    per_token_elems = L * 2 * KV * HD  # keys and values of every layer
    assert _decode().kv_cache_bytes == per_token_elems * 2048 * 2
    assert _decode(kv_dtype="fp8").kv_cache_bytes == per_token_elems * 2048 * 1


def test_weight_only_quantization_keeps_vocab_and_vectors_in_bf16():
    per_layer_matrices = H * NH * HD + 2 * H * KV * HD + NH * HD * H + 3 * H * F
    vectors = L * 2 * H + H  # two norms per layer, the final norm
    vocab = 2 * V * H  # embedding and the untied LM head
    bf16 = _decode().resident_bytes
    assert bf16 == 2 * (L * per_layer_matrices + vectors + vocab)
    int4 = _decode(weight_dtype="int4").resident_bytes
    assert int4 == pytest.approx(L * per_layer_matrices * 4.25 / 8 + 2 * (vectors + vocab), rel=1e-9)
    assert _decode(weight_dtype="fp8").resident_bytes == L * per_layer_matrices + 2 * (vectors + vocab)


def test_storage_dtypes_are_inference_only_and_named():
    with pytest.raises(ValueError, match="inference"):
        synthesize("llama3-8b", {"L": 2}, kv_dtype="fp8", ranks=[0])
    with pytest.raises(ValueError, match="weight_dtype 'int3'"):
        _decode(weight_dtype="int3")


def test_fp8_cache_speeds_long_context_decode_and_int4_small_batch_decode():
    base = StepCost("llama3-8b", system="H100")
    fp8kv = StepCost("llama3-8b", system="H100", kv_dtype="fp8")
    int4 = StepCost("llama3-8b", system="H100", weight_dtype="int4")
    # attention over the cache reads half the bytes; weights unchanged
    assert fp8kv.alpha_us < 0.75 * base.alpha_us
    assert fp8kv.weights_bytes == base.weights_bytes
    assert fp8kv.kv_capacity_tokens(0.9) == pytest.approx(2 * base.kv_capacity_tokens(0.9), rel=1e-6)
    # a batch-1 decode step is a read of the weights: int4 reads ~1/3.4 of the matrices' bytes
    assert int4.iteration_us(1, 1, 0, 0) < 0.75 * base.iteration_us(1, 1, 0, 0)
    assert int4.kv_capacity_tokens(0.9) > base.kv_capacity_tokens(0.9)


def test_eager_launch_floor_is_linear_in_layers_and_not_shrunk_by_tp():
    def launch(layers: int, tp: int = 1) -> float:
        return StepCost("llama3-8b", dims={"L": layers}, tp=tp, system="H100", cuda_graphs=False).launch_us

    a, b, c = launch(4), launch(8), launch(12)
    assert a > 0 and b - a == pytest.approx(c - b, rel=1e-9)  # one layer's launches, whatever the depth
    graphs = StepCost("llama3-8b", dims={"L": 8}, tp=8, system="H100")
    eager = StepCost("llama3-8b", dims={"L": 8}, tp=8, system="H100", cuda_graphs=False)
    assert graphs.launch_us == 0.0
    one = eager.iteration_us(1, 1, 0, 0)
    # a batch-1 decode at TP 8 is host-bound: the launch floor plus the host overhead, not the device time
    assert one == pytest.approx(eager.launch_us + eager.host_us(1), rel=1e-9)
    assert one > graphs.iteration_us(1, 1, 0, 0)
    assert eager.describe()["eager_launch_us"] == eager.launch_us


def test_run_us_matches_iteration_by_iteration_sum():
    rng = np.random.default_rng(3)
    for _ in range(200):
        A, B, S0, inc = rng.uniform(10, 500), rng.uniform(0, 0.05), rng.uniform(0, 1e5), rng.integers(1, 64)
        F = rng.choice([0.0, rng.uniform(0, 3000)])
        j = int(rng.integers(1, 400))
        brute = sum(max(A + B * (S0 + inc * i), F) for i in range(j))
        assert _run_us(j, A, B, S0, inc, F) == pytest.approx(brute, rel=1e-9)
        delta = rng.uniform(0, brute * 1.2)
        k = _first_reaching(j, delta, A, B, S0, inc, F)
        sums = np.cumsum([max(A + B * (S0 + inc * i), F) for i in range(j)])
        want = int(np.argmax(sums >= delta)) + 1 if (sums >= delta).any() else j
        assert k == want


def test_eager_serving_tpot_is_the_floor_when_host_bound():
    eager = StepCost("llama3-8b", dims={"L": 8}, tp=8, system="H100", cuda_graphs=False)
    w = Workload(np.zeros(1), np.array([64]), np.array([200]))
    r = simulate_serving("llama3-8b", w, gpus=8, tp=8, cost=eager).to_json()
    assert r["tpot_ms"]["mean"] * 1e3 == pytest.approx(eager.launch_us + eager.host_us(1), rel=1e-3)
