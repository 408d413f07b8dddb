"""The GPU's kernel-to-kernel gap added to predicted device ops (replay/data/kernel_gaps.json)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from ettools.converters.symbolic import synthesize
from ettools.formats import load_trace
from ettools.graph import NodeType
from ettools.replay.api import replay_trace
from ettools.replay.devices import kernel_gaps, load_hardware

REPO = Path(__file__).resolve().parents[1]
GAPS = json.loads((REPO / "replay" / "data" / "kernel_gaps.json").read_text())["gpus"]


def test_each_measured_gap_is_the_median_of_its_traces_and_current():
    for row in GAPS.values():
        if "borrowed_from" in row:
            assert GAPS[row["borrowed_from"]]["gap_us"] == row["gap_us"]
            continue
        assert row["gap_us"] == pytest.approx(statistics.median(row["per_trace_us"]), abs=1e-4)
    # the file still matches what the reader measures on one of its H100 traces
    t = "sample_traces/hf_h100/bert_base.json.gz"
    i = GAPS["H100"]["traces"].index(t)
    loaded = load_trace([REPO / t])
    g = next(iter(getattr(loaded, "trace", loaded).graphs.values()))
    assert g.meta["stream_gap_us"] == pytest.approx(GAPS["H100"]["per_trace_us"][i], abs=1e-4)
    # NVIDIA GPUs separate back-to-back kernels by about a microsecond
    assert 0.5 < GAPS["H100"]["gap_us"] < 3.0


def _span(trace, system, timing="measured") -> float:
    res = replay_trace(trace, system=system, timing=timing, symmetric=True, memory=False)
    return float(res.schedule.end.max() - res.schedule.start.min())


def test_predicted_kernels_each_pay_the_gap_once():
    r = synthesize("llama3-8b", {"L": 2}, phase="decode", batch=4, context=512)
    n = int((r.trace.graphs[0].type == int(NodeType.COMP_NODE)).sum())
    with_gap = _span(r.trace, "H100")
    without = _span(r.trace, {"hardware": "H100", "kernel_gap_us": 0.0})
    # one stream, no communication at TP 1: every kernel is on the critical path
    assert with_gap - without == pytest.approx(n * kernel_gaps()["H100"]["gap_us"], rel=1e-6)
    # a pure roofline replay stays a roofline
    assert _span(r.trace, "H100", "roofline") == pytest.approx(
        _span(r.trace, {"hardware": "H100", "kernel_gap_us": 0.0}, "roofline"), rel=1e-12)


def test_hardware_says_where_its_gap_comes_from():
    assert "real H100-class traces" in load_hardware("H100")["kernel_gap_source"]
    assert load_hardware({"hardware": "H100", "kernel_gap_us": 2.5})["kernel_gap_source"] == "given"
    borrowed = [k for k, v in GAPS.items() if "borrowed_from" in v]
    for k in borrowed:
        assert "borrowed from" in load_hardware(k)["kernel_gap_source"]
    assert np.isfinite([v["gap_us"] for v in GAPS.values()]).all()
