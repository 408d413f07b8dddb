"""Compute timing: hardware presets, roofline, the fallback chain, and the calibrated model (fit on half
of param_resnet's kernels, predict the other half; fit on one trace, predict another)."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from ettools.converters.kineto import read_kineto
from ettools.converters.symbolic import synthesize
from ettools.errors import TraceError
from ettools.graph import AttrColumn, NodeType
from ettools.replay import Fit, calibrate, replay_trace
from ettools.replay.calibrate import kernel_samples, mape
from ettools.replay.compute import load_hardware, presets

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
PRESETS_FILE = Path(__file__).resolve().parents[1] / "replay" / "hardware" / "presets.json"


def with_launch_geometry(trace, path: Path):
    """Attach each kernel's ``grid``/``block`` (int64_list attributes, joined on ``correlation``).

    Stand-in for the Kineto reader, which does not keep the launch geometry yet; the calibrated
    model uses these attributes whenever a graph carries them.
    """
    with gzip.open(path, "rb") as f:
        events = json.load(f)["traceEvents"]
    geo = {e["args"]["correlation"]: (e["args"]["grid"], e["args"]["block"]) for e in events
           if e.get("cat") == "kernel" and "grid" in e.get("args", {})}
    for g in trace:
        corr = g.attrs["correlation"]
        rows, gv, bv = [], [], []
        for r, c in zip(corr.rows.tolist(), corr.values):
            if g.is_cpu_op[r] == 0 and c in geo:
                rows.append(r)
                gv.append(geo[c][0])
                bv.append(geo[c][1])
        g.attrs["grid"] = AttrColumn("int64_list", np.asarray(rows, np.int64), gv)
        g.attrs["block"] = AttrColumn("int64_list", np.asarray(rows, np.int64), bv)
    return trace


@functools.cache
def kineto_with_geometry(rel: str):
    path = SHARED / rel
    return with_launch_geometry(read_kineto(path), path)


def test_presets_are_data():
    raw = json.loads(PRESETS_FILE.read_text())
    assert {"A100", "H100", "H200", "B200", "MI300X"} <= set(presets())
    for name in ("A100", "H100", "H200", "B200", "MI300X"):
        hw = load_hardware(name)
        assert hw["peak_tflops"] == raw[name]["peak_tflops"] and hw["hbm_gbps"] == raw[name]["hbm_gbps"]
        assert hw["memory_bytes"] == raw[name]["memory_bytes"] and hw["preset"] == name
    hw = load_hardware({"hardware": "A100", "peak_tflops": {"bf16": 100.0}, "memory_bytes": 123})
    assert hw["peak_tflops"]["bf16"] == 100.0 and hw["peak_tflops"]["fp32"] == raw["A100"]["peak_tflops"]["fp32"]
    assert hw["memory_bytes"] == 123
    with pytest.raises(TraceError, match="unknown hardware preset 'Z9'"):
        load_hardware({"hardware": "Z9"})


@pytest.mark.parametrize("preset", ["H100", "MI300X"])
def test_roofline_timing(preset):
    res = synthesize("gpt3-5b", dims={"L": 2}, tp=2, batch=1, micro_batch=1)
    rep = replay_trace(res.trace, system=preset, timing="roofline")
    raw = json.loads(PRESETS_FILE.read_text())[preset]
    peak, bw = raw["peak_tflops"]["bf16"] * 1e12, raw["hbm_gbps"] * 1e9
    p = rep.built.preps[0]
    g = p.graph
    comp = (g.type == NodeType.COMP_NODE) & ((g.num_ops >= 0) | (g.tensor_size >= 0))
    f = np.where(g.num_ops >= 0, g.num_ops / peak, np.nan)
    b = np.where(g.tensor_size >= 0, g.tensor_size / bw, np.nan)
    want = np.fmax(f, b)[comp] * 1e6
    assert np.allclose(p.dur[comp], want, rtol=1e-12)
    assert rep.ranks[0].duration_sources.get("roofline", 0) == int(comp.sum())
    # ASTRA-sim's system keys drive roofline too
    rep2 = replay_trace(res.trace, collectives={"roofline-enabled": 1, "peak-perf": 500, "local-mem-bw": 1000})
    f2 = np.where(g.num_ops >= 0, g.num_ops / 500e12, np.nan)
    b2 = np.where(g.tensor_size >= 0, g.tensor_size / 1000e9, np.nan)
    assert np.allclose(rep2.built.preps[0].dur[comp], np.fmax(f2, b2)[comp] * 1e6, rtol=1e-12)


def test_measured_falls_back_to_roofline():
    res = synthesize("gpt3-5b", dims={"L": 1}, batch=1, micro_batch=1)
    tr = res.trace
    g = tr.graphs[0]
    dur = g.dur.copy()
    comp = np.flatnonzero(g.type == NodeType.COMP_NODE)
    dur[comp[:3]] = np.nan  # no measurement for these
    tr.graphs[0] = g.replace(dur=dur)
    tr.graphs[0].meta.pop("durations")  # the others stand for measurements (synthesized ones are estimates)
    rep = replay_trace(tr, timing="measured")
    src = rep.ranks[0].duration_sources
    # unmeasured ops: the GPU's fitted op model (roofline only where no fit applies)
    assert sum(src.get(k, 0) for k in ("fitted", "transferred", "roofline", "none")) == 3


def test_calibrated_half_split_param_resnet():
    """Fit on a random half of param_resnet's kernels, predict the other half: MAPE <= 10 %."""
    tr = kineto_with_geometry("et_kineto/param_resnet/kineto.json.gz")
    s = kernel_samples(tr)
    # every kernel, memcpy and memset with a measured time (integer-µs traces have some 0 µs ones)
    assert len(s) == int(sum(((g.is_cpu_op == 0) & (g.dur > 0)).sum() for g in tr))
    errs = []
    for seed in (0, 1):
        half = np.random.default_rng(seed).random(len(s)) < 0.5
        fit = Fit.from_samples(s.subset(half))
        test = s.subset(~half)
        errs.append(mape(fit.predict_samples(test), test.dur))
    print(f"param_resnet half/half MAPE: {errs}")
    assert max(errs) <= 10.0
    # without the launch table (linear in threads per kernel name) it generalizes, less precisely
    fit.by_launch = {}
    lin = mape(fit.predict_samples(test), test.dur)
    print(f"param_resnet half/half MAPE, linear model only: {lin:.1f}")
    assert lin < 30.0


def test_calibrated_across_traces():
    """Fit on ResNet (param_resnet), predict other models; the errors are reported, not targets."""
    fit = calibrate(kineto_with_geometry("et_kineto/param_resnet/kineto.json.gz"))
    out = {}
    for rel in ("et_kineto/param_linear/kineto.json.gz", "et_kineto/triosim_vgg13_h100/kineto.json.gz"):
        s = kernel_samples(kineto_with_geometry(rel))
        out[rel] = mape(fit.predict_samples(s), s.dur)
    print(f"cross-trace MAPE (fit on param_resnet): {out}")
    assert all(np.isfinite(v) for v in out.values())
    # same GPU (RTX 2080 Ti) transfers better than another GPU (H100)
    assert out["et_kineto/param_linear/kineto.json.gz"] < out["et_kineto/triosim_vgg13_h100/kineto.json.gz"]


def test_fit_file_round_trip_and_calibrated_replay(tmp_path):
    tr = kineto_with_geometry("et_kineto/param_resnet/kineto.json.gz")
    fit = calibrate(tr)
    path = fit.save(tmp_path / "resnet.fit.json")
    again = Fit.load(path)
    s = kernel_samples(tr)
    assert np.array_equal(fit.predict_samples(s), again.predict_samples(s))
    d = json.loads(path.read_text())
    assert d["format"] == "ettools-compute-fit" and d["samples"] == len(s)
    assert path.stat().st_size < 200_000  # a small file
    base = replay_trace(tr)
    cal = replay_trace(tr, timing=f"calibrated:{path}")
    assert cal.ranks[0].duration_sources == {"calibrated": int((tr.graphs[0].is_cpu_op == 0).sum())}
    assert cal.step_time_us == pytest.approx(base.step_time_us, rel=0.05)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(TraceError, match="not an ettools compute fit"):
        Fit.load(bad)
    with pytest.raises(ValueError, match="calibrated:PATH"):
        replay_trace(tr, timing="calibrated")
