"""Contention in the replay: an op timed by a fitted model runs slower while a transfer of its rank
is in flight, by the contention slope of its class in the shipped fit (read here from the JSON file),
never for measured durations, not when nothing overlaps, not with ``contention=False``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ettools.converters.symbolic import synthesize
from ettools.graph import CollectiveType, EdgeKind, GraphBuilder, NodeType, ProcessGroup, new_trace
from ettools.replay import replay_trace

AR = int(CollectiveType.ALL_REDUCE)
FIT = Path(__file__).resolve().parents[1] / "replay" / "data" / "op_models" / "A100.json"
T_AR = 1000.0  # measured all-reduce span (µs): the transfer time of the instance


def _gemm_c() -> float:
    """The GEMM class's contention slope of the shipped A100 fit (shape-free form: no shapes here)."""
    return float(json.loads(FIT.read_text())["classes"]["gemm"]["contention"])


def _trace(build, n: int = 2):
    tr, strings = new_trace("hand built", n)
    tr.meta.add_group(ProcessGroup("world", tuple(range(n))))
    for r in range(n):
        b = GraphBuilder(r, strings)
        build(b)
        tr.graphs[r] = b.build()
    return tr


def _gemm_beside_ar(flops: float, gemm_dur: float = math.nan, after_ar: bool = False, ar_after_host: float = 0.0):
    """Per rank: an all-reduce (measured T_AR) and an unmeasured ``aten::mm`` of ``flops`` FLOPs,
    both free at time 0 (``after_ar``: the GEMM waits for the all-reduce; ``ar_after_host``: the
    all-reduce waits for a measured host op of that length, so it starts while the GEMM runs)."""
    nbytes = int(flops / 200)  # compute-bound traffic

    def build(b):
        b.add_node("ar", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=1 << 20, comm_group="world",
                   dur=T_AR, resource="stream 9")
        b.add_node("aten::mm", dur=gemm_dur, is_cpu_op=0, num_ops=int(flops), tensor_size=nbytes,
                   resource="stream 7")
        if after_ar:
            b.add_dep(1, 0, EdgeKind.CTRL)
        if ar_after_host:
            b.add_node("host", dur=ar_after_host, is_cpu_op=1, resource="thread 1")
            b.add_dep(0, 2, EdgeKind.CTRL)
    return _trace(build)


def _gemm_times(res):
    st, en = res.replayed_times(0)
    return float(st[1]), float(en[1])


def _alone(tr) -> float:
    """The GEMM's modelled duration without contention (same model, ``contention=False``)."""
    s, e = _gemm_times(replay_trace(tr, system="A100", contention=False))
    return e - s


@pytest.mark.parametrize("flops", [2e9, 2e11])
def test_modelled_gemm_beside_all_reduce_slows_by_the_fitted_slope(flops):
    c = _gemm_c()
    assert c > 0
    tr = _gemm_beside_ar(flops)
    d = _alone(tr)
    assert d > 0
    res = replay_trace(tr, system="A100")
    s, e = _gemm_times(res)
    assert s == 0.0
    # rate 1/(1+c) while the all-reduce (0..T_AR) runs, full rate after
    if d * (1 + c) <= T_AR:
        want = d * (1 + c)
    else:
        want = T_AR + (d - T_AR / (1 + c))
    assert e == pytest.approx(want, rel=1e-9)
    # both regimes are exercised by the two sizes
    assert (d * (1 + c) <= T_AR) == (flops < 1e10)
    # two ranks (alike: one simulated under symmetry, counted for both)
    assert res.contention_totals() == (pytest.approx(2 * (want - d), rel=1e-9), 2)
    assert res.to_json()["contention_us"] == pytest.approx(2 * (want - d), rel=1e-9)
    full = replay_trace(tr, system="A100", symmetric=False)
    assert full.schedule.contention_us == pytest.approx(2 * (want - d), rel=1e-9)
    assert "contention with transfers" in res.summary_text()


def test_transfer_starting_while_the_op_runs_slows_its_rest():
    c = _gemm_c()
    host = 100.0
    tr = _gemm_beside_ar(2e11, ar_after_host=host)
    d = _alone(tr)
    assert d > host + T_AR / (1 + c)  # still running when the all-reduce ends
    res = replay_trace(tr, system="A100")
    _, e = _gemm_times(res)
    assert res.schedule.inst_start[0] == host
    left = d - host  # work left when the all-reduce starts
    assert e == pytest.approx(host + T_AR + (left - T_AR / (1 + c)), rel=1e-9)


def test_measured_duration_is_never_slowed():
    tr = _gemm_beside_ar(2e11, gemm_dur=700.0)
    res = replay_trace(tr, system="A100")
    s, e = _gemm_times(res)
    assert (s, e) == (0.0, 700.0)
    assert res.schedule.contention_us == 0.0 and res.to_json()["contention_us"] == 0.0
    assert "contention with transfers" not in res.summary_text()


def test_no_overlap_no_change_and_switch_off():
    tr = _gemm_beside_ar(2e11, after_ar=True)
    d = _alone(tr)
    res = replay_trace(tr, system="A100")
    s, e = _gemm_times(res)
    assert s == T_AR and e == pytest.approx(T_AR + d, rel=1e-12)
    assert res.schedule.contention_us == 0.0
    off = replay_trace(_gemm_beside_ar(2e11), system="A100", contention=False)
    assert _gemm_times(off) == (0.0, pytest.approx(d, rel=1e-12))
    assert off.schedule.contention_us == 0.0 and off.options["contention"] is False


def test_synthesized_dp_step_with_overlapped_all_reduce_gets_longer():
    syn = synthesize("gpt3-125m", dp=2, batch=4, micro_batch=2, ranks=[0, 1])
    on = replay_trace(syn.trace, system="A100")
    off = replay_trace(syn.trace, system="A100", contention=False)
    total, _ops = on.contention_totals()
    assert total > 0
    # the step grows by at most one rank's added time (the two DP ranks alike: half the total)
    assert off.step_time_us < on.step_time_us <= off.step_time_us + total / 2 + 1e-6
