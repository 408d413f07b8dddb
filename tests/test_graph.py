"""The graph model: building, lookups, edges, subgraphs, topological order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ettools.graph import (
    CollectiveType,
    EdgeKind,
    GraphBuilder,
    NodeType,
    ProcessGroup,
    RankGraph,
    StringTable,
    TraceMeta,
    new_trace,
)


def chain(n: int, strings: StringTable | None = None) -> RankGraph:
    b = GraphBuilder(0, strings or StringTable())
    prev = None
    for i in range(n):
        nid = b.add_node(f"op{i % 3}", start=float(i), dur=1.0, resource="thread 1", is_cpu_op=1)
        if prev is not None:
            b.add_dep(b.last_row, prev, EdgeKind.ORDER)
        prev = nid
    return b.build()


def test_builder_columns_and_absent_values():
    strings = StringTable()
    b = GraphBuilder(3, strings, first_id=10)
    a = b.add_node("matmul", start=1.5, dur=2.0, resource="stream 7", is_cpu_op=0, num_ops=100)
    c = b.add_node("allreduce", NodeType.COMM_COLL_NODE, comm_type=CollectiveType.ALL_REDUCE,
                   comm_bytes=4096, comm_group="dp")
    b.add_dep(b.last_row, a, EdgeKind.DATA)
    g = b.build()
    assert (a, c) == (10, 11)
    assert g.rank == 3 and len(g) == 2 and g.num_edges == 1
    assert g.names() == ["matmul", "allreduce"]
    assert g.type.tolist() == [NodeType.COMP_NODE, NodeType.COMM_COLL_NODE]
    assert g.num_ops.tolist() == [100, -1]
    assert math.isnan(g.start[1]) and math.isnan(g.dur[1])
    assert g.comm_type.tolist() == [-1, 0] and g.comm_bytes.tolist() == [-1, 4096]
    assert g.group_name(1) == "dp" and g.group_name(0) == ""
    node = g.node(1)
    assert node.data_deps == [10] and node.ctrl_deps == []
    # names are interned once across the table
    assert strings.lookup("matmul") == g.columns["name"][0]


def test_deps_grouped_per_node_in_insertion_order():
    b = GraphBuilder(0, StringTable())
    for i in range(4):
        b.add_node(f"n{i}")
    # edges added out of node order; each node keeps its own insertion order
    b.add_dep(3, 2, EdgeKind.CTRL)
    b.add_dep(1, 0, EdgeKind.DATA)
    b.add_dep(3, 0, EdgeKind.DATA)
    b.add_dep(3, 1, EdgeKind.SYNC_GUESSED)
    g = b.build()
    assert g.deps_of(3) == [(2, EdgeKind.CTRL), (0, EdgeKind.DATA), (1, EdgeKind.SYNC_GUESSED)]
    assert g.deps_of(1) == [(0, EdgeKind.DATA)]
    assert g.deps_of(0) == [] and g.deps_of(2) == []


def test_rows_of_with_missing_ids_and_dangling_count():
    b = GraphBuilder(0, StringTable())
    for nid in (50, 7, 20):
        b.add_node("x", node_id=nid)
    b.add_dep(0, 999, EdgeKind.CTRL)  # dangling
    b.add_dep(2, 7, EdgeKind.DATA)
    g = b.build()
    assert g.rows_of([7, 20, 50, 999]).tolist() == [1, 2, 0, -1]
    assert g.dangling_edges() == 1
    src, dst, kind = g.edge_rows()
    assert sorted(zip(src.tolist(), dst.tolist())) == [(-1, 0), (1, 2)]


def test_select_drops_edges_to_removed_nodes_and_keeps_attrs():
    g = chain(5)
    keep = np.array([True, False, True, True, True])
    sub = g.select(keep)
    assert len(sub) == 4
    assert sub.id.tolist() == [0, 2, 3, 4]
    # the edge 1 -> 2 pointed at a removed node and is gone; 2->3 and 3->4 stay
    assert sub.deps_of(1) == []
    assert sub.deps_of(2) == [(2, EdgeKind.ORDER)]
    assert sub.dangling_edges() == 0


def test_select_carries_sparse_attributes():
    b = GraphBuilder(0, StringTable())
    for i in range(4):
        b.add_node(f"n{i}")
        if i % 2:
            b.set_attr(b.last_row, "rf_id", 100 + i, "int64_val")
    g = b.build()
    assert g.attr("rf_id").as_dict() == {1: 101, 3: 103}
    sub = g.select(np.array([False, True, True, True]))
    assert sub.attr("rf_id").as_dict() == {0: 101, 2: 103}
    assert sub.node(2).attrs == {"rf_id": 103}


def test_topological_order_respects_every_edge():
    rng = np.random.default_rng(0)
    b = GraphBuilder(0, StringTable())
    n = 500
    for _ in range(n):
        b.add_node("n")
    for _ in range(2000):
        a, c = sorted(rng.integers(0, n, 2).tolist())
        if a != c:
            b.add_dep(c, a, EdgeKind.CTRL)
    # shuffle ids so that row order is not id order
    g = b.build()
    order = g.topological_order()
    assert order is not None and sorted(order.tolist()) == list(range(n))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    src, dst, _ = g.edge_rows()
    assert (pos[src] < pos[dst]).all()


def test_topological_order_detects_cycle():
    b = GraphBuilder(0, StringTable())
    for _ in range(3):
        b.add_node("n")
    b.add_dep(0, 2, EdgeKind.CTRL)
    b.add_dep(1, 0, EdgeKind.CTRL)
    b.add_dep(2, 1, EdgeKind.CTRL)
    assert b.build().topological_order() is None


def test_replace_shares_unchanged_columns():
    g = chain(3)
    h = g.replace(dur=np.array([5.0, 6.0, 7.0]))
    assert h.dur.tolist() == [5.0, 6.0, 7.0] and g.dur.tolist() == [1.0, 1.0, 1.0]
    assert h.columns["start"] is g.columns["start"]
    with pytest.raises(KeyError):
        g.replace(bogus=np.zeros(3))
    assert g.with_rank(9).rank == 9 and g.rank == 0


def test_tensors_and_io():
    b = GraphBuilder(0, StringTable())
    b.add_node("mm")
    t0 = b.add_tensor((4, 8), 2, dtype="bf16", device="cuda:0", tensor_id=11)
    t1 = b.add_tensor((8, 16), 2, dtype="bf16", device="cuda:0", tensor_id=12)
    t2 = b.add_tensor((4, 16), 2, dtype="bf16", device="cuda:0", tensor_id=13)
    b.add_io(0, inputs=[t0, t1], outputs=[t2])
    g = b.build()
    assert g.inputs_of(0).tolist() == [t0, t1] and g.outputs_of(0).tolist() == [t2]
    assert g.tensors.shape(t1) == (8, 16)
    assert g.tensors.nbytes.tolist() == [64, 256, 128]


def test_meta_group_registry_rejects_conflicting_members():
    meta = TraceMeta(world_size=4)
    meta.add_group(ProcessGroup("tp", (0, 1)))
    meta.add_group(ProcessGroup("tp", (0, 1)))  # same again is fine
    with pytest.raises(ValueError, match="tp"):
        meta.add_group(ProcessGroup("tp", (0, 2)))


def test_trace_container():
    trace, strings = new_trace("test", world_size=2)
    trace.graphs[1] = chain(2, strings).with_rank(1)
    trace.graphs[0] = chain(3, strings)
    assert trace.ranks == [0, 1] and trace.num_nodes == 5
    assert [g.rank for g in trace] == [0, 1]
