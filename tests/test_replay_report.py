"""What a replay hands the CLI: the JSON contract, the summary, the Chrome timeline, the plot."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from ettools.converters.kineto import read_kineto
from ettools.converters.symbolic import synthesize
from ettools.replay import replay_trace


@pytest.fixture(scope="module")
def synth_result():
    res = synthesize("gpt3-5b", dims={"L": 4}, dp=2, tp=2, pp=2, batch=8, micro_batch=2)
    return res, replay_trace(res.trace, symmetric=True)


def test_json_contract(synth_result):
    res, rep = synth_result
    js = json.loads(rep.json_bytes())
    assert isinstance(js["step_time_us"], float) and js["step_time_us"] > 0
    assert "measured_step_time_us" not in js  # synthesized: nothing measured
    assert sorted(js["ranks"], key=int) == [str(r) for r in range(8)]
    for d in js["ranks"].values():
        for key in ("step_time_us", "compute_us", "comm_us", "exposed_comm_us"):
            assert isinstance(d[key], float)
        assert isinstance(d["peak_memory_bytes"], int) and d["peak_memory_bytes"] > 0
        assert d["exposed_comm_us"] <= d["comm_us"] + 1e-9
        assert d["compute_us"] + d["exposed_comm_us"] + d["idle_us"] == pytest.approx(d["span_us"], rel=1e-9)
    assert js["step_time_us"] == max(d["step_time_us"] for d in js["ranks"].values())
    assert js["critical_path"]["length_us"] == pytest.approx(js["step_time_us"])
    assert sum(js["critical_path"]["by_class_us"].values()) == pytest.approx(js["step_time_us"], rel=1e-6)
    assert rep.json_bytes() == rep.json_bytes()  # deterministic
    assert 0 < js["ranks"]["0"]["mfu"] < 1


def test_measured_json_and_summary(shared_traces):
    tr = read_kineto(shared_traces / "kineto" / "hta_amd_mi250")
    rep = replay_trace(tr)
    js = rep.to_json()
    assert js["measured_step_time_us"] == pytest.approx(np.mean(tr.graphs[0].meta["step_times_us"]))
    assert abs(js["error_pct"]) < 2
    text = rep.summary_text()
    assert "replayed step time" in text and "measured" in text and "critical path" in text


def test_timeline_is_chrome_json(tmp_path, synth_result):
    _, rep = synth_result
    out = rep.write_timeline(tmp_path / "timeline.json")
    doc = orjson.loads(out.read_bytes())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == rep.built.program.n  # one event per simulated node
    assert {e["pid"] for e in xs} == set(rep.built.sim_ranks)
    ends = [e["ts"] + e["dur"] for e in xs]
    assert max(ends) == pytest.approx(rep.step_time_us)
    # starts are the replayed ones, not the graph's (synthesized graphs have none)
    r0 = rep.built.sim_ranks[0]
    st, _ = rep.replayed_times(r0)
    assert sorted(e["ts"] for e in xs if e["pid"] == r0) == pytest.approx(sorted(st.tolist()))


def test_plot(tmp_path, synth_result):
    pytest.importorskip("matplotlib")
    _, rep = synth_result
    out = rep.plot(tmp_path / "breakdown.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
