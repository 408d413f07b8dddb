"""Decode attention (flash-decoding, paged attention: one query per sequence over a KV cache) timed
as its kernels stream the cache: fitted on Vidur's measured A100 decode kernels, moved term by term
to a GPU whose kernels measured none. Measured times and bandwidths are read from the raw table."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from ettools.replay.compute import load_hardware
from ettools.replay.opclass import DECODE_KEY, ClassFit
from ettools.replay.opmodel import OpModel, _figures, cross_validate
from ettools.replay.opsamples import vidur_decode_samples

TABLE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur_profiling" / "compute" / "a100" / "attention.csv"


def _decode_rows() -> list[dict[str, str]]:
    if not TABLE.exists():
        pytest.skip("no Vidur attention table")
    return [r for r in csv.DictReader(TABLE.open())
            if r["is_prefill"] == "False" and float(r["time_stats.attn_decode.median"] or 0) > 0]


def _cache_bytes(r: dict[str, str]) -> float:
    """K and V bytes of one row's cache (fp16; KV heads per TP rank, at least one)."""
    tp = int(r["num_tensor_parallel_workers"])
    d = int(r["n_embd"]) // int(r["n_q_head"])
    return 2.0 * 2 * int(r["batch_size"]) * int(r["kv_cache_size"]) * max(int(r["n_kv_head"]) // tp, 1) * d


def test_decode_fit_predicts_unseen_cache_lengths():
    """Held out by cache length (fit on the others): MAPE <= 20 %, each held-out band's total time
    within 15 %, and the fitted bandwidth no higher than the A100's data sheet."""
    rows = _decode_rows()
    cols = vidur_decode_samples(TABLE).arrays()
    assert len(cols["dur"]) == len(rows)
    assert np.allclose(np.sort(cols["dur"]), np.sort([float(r["time_stats.attn_decode.median"]) * 1e3 for r in rows]))
    hw = load_hardware("A100")
    res = cross_validate(cols, "A100", hw, hw.sms)
    pc = res["per_class"][DECODE_KEY]
    assert pc["predicted"] == len(rows) and pc["mape_pct"] <= 20.0, pc
    assert len(res["per_group"]) == 3
    for g, v in res["per_group"].items():
        assert abs(v["error_pct"]) <= 15.0, (g, v)
    fit = OpModel.fit(cols, "A100", hw, hw.sms).classes[DECODE_KEY]
    assert fit.form == "memory" and 0 < fit.W <= hw.hbm_gbps * 1e9


def _model(gpu: str, **classes: ClassFit) -> OpModel:
    hw = load_hardware(gpu)
    return OpModel(gpu, _figures(hw), hw.sms, {k.replace("__", "_"): c for k, c in classes.items()})


def test_borrowed_decode_fit_moves_by_the_memory_classes_and_stays_in_vendor():
    """A GPU without decode kernels takes the same-vendor donor's measured fit, its floor and
    bandwidth moved by the two memory classes' ratios; another vendor's fit is never lent, and a
    donor's own borrowed fit is not passed on."""
    a100 = _model("A100", memory=ClassFit("memory", 3.0, 1.0e12, n=50, sizes=50),
                  attention__decode=ClassFit("memory", 15.0, 1.6e12, n=50, sizes=50))
    mi300x = _model("MI300X", memory=ClassFit("memory", 5.0, 2.0e12, n=50, sizes=50),
                    attention__decode=ClassFit("memory", 20.0, 2.2e12, n=50, sizes=50))
    h100 = _model("H100", memory=ClassFit("memory", 2.0, 1.8e12, n=50, sizes=50))
    h100.borrow_decode([mi300x, a100], load_hardware("H100"))
    got = h100.classes[DECODE_KEY]
    assert got.transferred_from == "A100"
    assert got.W == pytest.approx(1.6e12 * 1.8 / 1.0, rel=1e-9)
    assert got.a == pytest.approx(15.0 * 2.0 / 3.0, rel=1e-9)
    mi250 = _model("MI250", memory=ClassFit("memory", 6.0, 1.0e12, n=50, sizes=50))
    mi250.borrow_decode([a100], load_hardware("MI250"))
    assert DECODE_KEY not in mi250.classes  # an NVIDIA kernel library says nothing of ROCm's
    v100 = _model("V100", memory=ClassFit("memory", 4.0, 0.7e12, n=50, sizes=50))
    v100.borrow_decode([h100], load_hardware("V100"))
    assert DECODE_KEY not in v100.classes  # H100's is itself borrowed


def test_h100_decode_streams_the_cache_as_a100s_measured_kernels_do():
    """No H100 decode kernel was measured: a large decode step's attention on H100 reaches, of the
    H100's data-sheet bandwidth, the share A100's measured decode kernels reach of A100's on caches
    of 100 MB or more (within 15 %), where the memory class alone left it at about half."""
    from ettools.converters.symbolic import synthesize
    from ettools.replay.api import replay_trace

    rows = [r for r in _decode_rows() if _cache_bytes(r) >= 1e8]
    assert len(rows) >= 100
    a100 = load_hardware("A100")
    share_a100 = float(np.median([_cache_bytes(r) / (float(r["time_stats.attn_decode.median"]) * 1e-3)
                                  / (a100.hbm_gbps * 1e9) for r in rows]))
    r = synthesize("llama3-70b", {}, tp=2, phase="decode", batch=64, context=4096)
    res = replay_trace(r.trace, system="H100", symmetric=True, memory=False)
    a, z = res.rank_nodes(0)
    g = res.built.preps[res.built.rep_of[0]].graph
    dur = np.nan_to_num(res.built.program.dur[a:z])
    attn = np.array([g.strings[i].startswith("attention ") for i in g.name])
    assert attn.sum() == 80  # one per layer
    cache = 2.0 * 2 * 64 * 4096 * (8 // 2) * 128  # K and V, bf16, 4 KV heads per rank
    got = cache / (dur[attn] * 1e-6) / (load_hardware("H100").hbm_gbps * 1e9)
    assert np.all(np.abs(got / share_a100 - 1.0) <= 0.15), (got.min(), got.max(), share_a100)


def test_serve_says_where_decode_attention_is_timed_from():
    """A serving run names its step costs' source: H100's decode attention borrowed from A100's
    measured kernels, MI300X's (no AMD decode kernel measured) on its memory class."""
    from ettools.replay.serve import StepCost

    h100 = StepCost("llama3-8b", dims={"L": 2}, system="H100").describe()["step_costs"]
    assert "attention_decode from the A100 fit moved to it" in h100 and "memory class" not in h100
    mi = StepCost("llama3-8b", dims={"L": 2}, system="MI300X").describe()["step_costs"]
    assert "attention_decode" not in mi and "decode attention by the memory class" in mi
    roof = StepCost("llama3-8b", dims={"L": 2}, system="H100", timing="roofline").describe()["step_costs"]
    assert "roofline" in roof and "op models" not in roof
