"""ASTRA-sim JSON workload reader and writer (converters/astrasim_json.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ettools.converters.astrasim_json import read_astrasim_json, write_astrasim_json
from ettools.errors import TraceError
from ettools.graph import CollectiveType, EdgeKind, GraphBuilder, NodeType, ProcessGroup, new_trace


@pytest.fixture(scope="module")
def small(shared_traces):
    return shared_traces / "astrasim_json" / "small_workload.json"


def test_read_real_file(small):
    raw = json.loads(small.read_text())
    trace = read_astrasim_json(small)
    assert trace.ranks == [0]
    g = trace[0]
    nodes = raw["workload_graph"]
    assert len(g) == len(nodes)
    assert trace.meta.world_size == raw["ngpus"]
    for n, src in zip(g.iter_nodes(), nodes):
        assert n.id == src["Id"] and n.name == src["Name"] and int(n.type) == src["NodeType"]
        assert n.dur == src["runtime"] and n.is_cpu_op == int(src["is_cpu_op"])
        assert n.data_deps == src["data_deps"] and n.ctrl_deps == src["ctrlDeps"]


def test_round_trip_real_file(small, tmp_path):
    raw = json.loads(small.read_text())
    trace = read_astrasim_json(small)
    (out,) = write_astrasim_json(trace, tmp_path, "rt")
    assert out == tmp_path / "rt.0.json"
    written = json.loads(out.read_text())
    for key in ("workload_name", "ngpus", "soc"):
        assert written[key] == raw[key]
    assert len(written["workload_graph"]) == len(raw["workload_graph"])
    for w, src in zip(written["workload_graph"], raw["workload_graph"]):
        # the file's ctrlDeps name ids absent from it: they stay control-only, data_deps unchanged
        for key in ("Id", "Name", "NodeType", "ctrlDeps", "data_deps", "runtime", "is_cpu_op"):
            assert w[key] == src[key], key
    back = read_astrasim_json(out)
    g0, g1 = trace[0], back[0]
    assert g1.id.tolist() == g0.id.tolist() and g1.names() == g0.names()
    assert g1.dur.tolist() == g0.dur.tolist() and g1.type.tolist() == g0.type.tolist()
    assert g1.dep_id.tolist() == g0.dep_id.tolist() and g1.dep_kind.tolist() == g0.dep_kind.tolist()
    assert g1.dep_ptr.tolist() == g0.dep_ptr.tolist()


def build_trace():
    trace, strings = new_trace("test", world_size=4)
    trace.meta.add_group(ProcessGroup("tp", (0, 1)))
    trace.meta.add_group(ProcessGroup("other", (2, 3)))
    for r in (0, 1):
        b = GraphBuilder(r, strings)
        a = b.add_node("gemm", dur=12.4, is_cpu_op=0, num_ops=1 << 30, tensor_size=4096)
        m = b.add_node("meta", NodeType.METADATA_NODE)
        c = b.add_node("allreduce", NodeType.COMM_COLL_NODE, dur=30.0, is_cpu_op=0,
                       comm_type=CollectiveType.ALL_REDUCE, comm_bytes=1 << 20, comm_group="tp")
        b.set_attr(b.last_row, "comm_priority", 2, "int32_val")
        b.add_dep(b.last_row, a, EdgeKind.DATA)
        b.add_dep(b.last_row, m, EdgeKind.CTRL)
        kind = NodeType.COMM_SEND_NODE if r == 0 else NodeType.COMM_RECV_NODE
        s = b.add_node("p2p", kind, dur=5.0, comm_peer=1 - r, comm_tag=3, comm_bytes=256)
        b.add_dep(b.last_row, c, EdgeKind.ORDER)
        b.add_dep(b.last_row, a, EdgeKind.DATA)
        b.add_dep(b.last_row, a, EdgeKind.SYNC)  # same dependency twice: listed once per list
        assert s == 3
        trace.graphs[r] = b.build()
    return trace


def test_write_comm_fields_and_dependencies(tmp_path):
    trace = build_trace()
    paths = write_astrasim_json(trace, tmp_path, "w")
    assert paths == [tmp_path / "w.0.json", tmp_path / "w.1.json"]
    d0 = json.loads(paths[0].read_text())
    nodes = {n["Id"]: n for n in d0["workload_graph"]}
    assert set(nodes) == {0, 2, 3}  # METADATA node left out
    assert d0["ngpus"] == 4 and d0["comm_groups"] == {"tp": [0, 1]}
    coll = nodes[2]
    assert (coll["comm_type"], coll["comm_size"], coll["pg_name"], coll["comm_priority"]) == (0, 1 << 20, "tp", 2)
    assert coll["data_deps"] == [0] and coll["ctrlDeps"] == []  # dep on the dropped node removed
    send = nodes[3]
    assert (send["comm_src"], send["comm_dst"], send["comm_tag"], send["comm_size"]) == (0, 1, 3, 256)
    # every dependency enforced through data_deps, the control ones listed again in ctrlDeps
    assert send["data_deps"] == [2, 0] and send["ctrlDeps"] == [2, 0]
    assert nodes[0]["runtime"] == 12 and nodes[0]["num_ops"] == 1 << 30 and nodes[0]["is_cpu_op"] is False
    recv = {n["Id"]: n for n in json.loads(paths[1].read_text())["workload_graph"]}[3]
    assert (recv["comm_src"], recv["comm_dst"]) == (0, 1)

    back = read_astrasim_json(paths[1])
    assert back.ranks == [1]
    g = back[1]
    n = g.node(int(g.rows_of([3])[0]))
    assert (n.type, n.comm_peer, n.comm_tag, n.comm_bytes) == (NodeType.COMM_RECV_NODE, 0, 3, 256)
    assert sorted(n.deps) == [(0, EdgeKind.CTRL), (2, EdgeKind.CTRL)]
    c = g.node(int(g.rows_of([2])[0]))
    assert (c.comm_group, c.comm_type, c.attrs["comm_priority"]) == ("tp", 0, 2)
    assert back.meta.process_groups["tp"].ranks == (0, 1)

    plain = write_astrasim_json(trace, tmp_path / "plain", "w", enforce_ctrl=False)
    send = {n["Id"]: n for n in json.loads(plain[0].read_text())["workload_graph"]}[3]
    assert send["data_deps"] == [0] and send["ctrlDeps"] == [2, 0]


def test_unknown_keys_kept(tmp_path):
    p = tmp_path / "x.2.json"
    p.write_text(json.dumps({"workload_graph": [
        {"Id": 1, "Name": "a", "NodeType": 4, "data_deps": [], "runtime": 1, "is_cpu_op": False,
         "flops_hint": 7, "tag": "fwd"}]}))
    trace = read_astrasim_json(p)
    assert trace.ranks == [2]
    (out,) = write_astrasim_json(trace, tmp_path / "o", "x")
    n = json.loads(out.read_text())["workload_graph"][0]
    assert (n["flops_hint"], n["tag"]) == (7, "fwd")


@pytest.mark.parametrize("content, expect", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"nodes": []}', "no 'workload_graph' list"),
    (b'{"workload_graph": [{"Id": 1}, {"Name": "x"}]}', "workload_graph[1]: node has no 'Id'"),
    (b'{"workload_graph": [{"Id": "7"}]}', "workload_graph[0]: 'Id' must be a non-negative integer"),
    (b'{"workload_graph": [{"Id": 1}, {"Id": 1}]}', "workload_graph[1]: duplicate node Id 1"),
    (b'{"workload_graph": [{"Id": 1, "NodeType": 42}]}', "workload_graph[0] (Id 1): unknown NodeType 42"),
    (b'{"workload_graph": [{"Id": 1, "data_deps": 3}]}', "workload_graph[0] (Id 1): 'data_deps' must be a list"),
    (b'{"workload_graph": [{"Id": 1, "runtime": "fast"}]}', "'runtime' must be a non-negative number"),
    (b'{"workload_graph": [{"Id": 1, "NodeType": 7, "comm_size": 1.5}]}', "'comm_size' must be an integer"),
])
def test_bad_input(tmp_path, content, expect):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceError) as e:
        read_astrasim_json(p)
    assert str(p) in str(e.value) and expect in str(e.value)


def test_fast_and_checked_paths_agree(small, tmp_path):
    """Well-formed files take a columnar fast path; the per-node checked path must read the same."""
    from ettools.converters.astrasim_json import _checked_graph, _fast_graph
    from ettools.graph import StringTable

    trace = build_trace()
    (p0, _) = write_astrasim_json(trace, tmp_path, "w")
    for path in (small, p0):
        nodes = json.loads(path.read_text())["workload_graph"]
        nodes[0]["extra_note"] = "kept"
        s1, s2 = StringTable(), StringTable()
        fast = _fast_graph(0, s1, nodes)
        slow = _checked_graph(path, 0, s2, nodes)
        assert fast is not None
        for col in fast.columns:
            a, b = fast.columns[col], slow.columns[col]
            if col in ("name", "comm_group"):
                a, b = s1.decode(a), s2.decode(b)
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f") if not isinstance(a, list) else a == b, col
        assert fast.dep_ptr.tolist() == slow.dep_ptr.tolist()
        assert fast.dep_id.tolist() == slow.dep_id.tolist() and fast.dep_kind.tolist() == slow.dep_kind.tolist()
        assert {k: (v.kind, v.rows.tolist(), v.values) for k, v in fast.attrs.items()} == {
            k: (v.kind, v.rows.tolist(), v.values) for k, v in slow.attrs.items()}
    # a NodeType given by name is read by the checked path
    p = tmp_path / "named.json"
    p.write_text(json.dumps({"workload_graph": [{"Id": 3, "NodeType": "COMM_COLL_NODE", "comm_type": 0}]}))
    assert read_astrasim_json(p)[0].type.tolist() == [NodeType.COMM_COLL_NODE]
