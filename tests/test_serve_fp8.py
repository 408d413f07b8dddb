"""FP8 serving as engines run FP8 checkpoints (W8A8), issue 24.

``--dtype fp8`` for an inference step means what TensorRT-LLM, vLLM and SGLang do with an FP8
checkpoint: FP8 weights and linear-layer GEMMs, each GEMM input quantized by a kernel of its own,
BF16 activations, norms, residual adds and tensor-parallel all-reduces, the KV cache in FP8. (The
shared B200 vLLM TP 8 trace shows it: ``scaled_fp8_quant`` kernels before its GEMMs, BF16 norms and
BF16 all-reduces.) Expected byte counts are written from Llama-3-8B's published dimensions (32
layers, hidden 4,096, 32 query and 8 KV heads of 128, FFN 14,336, vocabulary 128,256, untied head),
not from the synthesizer.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from ettools.converters.symbolic import synthesize
from ettools.graph import NodeType
from ettools.replay.serve import StepCost

L, H, NH, KV, HD, F, V = 32, 4096, 32, 8, 128, 14336, 128256
TOKENS = 512


def _prefill(dtype: str, tp: int = 2, **kw):
    return synthesize("llama3-8b", {}, phase="prefill", batch=1, seq=TOKENS, tp=tp, dtype=dtype, ranks=[0], **kw)


def _nodes(res, prefix: str) -> tuple[np.ndarray, list[str]]:
    g = res.rank_graph(0)
    names = g.names()
    rows = np.array([i for i, n in enumerate(names) if n.startswith(prefix)], np.int64)
    return rows, [names[i] for i in rows]


def test_fp8_serving_keeps_bf16_all_reduces_and_norms_and_says_so():
    bf, f8 = _prefill("bf16"), _prefill("fp8")
    assert any("W8A8" in n for n in f8.notes)
    for res in (bf, f8):
        g = res.rank_graph(0)
        coll = np.flatnonzero(g.type == int(NodeType.COMM_COLL_NODE))
        sizes = {int(g.comm_bytes[i]) for i in coll if int(g.comm_bytes[i]) > 0}
        # the two per-layer TP all-reduces of the residual stream: tokens × hidden in BF16
        assert TOKENS * H * 2 in sizes, sorted(sizes)
    for prefix in ("rmsnorm", "add"):
        rb, _ = _nodes(bf, prefix)
        r8, _ = _nodes(f8, prefix)
        assert len(rb) == len(r8) > 0
        assert np.array_equal(bf.rank_graph(0).tensor_size[rb], f8.rank_graph(0).tensor_size[r8])


def test_fp8_serving_quantizes_each_gemm_input_once_and_not_the_lm_head():
    res = _prefill("fp8", tp=1)
    rows, names = _nodes(res, "fp8_cast")
    # per layer: the attention input (read by Q, K and V), the attention output (O), the MLP input
    # (gate and up) and the SwiGLU output (down): four quantize kernels
    assert len(names) == 4 * L, len(names)
    g = res.rank_graph(0)
    # each reads BF16 activations (tokens × width × 2) and writes FP8 (× 1), no transpose
    widths = {H, NH * HD, F}
    for i in rows:
        b = int(g.tensor_size[i])
        assert any(b == TOKENS * w * 3 for w in widths), (g.names()[i], b)
    col = g.attrs.get("compute_dtype")
    fp8_rows = {int(r) for r, v in zip(col.rows, col.values) if v == "fp8"}
    gemms = [i for i, n in enumerate(g.names()) if n.startswith("matmul")]
    head = [i for i in gemms if "head" in g.names()[i] or "lm" in g.names()[i]]
    assert head and not (set(head) & fp8_rows)
    assert set(gemms) - set(head) == fp8_rows


def test_fp8_serving_stores_fp8_weights_and_cache():
    f8 = synthesize("llama3-8b", {}, phase="decode", batch=1, context=2048, dtype="fp8", ranks=[0]).stages[0]
    per_layer_matrices = H * NH * HD + 2 * H * KV * HD + NH * HD * H + 3 * H * F
    vectors = L * 2 * H + H
    vocab = 2 * V * H  # embedding and LM head stay BF16
    assert f8.resident_bytes == L * per_layer_matrices + 2 * (vectors + vocab)
    assert f8.kv_cache_bytes == L * 2 * KV * HD * 2048 * 1
    kv16 = synthesize("llama3-8b", {}, phase="decode", batch=1, context=2048, dtype="fp8", kv_dtype="bf16",
                      ranks=[0]).stages[0]
    assert kv16.kv_cache_bytes == 2 * f8.kv_cache_bytes


def test_fp8_prefill_is_faster_than_bf16_but_not_by_the_peak_ratio():
    """Only the GEMMs run at the FP8 rate; quantize kernels and the BF16 rest cost as before."""
    bf = StepCost("llama3-8b", system="H100", dims={"L": 4})
    f8 = StepCost("llama3-8b", system="H100", dims={"L": 4}, dtype="fp8")
    t_bf, t_f8 = bf.body_us(4096), f8.body_us(4096)
    assert t_bf / 2 < t_f8 < t_bf


def test_the_shared_b200_vllm_trace_quantizes_before_gemms_in_bf16_otherwise(shared_traces):
    """The mechanism's evidence, read off the raw trace: FP8 quantize kernels, BF16 norm kernels and
    BF16 all-reduce kernels in the same prefill."""
    path = shared_traces / "inference" / "tracelens_b200_vllm_tp8" / "rank0.json.gz"
    if not path.exists():
        pytest.skip("trace absent")
    names = [e["name"] for e in json.load(gzip.open(path))["traceEvents"] if e.get("cat") == "kernel"]
    quant = [n for n in names if "fp8_quant" in n]
    ar = [n for n in names if "all_reduce" in n]
    norm = [n for n in names if "rms_norm" in n or "fused_add_rms_norm" in n or "_typeConvert<c10::BFloat16" in n]
    assert quant and ar and norm
    assert all("BFloat16" in n for n in ar)
