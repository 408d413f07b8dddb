"""Rank skew and collective rendezvous (issue 11, mechanism 1).

Ranks start in the replay where their traces start, on the job's clock; a collective member ends no
earlier than the last member's arrival plus the transfer; ``align_ranks`` gives the no-skew answer
and the report states the skew it replayed. Expected values are read straight from the raw gzip
files, never from the code under test.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters.kineto import read_kineto
from ettools.replay import replay_trace
from ettools.replay.engine import COLL, COMPUTE, Instance, Program, simulate

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
DLRM = SHARED / "et_kineto" / "param_dlrm_8rank" / "kineto"
STEP = "ProfilerStep#10"

pytestmark = pytest.mark.skipif(not DLRM.is_dir(), reason="shared traces not available")


@functools.cache
def raw(rank: int) -> dict:
    """The raw Kineto JSON of one DLRM rank."""
    return read_json(DLRM / f"rank{rank}.json.gz")


def raw_step(rank: int) -> tuple[float, float]:
    """``(start on the common clock, duration)`` of the rank's ProfilerStep#10, in µs. Newer Kineto
    writes ``ts`` relative to ``baseTimeNanoseconds``; older files hold wall-clock µs."""
    d = raw(rank)
    base = float(d.get("baseTimeNanoseconds", 0)) / 1000.0
    (ev,) = [e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("name") == STEP]
    return base + float(ev["ts"]), float(ev["dur"])


def raw_nccl_kernels(rank: int) -> list[tuple[float, float]]:
    """``(ts, dur)`` of the rank's NCCL kernels inside its step, in time order."""
    s, d = raw_step(rank)
    base = float(raw(rank).get("baseTimeNanoseconds", 0)) / 1000.0
    ks = sorted((base + float(e["ts"]), float(e["dur"])) for e in raw(rank)["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl"))
    return [k for k in ks if s <= k[0] <= s + d]


RANKS = sorted(int(p.name[4:].split(".")[0]) for p in DLRM.glob("rank*.json.gz")) if DLRM.is_dir() else []


@functools.cache
def replays():
    tr = read_kineto(DLRM)
    return tr, replay_trace(tr), replay_trace(tr, align_ranks=True)


@pytest.mark.parametrize("rank", RANKS)
def test_each_rank_self_replays_within_2_percent_of_its_own_step(rank):
    _, res, _ = replays()
    measured = raw_step(rank)[1]
    got = res.ranks[rank].step_time_us
    assert abs(got - measured) <= 0.02 * measured, f"rank {rank}: replayed {got:.0f} µs vs measured {measured:.0f} µs"


def test_skew_reported_is_the_spread_of_step_entries():
    tr, res, aligned = replays()
    starts = [raw_step(r)[0] for r in RANKS]
    spread = max(starts) - min(starts)
    assert spread > 1000.0  # the run did have skew (ranks entered the step ms apart)
    assert res.rank_skew_us == pytest.approx(spread, abs=1.0)
    assert res.to_json()["rank_skew_us"] == pytest.approx(spread, abs=1.0)
    assert f"rank skew replayed: {spread:,.0f} µs" in res.summary_text()
    # each rank starts at its own entry, relative to the first rank's
    rel = res.rank_releases_us
    for r, s in zip(RANKS, starts):
        assert rel[r] == pytest.approx(s - min(starts), abs=1.0)
    assert aligned.rank_skew_us == 0.0 and aligned.to_json()["align_ranks"] is True


def test_align_ranks_is_between_own_busy_time_and_the_skewed_step():
    """Without skew the job is no slower than with it, and no faster than the busiest rank's own
    work: its measured step minus the time its NCCL kernels waited for peers (each kernel's time
    beyond the shortest kernel of the same collective, which waited least: a lower bound, as a wait
    may also have overlapped other work)."""
    _, res, aligned = replays()
    assert aligned.step_time_us <= res.step_time_us
    kernels = {r: raw_nccl_kernels(r) for r in RANKS}
    n = {len(k) for k in kernels.values()}
    assert len(n) == 1 and n.pop() > 0  # every rank ran the same collectives
    shortest = np.min(np.array([[d for _, d in kernels[r]] for r in RANKS]), axis=0)
    busy = {r: raw_step(r)[1] - sum(d - m for (_, d), m in zip(kernels[r], shortest)) for r in RANKS}
    assert aligned.step_time_us >= max(busy.values())
    # late ranks no longer hold the early ones: the earliest rank gains the most
    first = min(RANKS, key=lambda r: raw_step(r)[0])
    assert aligned.ranks[first].step_time_us < res.ranks[first].step_time_us - 0.5 * res.rank_skew_us


def test_cli_align_ranks_and_skew_in_json():
    from click.testing import CliRunner

    from ettools.cli import main

    out = {}
    for flag in ([], ["--align-ranks"]):
        r = CliRunner().invoke(main, ["replay", str(DLRM), "--json", *flag])
        assert r.exit_code == 0, r.output
        out[bool(flag)] = json.loads(r.stdout)
    starts = [raw_step(x)[0] for x in RANKS]
    assert out[False]["rank_skew_us"] == pytest.approx(max(starts) - min(starts), abs=1.0)
    assert out[True]["rank_skew_us"] == 0.0
    assert out[True]["step_time_us"] <= out[False]["step_time_us"]
    r = CliRunner().invoke(main, ["replay", str(DLRM), "--align-ranks"])
    assert r.exit_code == 0 and "rank skew replayed: 0 µs" in r.stdout


# ---- synthetic: a collective member cannot end before the last member arrives -------------------

def test_collective_member_waits_for_the_last_arrival():
    """Two ranks, one collective: rank 0 reaches it at once, rank 1 after 100 µs of compute."""
    prog = Program(
        dur=np.array([0.0, 100.0, 0.0]), lane=np.array([0, 1, 2]), kind=np.array([COLL, COMPUTE, COLL], np.int8),
        inst=np.array([0, -1, 0]), succ_ptr=np.array([0, 0, 1, 1]), succ=np.array([2]),
        ssucc_ptr=np.zeros(4, np.int64), ssucc=np.zeros(0, np.int64), indeg=np.array([0, 0, 1]),
        rank_of=np.array([0, 1, 1], np.int32), release=np.zeros(3), inst_dur=np.array([10.0]),
        instances=[Instance(COLL, "all_reduce #0", (0, 1), 2)], ranks=[0, 1], node_row=np.array([0, 0, 1]),
        rank_offset=np.array([0, 1, 3]),
    )
    s = simulate(prog)
    assert s.start[0] == 0.0 and s.start[2] == 100.0
    assert s.end[0] == s.end[2] == 110.0  # the last arrival (100) plus the transfer (10), on both
    # released 50 µs later, the late rank delays the early one by as much
    prog.release = np.array([0.0, 50.0, 50.0])
    s = simulate(prog)
    assert s.end[0] == s.end[2] == 160.0


def _kineto_rank(path: Path, rank: int, base_ns: int, entry: float, kernel_end: float, work: float = 100.0) -> None:
    """A one-step Kineto file: host work, then an NCCL all-reduce launch and a device sync; the
    kernel ends at ``kernel_end`` (µs since ``base_ns``): all members end together, as NCCL does."""
    t = entry + work
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": entry,
         "dur": kernel_end + 5 - entry, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": entry + 1, "dur": work, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2, "dur": 5,
         "args": {"correlation": 10, "cbid": 211}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
         "pid": 0, "tid": 7, "ts": t + 10, "dur": kernel_end - (t + 10), "args": {"correlation": 10, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1, "ts": t + 8,
         "dur": kernel_end + 2 - (t + 8), "args": {"correlation": 11, "cbid": 165}},
    ]
    d = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
         "baseTimeNanoseconds": base_ns, "traceEvents": ev}
    with gzip.open(path, "wt") as f:
        json.dump(d, f)


def test_late_rank_on_another_base_time_delays_its_peer(tmp_path):
    """Rank 1 enters 500 µs after rank 0; its file has a base time 1 s later (ts 1 s smaller), as
    Kineto writes when the ranks' profilers started in different quarters: on the common clock the
    skew is 500 µs, rank 0's kernel waits for rank 1 and ends at rank 1's arrival plus the transfer."""
    base = 1_700_000_000_000_000_000
    arrive1 = 500.0 + 100.0 + 10.0  # rank 1's kernel start, µs since rank 0's base
    transfer = 50.0
    _kineto_rank(tmp_path / "rank0.json.gz", 0, base, 1000.0, 1000.0 + arrive1 + transfer)
    _kineto_rank(tmp_path / "rank1.json.gz", 1, base + 1_000_000_000, 1000.0 - 1e6 + 500.0, 1000.0 - 1e6 + arrive1 + transfer)
    tr = read_kineto(tmp_path)
    res = replay_trace(tr)
    assert res.rank_skew_us == pytest.approx(500.0)
    assert res.ranks[0].step_time_us == pytest.approx(arrive1 + transfer + 5.0, abs=5.0)
    inst_start, inst_end = res.schedule.inst_start[0], res.schedule.inst_end[0]
    assert inst_end - inst_start == pytest.approx(transfer)  # the shortest member: the one that did not wait
    assert inst_start >= 500.0 + 100.0  # not before the late rank got there
    aligned = replay_trace(tr, align_ranks=True)
    assert aligned.rank_skew_us == 0.0
    assert aligned.ranks[0].step_time_us == pytest.approx(res.ranks[1].step_time_us, abs=2.0)
    # ranks released at different times are not symmetric: the symmetric replay agrees
    sym = replay_trace(tr, symmetric=True)
    assert len(sym.built.sim_ranks) == 2
    assert sym.ranks[0].step_time_us == pytest.approx(res.ranks[0].step_time_us)


@pytest.mark.parametrize("kind", ["relative", "offset"])
def test_clocks_recovered_from_collectives(tmp_path, kind):
    """The DLRM files rewritten as if their clocks were lost (each file's ts relative to its own
    first event, no base time) or off (rank r's host clock r × 3 ms ahead): the ends of the NCCL
    collectives, which finish together on every member, put the ranks back on one clock, so the
    skew replayed is still the spread of step entries and every rank self-replays within 2 %."""
    for r in RANKS:
        d = json.loads(json.dumps(raw(r)))
        d.pop("baseTimeNanoseconds", None)
        ts = [e["ts"] for e in d["traceEvents"] if isinstance(e.get("ts"), (int, float))]
        delta = -min(ts) + 10.0 if kind == "relative" else 3000.0 * r
        for e in d["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + delta
        with gzip.open(tmp_path / f"rank{r}.json.gz", "wt") as f:
            json.dump(d, f)
    tr = read_kineto(tmp_path)
    assert tr.meta.extra["rank_clock"] == "collectives"
    res = replay_trace(tr)
    starts = [raw_step(r)[0] for r in RANKS]
    assert res.rank_skew_us == pytest.approx(max(starts) - min(starts), abs=5.0)
    for r in RANKS:
        measured = raw_step(r)[1]
        assert abs(res.ranks[r].step_time_us - measured) <= 0.02 * measured, r
