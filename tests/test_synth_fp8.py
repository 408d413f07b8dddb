"""FP8 training as Transformer Engine does it (``synth --gemm-dtype fp8``, and ``--dtype fp8``):
the linear layers' GEMMs -- forward, dgrad, wgrad -- run FP8 math on operands cast (and
transposed) by their own kernels, weights are cast once per step, and everything else (attention,
norms, the output layer, the stored activations and weights) stays BF16. MFU is quoted against
the dense BF16 peak, with the FP8 peak's figure beside it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ettools.converters.chakra import read_chakra, write_chakra
from ettools.converters.symbolic.synth import synthesize
from ettools.replay import replay_trace
from ettools.replay.compute import presets

DIMS = {"L": 2, "H": 2048, "F": 8192, "S": 2048}


def _synth(**kw):
    return synthesize("gpt3-1.3b", DIMS, tp=2, batch=2, micro_batch=1, **kw)


def _fp8_rows(g) -> set[int]:
    c = g.attrs.get("compute_dtype")
    return set() if c is None else {int(r) for r, v in zip(c.rows, c.values) if v == "fp8"}


def test_only_the_linear_layers_gemms_run_fp8():
    g = _synth(gemm_dtype="fp8").rank_graph(0)
    names = g.names()
    fp8 = {names[r] for r in _fp8_rows(g)}
    layer_gemms = {n for n in names if n.startswith("matmul") and "gpt_block." in n}
    assert fp8 == layer_gemms and any("dgrad" in n for n in fp8) and any("wgrad" in n for n in fp8)
    assert not any("gpt_head" in n or n.startswith("attention") for n in fp8)
    # per layer and micro-batch: the four GEMM inputs in the forward (LN1 out, attention out, LN2
    # out, GeLU out), the four output gradients in the backward (each shared by its dgrad and
    # wgrad; the wgrad reads the FP8 transpose its forward kept); per layer per step: the weights
    casts = Counter(n for n in names if n.startswith("fp8_cast"))
    layers_x_mb = 2 * 2
    assert sum(casts.values()) == 8 * layers_x_mb + 2
    assert casts["fp8_cast gpt_block.weights"] == 2


def test_bf16_plan_has_no_fp8_math():
    g = _synth().rank_graph(0)
    assert not _fp8_rows(g) and not any(n.startswith("fp8_cast") for n in g.names())


def test_dtype_fp8_means_transformer_engine_fp8_and_says_so():
    a, b = _synth(dtype="fp8"), _synth(gemm_dtype="fp8")
    ga, gb = a.rank_graph(0), b.rank_graph(0)
    assert np.array_equal(ga.num_ops, gb.num_ops) and np.array_equal(ga.tensor_size, gb.tensor_size)
    assert any("Transformer Engine" in n for n in a.notes)


@pytest.mark.parametrize("gpu", ["H100", "H200", "B200", "MI300X"])
def test_fp8_is_faster_but_less_than_the_peak_ratio(gpu):
    """Only the GEMMs speed up, and not beyond the FP8/BF16 peak ratio; casts and the BF16 rest cost."""
    hw = presets()[gpu]
    ratio = hw["peak_tflops"]["fp8"] / hw["peak_tflops"]["bf16"]
    bf, f8 = (replay_trace(_synth(**kw).trace, system=gpu) for kw in ({}, {"gemm_dtype": "fp8"}))
    t_bf, t_f8 = bf.ranks[0].step_time_us, f8.ranks[0].step_time_us
    assert t_bf / ratio < t_f8 < t_bf
    r = f8.ranks[0]
    assert r.mfu_peak.startswith("bf16 dense")
    assert r.mfu_fp8_peak is not None and abs(r.mfu_fp8_peak * ratio - r.mfu) < 1e-9


def test_fp8_on_a_gpu_without_fp8_is_refused():
    with pytest.raises(ValueError, match="no FP8"):
        replay_trace(_synth(gemm_dtype="fp8").trace, system="A100")
    with pytest.raises(ValueError, match="no FP8"):
        replay_trace(_synth(gemm_dtype="fp8").trace, system="A100", timing="roofline")


def test_fp8_marks_survive_chakra(tmp_path):
    res = _synth(gemm_dtype="fp8")
    paths = write_chakra(res.trace, tmp_path, name="t")
    back = read_chakra([p for p in paths if p.suffix == ".et"], comm_group=tmp_path / "comm_group.json")
    assert _fp8_rows(back.graphs[0]) == _fp8_rows(res.rank_graph(0))


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8", "fp32"])
def test_no_mfu_above_100_percent_on_any_preset(dtype):
    """A GEMM-heavy plan (large hidden, long sequence) on every preset with that dtype's math."""
    res = synthesize("gpt3-1.3b", {"L": 2, "H": 8192, "F": 32768, "S": 4096}, tp=1, batch=1, micro_batch=1,
                     dtype=dtype)
    for name, hw in presets().items():
        if dtype == "fp8" and not hw.get("peak_tflops", {}).get("fp8"):
            continue
        r = replay_trace(res.trace, system=name).ranks[0]
        assert 0 < r.mfu <= 1.0, (name, dtype, r.mfu)
        assert r.hfu is None or r.hfu <= 1.0, (name, dtype, r.hfu)
