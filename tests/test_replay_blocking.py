"""Host calls that block on the device, and one rank of a larger job (issue 11, mechanisms 2 and 3).

``hta_16rank_blocking_memcpy``: each step's host thread blocks ~146 ms in a ``cudaMemcpyAsync`` to
pageable host memory whose copy runs 2 µs: the copy waits for its stream, which waits (through
events the trace does not name) for the compute stream. ``hta_8rank_rank3``: rank 3 of an 8-rank
job, its NCCL kernels' peers absent. Every expected value is read from the raw gzip JSON here.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters.kineto import read_kineto
from ettools.graph import COMM_NODE_TYPES
from ettools.replay import replay_trace

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
BLOCKING = "kineto/hta_16rank_blocking_memcpy"
RANK3 = "kineto/hta_8rank_rank3"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

pytestmark = pytest.mark.skipif(not (SHARED / BLOCKING).exists(), reason="shared traces not present")


@functools.cache
def raw(name: str) -> list[dict]:
    (path,) = sorted((SHARED / name).glob("*.json.gz"))
    return read_json(path)["traceEvents"]


@functools.cache
def trace(name: str):
    return read_kineto(SHARED / name)


@functools.cache
def replay(name: str, device: float = 1.0):
    return replay_trace(trace(name), what_if={"device": device} if device != 1.0 else None)


def raw_steps(name: str) -> list[tuple[float, float]]:
    """``(ts, dur)`` of every ``ProfilerStep#N`` in the file, in time order."""
    return sorted((float(e["ts"]), float(e["dur"])) for e in raw(name)
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))


@pytest.mark.parametrize("name", [BLOCKING, RANK3])
def test_self_replay_matches_every_measured_step(name):
    measured = [d for _, d in raw_steps(name)]
    assert len(measured) >= 5
    (rr,) = replay(name).ranks.values()
    assert len(rr.steps_us) == len(measured)
    mean_err = (np.mean(rr.steps_us) - np.mean(measured)) / np.mean(measured)
    assert abs(mean_err) < 0.02, f"mean step off by {100 * mean_err:+.2f} %"
    for i, (rep, meas) in enumerate(zip(rr.steps_us, measured)):
        assert abs(rep - meas) / meas < 0.05, f"step {i}: replayed {rep:.0f} µs, measured {meas:.0f} µs"


def _blocking_copy_calls(name: str) -> list[dict]:
    """Host ``cudaMemcpyAsync``/``hipMemcpyAsync`` calls whose copy goes to pageable host memory."""
    ev = raw(name)
    d2h = {e["args"]["correlation"] for e in ev if e.get("cat") == "gpu_memcpy"
           and "Pageable" in e["name"] and "DtoH" in e["name"].replace(" ", "")}
    return [e for e in ev if e.get("cat") == "cuda_runtime" and e["name"].endswith("MemcpyAsync")
            and e.get("args", {}).get("correlation") in d2h]


def _replayed_call_spans(res, corr: list[int]) -> np.ndarray:
    """Replayed time from the start of each host call (by correlation id) to the end of its last piece."""
    (r,) = res.built.preps
    g = res.built.preps[r].graph
    st, en = res.replayed_times(r)
    ccol, ocol = g.attrs["correlation"], g.attrs["orig"]
    row_of_corr = dict(zip(np.asarray(ccol.values).tolist(), ccol.rows.tolist()))
    pieces: dict[int, list[int]] = {}
    for row, oid in zip(ocol.rows.tolist(), np.asarray(ocol.values).tolist()):
        pieces.setdefault(int(oid), []).append(row)
    out = []
    for c in corr:
        head = row_of_corr[c]
        rows = [head] + pieces.get(int(g.id[head]), [])
        out.append(float(en[rows].max() - st[head]))
    return np.array(out)


def test_blocking_copy_waits_for_the_device_like_the_trace():
    calls = [e for e in _blocking_copy_calls(BLOCKING) if e["dur"] > 10_000]  # the long waits
    assert len(calls) >= 5
    spans = _replayed_call_spans(replay(BLOCKING), [e["args"]["correlation"] for e in calls])
    measured = np.array([float(e["dur"]) for e in calls])
    # the host is held in the call until the copy's stream (and what it waits for) is done
    assert np.all(np.abs(spans - measured) < 0.05 * measured), list(zip(spans, measured))


def test_halving_device_time_shortens_the_host_bound_step():
    steps = raw_steps(BLOCKING)
    base = list(replay(BLOCKING).ranks.values())[0].steps_us
    fast = list(replay(BLOCKING, 0.5).ranks.values())[0].steps_us
    # device compute time per step (not NCCL: a collective with absent peers keeps its time)
    dev = [(float(e["ts"]), float(e["dur"])) for e in raw(BLOCKING)
           if e.get("cat") in DEVICE_CATS and "nccl" not in e["name"].lower()]
    for i, (ts, dur) in enumerate(steps):
        busy = sum(d for s, d in dev if ts <= s < ts + dur)
        saved = base[i] - fast[i]
        # the blocking copy waits less: the step shrinks, by no more than the device time saved
        assert saved > 0.25 * (0.5 * busy), f"step {i}: saved {saved:.0f} µs of {0.5 * busy:.0f} µs"
        assert saved <= 0.5 * busy * 1.05, f"step {i}: saved {saved:.0f} µs > half the device time {0.5 * busy:.0f}"
    calls = [e for e in _blocking_copy_calls(BLOCKING) if e["dur"] > 10_000]
    corr = [e["args"]["correlation"] for e in calls]
    before = _replayed_call_spans(replay(BLOCKING), corr)
    after = _replayed_call_spans(replay(BLOCKING, 0.5), corr)
    assert after.sum() < before.sum()


def test_one_rank_of_a_larger_job_keeps_collectives_measured():
    ev = raw(RANK3)
    nccl = [e for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    res = replay(RANK3)
    kept = res.to_json()["kept_measured"]
    # every NCCL kernel in the replayed steps is a collective whose peers are absent (world of 8)
    assert 0 < kept["collectives_peers_absent"] <= len(nccl)
    assert "collectives whose peers are absent" in res.summary_text()
    # kept as measured: the replay's comm nodes last what the file says
    (r,) = res.built.preps
    g = res.built.preps[r].graph
    st, en = res.replayed_times(r)
    comm = np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES]))
    ccol = g.attrs["correlation"]
    corr_of = dict(zip(ccol.rows.tolist(), np.asarray(ccol.values).tolist()))
    dur_of = {e["args"]["correlation"]: float(e["dur"]) for e in nccl}
    checked = 0
    for row in comm.tolist():
        c = corr_of.get(row)
        if c in dur_of:
            # measured, plus the stream's per-op gap the replay adds to every device op (a few µs)
            assert 0 <= en[row] - st[row] - dur_of[c] <= 5.0
            checked += 1
    assert checked == kept["collectives_peers_absent"]
