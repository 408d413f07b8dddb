"""Device work in every form (issue 11, mechanism 5) and the traces it broke: the 2021 Kineto format,
a device-only trace, kernels launched by CUDA/HIP graph launches, serving traces whose steps are
annotations, single files named after their GPU, and NCCL/RCCL kernels launched outside the trace.

Every expected value is read here from the raw gzip JSON, never from the reader under test.
"""

from __future__ import annotations

import collections
import functools
import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters.kineto import read_kineto
from ettools.graph import NodeType
from ettools.replay import replay_trace
from ettools.summary import rank_summary

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LEGACY_DEVICE = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime")

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="shared traces not present")


def path_of(name: str) -> Path:
    p = SHARED / name
    return sorted(p.glob("*.json.gz"))[0] if p.is_dir() else p


@functools.cache
def raw(name: str) -> dict:
    return read_json(path_of(name))


def complete(name: str) -> list[dict]:
    return [e for e in raw(name)["traceEvents"] if e.get("ph") == "X"]


@functools.cache
def replayed(name: str):
    trace = read_kineto(path_of(name))
    return trace, replay_trace(trace)


def raw_profiler_steps(name: str) -> list[float]:
    """Host ``ProfilerStep#N`` durations in time order (any category but the device copies)."""
    ev = [e for e in complete(name) if str(e.get("name", "")).startswith("ProfilerStep#")
          and e.get("cat") != "gpu_user_annotation"]
    return [float(e["dur"]) for e in sorted(ev, key=lambda e: e["ts"])]


def raw_annotation_steps(name: str) -> list[float]:
    """The top-level ``user_annotation`` spans of the thread that launched most device work."""
    ev = complete(name)
    dev_corr = {e["args"]["correlation"] for e in ev if e.get("cat") in DEVICE_CATS
                and "correlation" in (e.get("args") or {})}
    launches = [e for e in ev if e.get("cat") == "cuda_runtime" and (e.get("args") or {}).get("correlation") in dev_corr]
    tids = collections.Counter(e["tid"] for e in launches)
    main = tids.most_common(1)[0][0]
    host = [e for e in ev if e.get("tid") == main and e.get("cat") in HOST_CATS]
    anns = [a for a in host if a["cat"] == "user_annotation" and not any(
        h is not a and (h["ts"], -h["dur"]) < (a["ts"], -a["dur"]) and h["ts"] + h["dur"] >= a["ts"] + a["dur"]
        for h in host)]
    return [float(a["dur"]) for a in sorted(anns, key=lambda a: a["ts"])]


def check_steps(name: str, measured: list[float], mean_tol: float, step_tol: float) -> None:
    trace, res = replayed(name)
    (rank,) = trace.ranks
    rr = res.ranks[rank]
    assert rr.measured_steps_us == pytest.approx(measured, abs=0.5)
    mean = float(np.mean(measured))
    assert abs(rr.step_time_us - mean) <= mean_tol * mean, f"mean step {rr.step_time_us:.0f} vs {mean:.0f} µs"
    for got, want in zip(rr.steps_us, measured):
        assert abs(got - want) <= step_tol * want, f"step {got:.0f} vs {want:.0f} µs"


# ---- the 2021 format ------------------------------------------------------------------------------

LEGACY = "kineto/tb_resnet50_v100_legacy"


def test_legacy_categories_are_mapped(caplog):
    ev = complete(LEGACY)
    cats = collections.Counter(e.get("cat") for e in ev)
    assert cats["Runtime"] and cats["Kernel"] and cats["Memcpy"] and cats["Memset"]  # the old spellings
    with caplog.at_level(logging.WARNING):
        trace = read_kineto(path_of(LEGACY))
    assert "unknown categories" not in caplog.text
    g = trace[0]
    got = collections.Counter(g.attr("cat").values)
    # the whole file (six steps, nothing outside them that launches): every kernel, copy, set and
    # runtime call of the file is a node
    steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]
    s0 = min(e["ts"] for e in steps)
    s1 = max(e["ts"] + e["dur"] for e in steps)
    runtime_in = sum(1 for e in ev if e.get("cat") == "Runtime" and s0 <= e["ts"] < s1)
    assert got["Runtime"] == runtime_in
    launched = {e["args"]["correlation"] for e in ev if e.get("cat") == "Runtime" and s0 <= e["ts"] < s1}
    for old in LEGACY_DEVICE:
        want = sum(1 for e in ev if e.get("cat") == old and e["args"].get("correlation") in launched)
        assert got[old] == want > 0, old
    assert int((g.is_cpu_op == 0).sum()) == sum(got[c] for c in LEGACY_DEVICE)


def test_legacy_steps_found_and_replayed():
    measured = raw_profiler_steps(LEGACY)
    assert len(measured) == 6
    check_steps(LEGACY, measured, 0.02, 0.05)


# ---- device-only trace ----------------------------------------------------------------------------

GPU_ONLY = "kineto/tracelens_mi210_gpu_only"


def test_gpu_only_trace_keeps_every_kernel_and_replays():
    ev = complete(GPU_ONLY)
    assert not any(e.get("cat") in ("cpu_op", "python_function") for e in ev)  # no CPU ops at all
    trace, res = replayed(GPU_ONLY)
    g = trace[0]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert int((g.is_cpu_op == 0).sum()) == len(kernels)
    assert sorted(g.dur[g.is_cpu_op == 0].tolist()) == pytest.approx(sorted(float(e["dur"]) for e in kernels))
    t0 = min(e["ts"] for e in ev if e.get("cat") in ("kernel", "cuda_runtime"))
    t1 = max(e["ts"] + e["dur"] for e in ev if e.get("cat") in ("kernel", "cuda_runtime"))
    rr = res.ranks[0]
    assert rr.measured_span_us == pytest.approx(t1 - t0, abs=1.0)
    assert abs(rr.span_us - (t1 - t0)) <= 0.02 * (t1 - t0)


def _kernels_only(tmp_path: Path) -> tuple[Path, list[dict]]:
    """The device-only trace with its runtime calls removed too: kernels alone."""
    data = dict(raw(GPU_ONLY))
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") not in ("cuda_runtime", "ac2g")]
    p = tmp_path / "kernels_only.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(data, f)
    return p, [e for e in data["traceEvents"] if e.get("cat") == "kernel"]


def test_kernels_only_trace_keeps_its_idle_gaps(tmp_path):
    """With no host event at all, the idle time between kernels is host-launch-bound time: it is
    kept (stand-in launches), so the replay spans what the kernels spanned, and halving every kernel
    saves at most their busy time, never the gaps."""
    p, kernels = _kernels_only(tmp_path)
    trace = read_kineto(p)
    g = trace[0]
    assert int((g.is_cpu_op == 0).sum()) == len(kernels)
    t0 = min(e["ts"] for e in kernels)
    t1 = max(e["ts"] + e["dur"] for e in kernels)
    busy = sum(float(e["dur"]) for e in kernels)  # one stream: kernels do not overlap
    assert t1 - t0 > 1.05 * busy  # there are idle gaps to keep
    base = replay_trace(trace).ranks[0]
    assert abs(base.span_us - (t1 - t0)) <= 0.02 * (t1 - t0)
    half = replay_trace(trace, what_if={"device": 0.5}).ranks[0]
    assert (t1 - t0) - busy / 2 - 1.0 <= half.span_us < base.span_us


# ---- CUDA/HIP graph launches and serving traces --------------------------------------------------

INFERENCE = [
    "inference/sglang_qwen3_8b_mi300x/decode_bs32.json.gz",
    "inference/sglang_qwen3_8b_mi300x/prefill_extend_bs15.json.gz",
    "inference/vllm_mi300x_cudagraphs/decode_full_graph_execution.json.gz",
    "inference/vllm_mi300x_cudagraphs/prefilldecode_piecewise_graph_execution.json.gz",
]


GRAPH_LAUNCHES = [n for n in INFERENCE if "prefill_extend" not in n]  # SGLang's prefill runs eagerly


@pytest.mark.parametrize("name", GRAPH_LAUNCHES)
def test_graph_launched_kernels_all_present_with_device_time(name):
    ev = complete(name)
    graph_calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"
                   and e["name"] in ("hipGraphLaunch", "cudaGraphLaunch")}
    assert graph_calls
    by_corr = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") in DEVICE_CATS:
            by_corr[e["args"].get("correlation")].append(e)
    launched = [k for c in graph_calls for k in by_corr[c]]
    assert len(launched) > len(graph_calls)  # one launch, many kernels
    trace, _ = replayed(name)
    (rank,) = trace.ranks
    g = trace[rank]
    corr = g.attr("correlation")
    rows = np.array([r for r, v in zip(corr.rows.tolist(), corr.values) if v in graph_calls], np.int64)
    rows = rows[g.is_cpu_op[rows] == 0]
    assert len(rows) == len(launched)
    assert sorted(g.dur[rows].tolist()) == pytest.approx(sorted(float(e["dur"]) for e in launched))
    # each launched by its graph launch call
    src, dst, kind = g.edge_rows()
    launch_of = dict(zip(dst[kind == 4].tolist(), src[kind == 4].tolist()))  # EdgeKind.LAUNCH
    names = g.names()
    assert all(names[launch_of[int(r)]] in ("hipGraphLaunch", "cudaGraphLaunch") for r in rows)


@pytest.mark.parametrize("name", INFERENCE)
def test_inference_annotated_execute_spans_replay_within_5_percent(name):
    assert not raw_profiler_steps(name)
    measured = raw_annotation_steps(name)
    assert measured
    check_steps(name, measured, 0.05, 0.05)


# ---- hardware pairs: rank and step --------------------------------------------------------------

PAIRS = [f"hardware_pairs/{m}/{gpu}.json.gz" for m in ("qwen1.5_0.5b", "bert_small", "falconsai_vit")
         for gpu in ("h100", "mi300x")]


@pytest.mark.parametrize("name", PAIRS)
def test_hardware_pair_is_rank_0_and_replays_its_step(name):
    assert "distributedInfo" not in raw(name)
    trace, _ = replayed(name)
    assert trace.ranks == [0]  # "h100" / "mi300x" in a lone file's name are not ranks
    measured = raw_profiler_steps(name)
    assert len(measured) == 1
    check_steps(name, measured, 0.02, 0.05)


# ---- NCCL/RCCL kernels launched outside the trace -------------------------------------------------

ORPHANS = ["kineto/tracelens_mi300x_resnet_ddp8", "kineto/hta_16rank_blocking_memcpy"]


@pytest.mark.parametrize("name", ORPHANS)
def test_orphan_nccl_kernels_stay_collectives(name):
    ev = complete(name)
    runtime_corr = {e["args"].get("correlation") for e in ev if e.get("cat") == "cuda_runtime"}
    nccl = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith(("nccl", "rccl"))]
    orphans = {e["args"]["correlation"] for e in nccl if e["args"].get("correlation") not in runtime_corr}
    assert orphans  # the case under test is in the file
    trace = read_kineto(path_of(name))
    (rank,) = trace.ranks
    g = trace[rank]
    corr = g.attr("correlation")
    rows = np.array([r for r, v in zip(corr.rows.tolist(), corr.values) if v in orphans], np.int64)
    rows = rows[g.is_cpu_op[rows] == 0]
    assert len(rows)
    assert np.all(g.type[rows] == NodeType.COMM_COLL_NODE)  # never COMP
    # a size the trace does not give is unknown (-1), counted and shown, never a silent 0
    assert not np.any(g.comm_bytes[rows] == 0)
    unknown = int((g.comm_bytes[rows] < 0).sum())
    s = rank_summary(g)
    assert s["comm_unknown_size"] >= unknown
    assert g.meta["comm_bytes_unknown"] == s["comm_unknown_size"]


def test_info_shows_collectives_with_unknown_size():
    from click.testing import CliRunner

    from ettools.cli import main

    out = CliRunner().invoke(main, ["info", str(SHARED / ORPHANS[0])])
    assert out.exit_code == 0, out.output
    assert "collectives with unknown size" in out.output
