"""Chrome trace JSON writer (converters/chrome.py)."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections import Counter

import numpy as np
import pytest

from ettools.converters.chrome import asap_start, write_chrome
from ettools.converters.kineto import read_kineto
from ettools.graph import CollectiveType, EdgeKind, GraphBuilder, NodeType, ProcessGroup, new_trace


def timed_trace(ranks=(0, 1, 3)):
    trace, strings = new_trace("test", world_size=4)
    trace.meta.add_group(ProcessGroup("dp", tuple(ranks)))
    for r in ranks:
        b = GraphBuilder(r, strings)
        t = 100.0 * r + 0.123456789
        prev_host = None
        for i in range(4):
            # stream 12 before stream 7 in row order, thread 10 before thread 2: sorting must be numeric
            h = b.add_node(f"cudaLaunchKernel_{i}", start=t + i * 10, dur=2.5,
                           resource="thread 10" if i % 2 else "thread 2", is_cpu_op=1)
            if prev_host is not None:
                b.add_dep(b.last_row, prev_host, EdgeKind.ORDER)
            b.add_node(f"kernel_{i}", start=t + i * 10 + 3.0, dur=4.0,
                           resource="stream 12" if i % 2 else "stream 7", is_cpu_op=0,
                           num_ops=1000 * i, tensor_size=64)
            b.add_dep(b.last_row, h, EdgeKind.LAUNCH)
            prev_host = h
        b.add_node("nccl:all_reduce", NodeType.COMM_COLL_NODE, start=t + 50, dur=7.0, resource="stream 20",
                   is_cpu_op=0, comm_type=CollectiveType.ALL_REDUCE, comm_bytes=4096, comm_group="dp")
        b.add_node("send", NodeType.COMM_SEND_NODE, start=t + 60, dur=1.0, resource="stream 20",
                   is_cpu_op=0, comm_peer=(r + 1) % 4, comm_tag=5, comm_bytes=128)
        trace.graphs[r] = b.build()
    return trace


def load(path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def test_processes_threads_events_and_times(tmp_path):
    trace = timed_trace()
    out = write_chrome(trace, tmp_path / "t.json")
    doc = load(out)
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    per_pid = Counter(e["pid"] for e in xs)
    assert per_pid == {r: len(trace[r]) for r in trace.ranks}
    meta = [e for e in ev if e["ph"] == "M"]
    pnames = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert pnames == {r: f"rank {r}" for r in trace.ranks}
    for r in trace.ranks:
        g = trace[r]
        tnames = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name" and e["pid"] == r}
        # host threads first, numeric order, then streams in numeric order
        assert [tnames[t] for t in sorted(tnames)] == ["thread 2", "thread 10", "stream 7", "stream 12",
                                                      "stream 20"]
        mine = [e for e in xs if e["pid"] == r]
        by_id = {e["args"]["id"]: e for e in mine}
        for n in g.iter_nodes():
            e = by_id[n.id]
            assert e["name"] == n.name and e["ts"] == n.start and e["dur"] == n.dur  # exact floats
            assert tnames[e["tid"]] == n.resource
            assert e["args"]["type"] == n.type.name
            if n.num_ops >= 0:
                assert e["args"]["num_ops"] == n.num_ops
        coll = next(e for e in mine if e["cat"] == "COMM_COLL_NODE")
        assert coll["args"]["comm_type"] == "ALL_REDUCE" and coll["args"]["comm_bytes"] == 4096
        assert coll["args"]["group"] == "dp"
        send = next(e for e in mine if e["cat"] == "COMM_SEND_NODE")
        assert (send["args"]["peer"], send["args"]["tag"]) == ((r + 1) % 4, 5)
    # one flow arrow (start + finish) per LAUNCH edge, both ends at their nodes' times
    launches = sum(int((g.dep_kind == EdgeKind.LAUNCH).sum()) for g in trace)
    s = [e for e in ev if e["ph"] == "s"]
    f = [e for e in ev if e["ph"] == "f"]
    assert len(s) == len(f) == launches
    assert len({e["id"] for e in s}) == launches


def test_gzip_and_deterministic(tmp_path):
    trace = timed_trace()
    a = write_chrome(trace, tmp_path / "a.json.gz")
    b = write_chrome(trace, tmp_path / "b.json.gz")
    assert a.read_bytes()[:2] == b"\x1f\x8b"
    assert a.read_bytes() == b.read_bytes()
    assert load(a) == load(write_chrome(trace, tmp_path / "c.json"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    no_flows = load(write_chrome(trace, tmp_path / "d.json", flows=False))
    assert not [e for e in no_flows["traceEvents"] if e["ph"] in "sf"]


def test_asap_layout_for_untimed_graphs():
    trace, strings = new_trace()
    b = GraphBuilder(0, strings)
    a = b.add_node("a", dur=5.0)
    c = b.add_node("b", dur=math.nan)  # no duration: counts as 0
    d = b.add_node("c", dur=2.0)
    e = b.add_node("join", dur=1.0)
    b.add_dep(1, a)
    b.add_dep(2, a)
    b.add_dep(3, c)
    b.add_dep(3, d)
    b.add_dep(3, 999)  # dangling: ignored
    g = b.build()
    assert asap_start(g).tolist() == [0.0, 5.0, 5.0, 7.0]
    # known starts are kept, others follow them
    g2 = g.replace(start=np.array([10.0, np.nan, 20.0, np.nan]))
    assert asap_start(g2).tolist() == [10.0, 15.0, 20.0, 22.0]
    assert (a, e) == (0, 3)


def test_asap_survives_cycles():
    trace, strings = new_trace()
    b = GraphBuilder(0, strings)
    b.add_node("root", dur=3.0)
    b.add_node("x", dur=1.0)
    b.add_node("y", dur=1.0)
    b.add_dep(1, 0)
    b.add_dep(1, 2)
    b.add_dep(2, 1)
    s = asap_start(b.build())
    assert s[0] == 0.0 and np.isfinite(s).all() and s[1] >= 3.0


def test_real_triosim_trace_laid_out_in_order(shared_traces, tmp_path):
    """TrioSim operators have no start times: the layout chains them by their durations."""
    from ettools.converters.triosim import read_triosim

    d = shared_traces / "triosim" / "vgg13_h100_bs128"
    with open(d / "trace.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    trace = read_triosim(d)
    doc = load(write_chrome(trace, tmp_path / "vgg.json"))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(rows)
    durs = [float(r["Operator_cudatimenooverlap"]) for r in rows]
    starts = np.concatenate(([0.0], np.cumsum(durs)[:-1]))
    by_id = {e["args"]["id"]: e for e in xs}
    for r, s, du in zip(rows, starts, durs):
        e = by_id[int(r["OperatorID"])]
        assert e["dur"] == du and e["ts"] == pytest.approx(s)


def test_real_kineto_times_preserved(shared_traces, tmp_path):
    d = shared_traces / "kineto" / "hta_world128_sampled"
    trace = read_kineto(sorted(d.glob("rank*.json.gz")))
    doc = load(write_chrome(trace, tmp_path / "k.json.gz"))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert Counter(e["pid"] for e in xs) == {r: len(trace[r]) for r in trace.ranks}
    for r in trace.ranks:
        g = trace[r]
        mine = [e for e in xs if e["pid"] == r]
        ts = np.array([e["ts"] for e in mine])
        timed = ~np.isnan(g.start)
        assert np.array_equal(ts[timed], g.start[timed])
