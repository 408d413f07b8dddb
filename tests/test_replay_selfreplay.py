"""Replay of the real GPU traces: self-replay within 2 % of the measured step (or whole-trace) time,
and what-if responses that follow physics rather than the measured start times."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

from ettools.converters.kineto import read_kineto
from ettools.formats import load_trace
from ettools.replay import replay_trace

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_kineto import gpu_traces, read_json, trace_files  # noqa: E402

# every Kineto trace with device work under ../shared/traces, found by reading the files (a folder
# of rank files is one job), so traces added there are tested without a code change
GPU_TRACES = gpu_traces(SHARED)


@functools.cache
def load(name: str):
    """The trace, read once per test session."""
    return read_kineto(SHARED / name)


@functools.cache
def base_replay(name: str):
    return replay_trace(load(name))


def raw_files(name: str) -> list[Path]:
    return trace_files(name, SHARED)


@functools.lru_cache(maxsize=2)
def raw_events(path: Path) -> list[dict]:
    """The file's events, parsed once for the several raw readings of one file (read, never
    changed; the last two files kept)."""
    return read_json(path)["traceEvents"]


def raw_steps(path: Path) -> list[float]:
    """``ProfilerStep#N`` durations read straight from the file, in step order."""
    steps = [(e["ts"], float(e["dur"])) for e in raw_events(path)
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]  # host annotations, not their device copies
    return [d for _, d in sorted(steps)]


def raw_step_window(path: Path) -> tuple[float, float] | None:
    """``(first ProfilerStep start, last ProfilerStep end)`` on the host, from the file."""
    steps = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in raw_events(path)
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    return (min(a for a, _ in steps), max(b for _, b in steps)) if steps else None


@functools.lru_cache(maxsize=2)
def raw_annotation_steps(path: Path) -> list[float]:
    """Durations of the top-level ``user_annotation`` spans of the thread that launches most device
    work, when they hold at least half of its launches (the reader's steps without ProfilerStep)."""
    ev = [e for e in raw_events(path) if e.get("ph") == "X"]
    dev_corr = {e["args"]["correlation"] for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                and "correlation" in (e.get("args") or {})}
    launches = [e for e in ev if e.get("cat") == "cuda_runtime" and (e.get("args") or {}).get("correlation") in dev_corr]
    if not launches:
        return []
    tids = [e["tid"] for e in launches]
    main = max(set(tids), key=tids.count)
    host = [e for e in ev if e.get("tid") == main and e.get("cat") in ("cpu_op", "user_annotation", "python_function", "cuda_runtime")]
    anns = [a for a in host if a["cat"] == "user_annotation" and not any(
        h is not a and (h["ts"], -h["dur"]) < (a["ts"], -a["dur"]) and h["ts"] + h["dur"] >= a["ts"] + a["dur"] for h in host)]
    mine = [e["ts"] for e in launches if e["tid"] == main]
    inside = sum(1 for t in mine if any(a["ts"] <= t < a["ts"] + a["dur"] for a in anns))
    return [float(a["dur"]) for a in sorted(anns, key=lambda a: a["ts"])] if anns and 2 * inside >= len(mine) else []


def raw_device_busy(path: Path) -> tuple[float, float, float]:
    """``(first device start, last device end, union of device busy time)`` from the file (µs)."""
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in raw_events(path)
                if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += (cur_e - cur_s) if cur_e is not None else 0.0
    return iv[0][0], max(e for _, e in iv), busy


@pytest.mark.parametrize("name", GPU_TRACES)
def test_self_replay_within_2_percent(shared_traces, name):
    res = base_replay(name)
    trace = load(name)
    files = raw_files(name)
    assert sorted(res.ranks) == trace.ranks
    for rank, path in zip(trace.ranks, files):
        rr = res.ranks[rank]
        assert rr.simulated_as == rank and rr.form == "kineto"
        # the measured span covers the file's steps (events outside them are dropped, and counted),
        # or every device op of a file without steps
        window = raw_step_window(path)
        if window is None:
            d0, d1, _ = raw_device_busy(path)
            window = (d0, d1)
        assert rr.measured_span_us >= (window[1] - window[0]) - 1.0
        assert "outside_steps" in trace.graphs[rank].meta or raw_step_window(path) is None
        assert abs(rr.span_us - rr.measured_span_us) <= 0.02 * rr.measured_span_us, (
            f"rank {rank}: span replayed {rr.span_us:.0f} vs measured {rr.measured_span_us:.0f}")
        steps = raw_steps(path)
        if steps:
            assert rr.measured_steps_us == pytest.approx(steps, abs=0.5)  # ts are large floats
            mean = float(np.mean(steps))
            assert abs(rr.step_time_us - mean) <= 0.02 * mean, (
                f"rank {rank}: step replayed {rr.step_time_us:.0f} vs measured {mean:.0f}")
            for i, (got, want) in enumerate(zip(rr.steps_us, steps, strict=True)):  # every step within 5 %
                assert abs(got - want) <= 0.05 * want, f"rank {rank} step {i}: {got:.0f} vs {want:.0f}"
        elif raw_annotation_steps(path):  # no ProfilerStep: the annotated spans are the steps
            assert rr.measured_steps_us == pytest.approx(raw_annotation_steps(path), abs=0.5)
            mean = float(np.mean(rr.measured_steps_us))
            assert abs(rr.step_time_us - mean) <= 0.02 * mean
        else:
            assert rr.step_time_us == rr.span_us
    js = res.to_json()
    assert js["measured_step_time_us"] == pytest.approx(max(r.measured_step_time_us for r in res.ranks.values()))


def test_what_if_faster_kernels_gpu_bound(shared_traces):
    """Halving every kernel of the GPU-bound trace shortens it by about half its GPU-busy time."""
    name = "kineto/hta_fwdbwd_1rank"
    base = base_replay(name).ranks[0]
    half = replay_trace(load(name), what_if={"device": 0.5}).ranks[0]
    d0, d1, busy = raw_device_busy(raw_files(name)[0])
    assert busy / base.measured_span_us > 0.9  # GPU-bound indeed
    gain = base.span_us - half.span_us
    assert gain == pytest.approx(busy / 2, rel=0.05), f"gain {gain:.0f} µs vs half the GPU-busy {busy / 2:.0f} µs"
    # steady-state steps get about twice as fast (the host's unblocked launches keep up)
    assert np.mean(half.steps_us[2:]) < 0.55 * np.mean(base.steps_us[2:])


def test_what_if_faster_kernels_host_bound_barely_helps(shared_traces):
    name = "kineto/hta_nccl_2rank"
    base = base_replay(name).ranks[0]
    half = replay_trace(load(name), what_if={"device": 0.5}).ranks[0]
    _, _, busy = raw_device_busy(raw_files(name)[0])
    gain = base.span_us - half.span_us
    assert 0 <= gain < 0.1 * busy / 2


def test_what_if_longer_host_gaps_host_bound(shared_traces):
    """Doubling the host idle gaps of the host-bound trace lengthens it by the gaps on its critical
    threads (the main thread and the autograd thread that launch the work)."""
    name = "kineto/hta_nccl_2rank"
    res = base_replay(name)
    base = res.ranks[0]
    longer = replay_trace(load(name), what_if={"host_gap": 2.0}).ranks[0]
    rg = res.built.preps[0].graph
    names = np.array(rg.names())
    src, dst, kind = rg.edge_rows()
    launching = np.unique(rg.resource[src[(kind == 4) & (src >= 0)]])  # EdgeKind.LAUNCH
    gaps = (names == "host_gap") & np.isin(rg.resource, launching)
    expected = float(rg.dur[gaps].sum())
    assert expected > 10_000  # tens of ms of gaps on those threads
    assert longer.span_us - base.span_us == pytest.approx(expected, rel=0.1)


def test_gpu_bound_trace_barely_feels_host_gaps(shared_traces):
    name = "kineto/hta_fwdbwd_1rank"
    base = base_replay(name).ranks[0]
    longer = replay_trace(load(name), what_if={"host_gap": 2.0}).ranks[0]
    assert abs(longer.span_us - base.span_us) < 0.01 * base.span_us


def test_launch_queue_and_cross_thread_waits_modelled(shared_traces):
    res = base_replay("kineto/hta_fwdbwd_1rank")
    p = res.built.preps[0]
    src_meta = load("kineto/hta_fwdbwd_1rank")[0].meta
    assert p.notes["launch_queue_depth"] >= src_meta["launch_queue_depth"]
    assert p.notes["launch_blocked_shortened"] == src_meta["launch_blocked"]
    assert len(p.start_dep_dst) > 0  # launches gated on the start of the op Q places earlier
    assert p.graph.meta["cross_thread_waits"] >= 1  # main thread waits for the autograd thread


SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@pytest.mark.parametrize("scenario,tol", [("single", 0.02), ("ddp", 0.02), ("tp_sp", 0.06), ("fsdp", 0.12),
                                          ("moe_ep", 0.02), ("pp_gpipe", 0.06), ("pp_1f1b", 0.06)])
def test_sample_captures_self_replay(scenario, tol):
    """The 2-rank CPU (gloo) captures read from Kineto alone, collectives and send/recv matched across
    ranks. Pipeline captures are looser: gloo moves the data inside ``c10d::send`` (replayed as host
    work) and its ``gloo:send`` span only times the ``wait()``. The all-gather-heavy TP+SP and FSDP
    steady-state steps replay 4-12 % short from Kineto alone (measured: tp_sp -3.7/-5.2 %, fsdp
    -7.8/-11.6 %): the gloo runloop's waits between back-to-back collectives are not all modelled;
    linked with their execution traces they replay within 2 % (next test)."""
    trace = read_kineto(SAMPLES / scenario)
    res = replay_trace(trace)
    n_comm = sum(int(np.isin(g.type, [5, 6, 7]).sum()) for g in trace)
    assert res.built.local_comm == 0 and len(res.built.program.instances) * (1 if n_comm else 0) <= n_comm
    for r, rr in res.ranks.items():
        steps = raw_steps(SAMPLES / scenario / f"rank{r}.kineto.json.gz")
        assert rr.measured_steps_us == pytest.approx(steps, abs=0.5)
        assert abs(rr.step_time_us - rr.measured_step_time_us) <= tol * rr.measured_step_time_us


@pytest.mark.parametrize("scenario", ["tp_sp", "fsdp"])
def test_sample_captures_linked_self_replay(scenario):
    trace = load_trace([SAMPLES / scenario]).trace  # ET + Kineto, linked
    res = replay_trace(trace)
    for rr in res.ranks.values():
        assert abs(rr.step_time_us - rr.measured_step_time_us) <= 0.02 * rr.measured_step_time_us
