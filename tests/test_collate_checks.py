"""Cross-rank collation (ettools.collate) and structural checks (ettools.checks)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ettools.checks import (
    StructuralError,
    assert_valid,
    check_acyclic,
    check_comm_attrs,
    check_memory,
    check_no_dangling,
    check_unique_ids,
    execution_order,
    peak_memory,
    topological_sort,
    verify,
)
from ettools.collate import match_collectives, match_p2p, program_order
from ettools.converters.chakra import read_chakra
from ettools.converters.kineto import read_kineto
from ettools.graph import (
    CollectiveType,
    EdgeKind,
    GraphBuilder,
    NodeType,
    ProcessGroup,
    Trace,
    new_trace,
)

AR, AG = CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER
COLL, SEND, RECV = NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE


def make_trace(world: int, groups: dict[str, list[int]], programs: dict[int, list[tuple]],
               timed: bool = False) -> Trace:
    """A trace whose rank r runs ``programs[r]``: a chain of nodes, each ``(kind, ...)``.

    ``("comp", name)``, ``("coll", group, ctype, nbytes)``, ``("send", peer, tag, nbytes)``,
    ``("recv", peer, tag, nbytes)``. Nodes are chained by ORDER edges; start times only if ``timed``.
    """
    trace, strings = new_trace("test", world_size=world)
    for name, ranks in groups.items():
        trace.meta.add_group(ProcessGroup(name, tuple(ranks)))
    for rank, prog in programs.items():
        b = GraphBuilder(rank, strings)
        prev = None
        for i, op in enumerate(prog):
            kw = {"start": float(10 * i), "dur": 5.0} if timed else {}
            if op[0] == "comp":
                nid = b.add_node(op[1], **kw)
            elif op[0] == "coll":
                _, grp, ct, nb = op
                nid = b.add_node(f"{CollectiveType(ct).name.lower()}_{i}", COLL, comm_type=ct,
                                 comm_bytes=nb, comm_group=grp, **kw)
            else:
                kind, peer, tag, nb = op
                nid = b.add_node(f"{kind}_{i}", SEND if kind == "send" else RECV, comm_peer=peer,
                                 comm_tag=tag, comm_bytes=nb, **kw)
            if prev is not None:
                b.add_dep(b.last_row, prev, EdgeKind.ORDER)
            prev = nid
        trace.graphs[rank] = b.build()
    return trace


def dp_program(n_coll: int = 3, nbytes: int = 1 << 20) -> list[tuple]:
    prog: list[tuple] = []
    for i in range(n_coll):
        prog += [("comp", f"bwd{i}"), ("coll", "dp", AR, nbytes)]
    return prog


def id_of(trace: Trace, rank: int, name: str) -> int:
    g = trace[rank]
    return int(g.id[g.names().index(name)])


# ---- collectives -------------------------------------------------------------------------------

@pytest.mark.parametrize("timed", [False, True])
def test_matched_collectives_on_every_member(timed):
    trace = make_trace(4, {"dp": [0, 1, 2, 3]}, {r: dp_program(3) for r in range(4)}, timed=timed)
    rep = match_collectives(trace)
    assert rep.ok and rep.unmatched == []
    assert rep.nodes == 12 and rep.matched == 3 and rep.matched_nodes == 12
    assert rep.unverifiable == 0
    d = rep.to_dict()
    json.dumps(d)
    assert d["matched"] == 3 and d["unmatched_count"] == 0 and d["groups"] == 1
    assert verify(trace) == []
    assert_valid(trace)


def test_collective_dropped_on_one_rank():
    progs = {r: dp_program(3) for r in range(4)}
    progs[2] = progs[2][:-1]  # rank 2 never issues the third all-reduce
    trace = make_trace(4, {"dp": [0, 1, 2, 3]}, progs)
    rep = match_collectives(trace)
    assert len(rep.unmatched) == 1
    u = rep.unmatched[0]
    assert (u.rank, u.kind, u.index, u.group, u.node_id) == (2, "missing", 2, "dp", None)
    assert u.name == "all_reduce_5"  # the name the other members give the missing collective
    assert rep.matched == 2
    problems = verify(trace)
    assert [(p.check, p.rank) for p in problems] == [("collectives", 2)]
    with pytest.raises(StructuralError, match=r"rank 2.*missing"):
        assert_valid(trace)


def test_collective_bytes_and_type_differ():
    progs = {r: dp_program(2) for r in range(4)}
    progs[1][1] = ("coll", "dp", AR, 999)  # first all-reduce has other bytes on rank 1
    progs[3][3] = ("coll", "dp", AG, 1 << 20)  # second is an all-gather on rank 3
    trace = make_trace(4, {"dp": [0, 1, 2, 3]}, progs)
    rep = match_collectives(trace)
    got = sorted((u.rank, u.kind, u.index, u.node_id) for u in rep.unmatched)
    assert got == [(1, "bytes", 0, id_of(trace, 1, "all_reduce_1")),
                   (3, "type", 1, id_of(trace, 3, "all_gather_3"))]
    bytes_entry = next(u for u in rep.unmatched if u.kind == "bytes")
    assert "999" in bytes_entry.reason and str(1 << 20) in bytes_entry.reason
    assert rep.matched == 0


def test_all_to_all_bytes_may_differ_and_type_mismatch_reported_once():
    A2A = CollectiveType.ALL_TO_ALL
    progs = {r: [("coll", "ep", A2A, 1000 * (r + 1)), ("coll", "ep", AR, 64)] for r in range(3)}
    progs[2][1] = ("coll", "ep", AG, 4096)  # wrong type and other bytes: one entry, the type
    rep = match_collectives(make_trace(3, {"ep": [0, 1, 2]}, progs))
    assert [(u.rank, u.kind, u.index) for u in rep.unmatched] == [(2, "type", 1)]
    assert rep.matched == 1


def test_extra_collective_and_unknown_group_and_non_member():
    progs = {r: dp_program(1) for r in range(3)}
    progs[0] = progs[0] + [("coll", "dp", AR, 8)]  # rank 0 issues one more than ranks 1, 2
    progs[1] = progs[1] + [("coll", "nosuch", AR, 8)]
    progs[0] = progs[0] + [("coll", "tp", AR, 8)]  # rank 0 is not in tp
    trace = make_trace(4, {"dp": [0, 1, 2], "tp": [2, 3]}, progs)
    rep = match_collectives(trace)
    kinds = sorted((u.rank, u.kind) for u in rep.unmatched)
    assert kinds == [(0, "extra"), (0, "not_member"), (1, "unknown_group")]
    probs = check_comm_attrs(trace[1], trace.meta)
    assert len(probs) == 1 and "nosuch" in probs[0].message
    probs = check_comm_attrs(trace[0], trace.meta)
    assert len(probs) == 1 and "not a member" in probs[0].message


def test_partial_group_is_unverifiable_not_an_error():
    # ranks 0 and 1 of a 128-rank job: the world group cannot be checked on its absent members
    world = list(range(128))
    progs = {r: dp_program(2) for r in (0, 1)}
    for p in progs.values():
        p[1] = ("coll", "world", AR, 64)
        p[3] = ("coll", "pair", AR, 32)
    trace = make_trace(128, {"world": world, "pair": [0, 1]}, progs)
    rep = match_collectives(trace)
    assert rep.ok
    assert rep.matched == 1 and rep.matched_nodes == 2  # the pair group, fully present
    assert rep.unverifiable == 1 and rep.unverifiable_nodes == 2
    assert rep.partial_groups == [{"group": "world", "members": 128, "present": 2, "absent": 126,
                                   "collectives": 1}]
    # a disagreement between the two present members is still an error
    progs[1][1] = ("coll", "world", AR, 65)
    rep = match_collectives(make_trace(128, {"world": world, "pair": [0, 1]}, progs))
    assert [(u.kind, u.group) for u in rep.unmatched] == [("bytes", "world")]


def test_world_group_for_nodes_without_group():
    trace = make_trace(2, {}, {r: [("comp", "x"), ("coll", "", AR, 4)] for r in (0, 1)})
    # comm_group "" interned: treat as world
    rep = match_collectives(trace)
    assert rep.ok and rep.matched == 1


def test_program_order_uses_start_then_topology():
    trace = make_trace(1, {}, {0: [("comp", "a"), ("comp", "b"), ("comp", "c")]})
    g = trace[0]
    rows = np.arange(3)
    assert program_order(g, rows).tolist() == [0, 1, 2]
    g2 = g.replace(start=np.array([30.0, 10.0, 20.0]))
    assert program_order(g2, rows).tolist() == [2, 0, 1]


def test_many_ranks_is_fast():
    import time

    n = 2048
    trace, strings = new_trace("big", world_size=n)
    trace.meta.add_group(ProcessGroup("world", tuple(range(n))))
    for t in range(n // 8):
        trace.meta.add_group(ProcessGroup(f"tp{t}", tuple(range(8 * t, 8 * t + 8))))
    for r in range(n):
        b = GraphBuilder(r, strings)
        prev = None
        for i in range(20):
            nid = b.add_node("ar", COLL, comm_type=AR, comm_bytes=1 << 20,
                             comm_group="world" if i % 2 else f"tp{r // 8}")
            if prev is not None:
                b.add_dep(b.last_row, prev, EdgeKind.ORDER)
            prev = nid
        trace.graphs[r] = b.build()
    t0 = time.perf_counter()
    rep = match_collectives(trace)
    dt = time.perf_counter() - t0
    assert rep.ok and rep.matched == 10 + (n // 8) * 10
    assert dt < 10, dt


# ---- send / recv ---------------------------------------------------------------------------------

def pp_programs() -> dict[int, list[tuple]]:
    return {
        0: [("comp", "f0"), ("send", 1, 7, 100), ("comp", "f1"), ("send", 1, 7, 200), ("recv", 1, 9, 50)],
        1: [("recv", 0, 7, 100), ("comp", "g0"), ("recv", 0, 7, 200), ("send", 0, 9, 50)],
    }


def test_p2p_pairs_in_order():
    trace = make_trace(2, {}, pp_programs())
    rep = match_p2p(trace)
    assert rep.ok and rep.matched == 3 and rep.nodes == 6 and rep.groups == 2
    json.dumps(rep.to_dict())
    assert verify(trace) == []


def test_send_without_recv_and_bytes_mismatch():
    progs = pp_programs()
    progs[1] = [op for op in progs[1] if op != ("send", 0, 9, 50)]  # rank 1 never answers
    progs[1][2] = ("recv", 0, 7, 201)
    trace = make_trace(2, {}, progs)
    rep = match_p2p(trace)
    got = sorted((u.rank, u.kind, u.node_id) for u in rep.unmatched)
    assert got == [(0, "bytes", id_of(trace, 0, "send_3")), (0, "unpaired", id_of(trace, 0, "recv_4"))]
    assert rep.matched == 1
    problems = verify(trace)
    assert {(p.check, p.rank, p.node_id) for p in problems} == {
        ("p2p", 0, id_of(trace, 0, "send_3")), ("p2p", 0, id_of(trace, 0, "recv_4"))}


def test_p2p_peer_absent_is_unverifiable_and_bad_peer_reported():
    trace = make_trace(4, {}, {0: [("send", 3, 0, 8), ("send", -1, 0, 8)]})
    rep = match_p2p(trace)
    assert rep.unverifiable_nodes == 1
    assert [(u.kind, u.rank) for u in rep.unmatched] == [("no_peer", 0)]
    probs = check_comm_attrs(trace[0], trace.meta)
    assert len(probs) == 1 and "no peer" in probs[0].message


# ---- per-rank checks -----------------------------------------------------------------------------

def test_cycle_reported_with_its_nodes():
    trace, strings = new_trace()
    b = GraphBuilder(5, strings)
    a = b.add_node("a")
    c = b.add_node("b")
    d = b.add_node("c")
    b.add_node("after")  # depends on the cycle, not on it
    b.add_dep(1, a)
    b.add_dep(2, c)
    b.add_dep(0, d)  # a -> b -> c -> a
    b.add_dep(3, d)
    g = b.build()
    probs = check_acyclic(g)
    assert len(probs) == 1
    p = probs[0]
    assert (p.rank, p.node_id, p.name) == (5, a, "a")
    assert "3 nodes" in p.message and f"{a} -> {c} -> {d} -> {a}" in p.message
    order, cyclic, _ = topological_sort(g)
    assert cyclic.tolist() == [True, True, True, True] and order.tolist() == []
    trace.graphs[5] = g
    with pytest.raises(StructuralError, match=r"rank 5 node 0 \(a\): dependency cycle"):
        assert_valid(trace)


def test_self_loop_and_acyclic():
    trace, strings = new_trace()
    b = GraphBuilder(0, strings)
    x = b.add_node("x")
    b.add_dep(0, x)
    assert len(check_acyclic(b.build())) == 1
    g = make_trace(1, {}, {0: [("comp", "a"), ("comp", "b")]})[0]
    assert check_acyclic(g) == []


def test_dangling_dependency_and_duplicate_ids():
    trace, strings = new_trace()
    b = GraphBuilder(3, strings)
    b.add_node("a", node_id=10)
    b.add_node("b", node_id=11)
    b.add_dep(1, 10, EdgeKind.DATA)
    b.add_dep(1, 99, EdgeKind.CTRL)
    b.add_node("c", node_id=11)
    g = b.build()
    d = check_no_dangling(g)
    assert [(p.rank, p.node_id, p.name) for p in d] == [(3, 11, "b")]
    assert "99" in d[0].message and "CTRL" in d[0].message
    u = check_unique_ids(g)
    assert len(u) == 1 and u[0].node_id == 11


def test_comm_attr_problems_one_per_node():
    trace, strings = new_trace(world_size=2)
    b = GraphBuilder(0, strings)
    b.add_node("bare_coll", COLL)
    b.add_node("ok_coll", COLL, comm_type=AR, comm_bytes=8, comm_group="0")
    b.add_node("send_self", SEND, comm_peer=0, comm_tag=1, comm_bytes=8)
    b.add_node("recv_notag", RECV, comm_peer=1, comm_bytes=8)
    probs = check_comm_attrs(b.build(), trace.meta)
    by_name = {p.name: p.message for p in probs}
    assert set(by_name) == {"bare_coll", "send_self", "recv_notag"}
    assert "no comm_type" in by_name["bare_coll"] and "no comm_size" in by_name["bare_coll"]
    assert "pg_name" in by_name["bare_coll"]
    assert "this rank" in by_name["send_self"] and "no tag" in by_name["recv_notag"]


def test_peak_memory_from_tensor_lifetimes():
    trace, strings = new_trace()
    b = GraphBuilder(0, strings)
    w = b.add_tensor([256], 4, device="cuda:0", tensor_id=1, storage_id=1)  # 1024 B weight
    x = b.add_tensor([100], 4, device="cuda:0", tensor_id=2, storage_id=2)  # 400 B
    y = b.add_tensor([50], 4, device="cuda:0", tensor_id=3, storage_id=3)  # 200 B
    yv = b.add_tensor([25], 4, device="cuda:0", tensor_id=4, storage_id=3)  # view of y
    h = b.add_tensor([1000], 4, device="cpu", tensor_id=5, storage_id=5)  # host: not counted
    n0 = b.add_node("make_x")
    b.add_io(0, outputs=[x])
    b.add_node("mm")
    b.add_dep(1, n0, EdgeKind.DATA)
    b.add_io(1, inputs=[x, w, h], outputs=[y])
    n2 = b.add_node("use_view")
    b.add_dep(2, 1, EdgeKind.DATA)
    b.add_io(2, inputs=[yv])
    b.add_node("late")
    b.add_dep(3, n2, EdgeKind.DATA)
    b.add_io(3, inputs=[w])
    g = b.build()
    assert execution_order(g).tolist() == [0, 1, 2, 3]
    peak, row = peak_memory(g)
    assert (peak, row) == (400 + 1024 + 200, 1)  # x, w, y live together at mm
    assert check_memory(g, 1624) == []
    probs = check_memory(g, 1623)
    assert len(probs) == 1 and probs[0].node_id == 1 and "1,624" in probs[0].message
    trace.graphs[0] = g
    assert verify(trace, device_bytes=1623)[0].check == "memory"


# ---- real traces ---------------------------------------------------------------------------------

def test_resnet_converted_dangling_and_comm_defects(shared_traces):
    path = shared_traces / "chakra" / "resnet_converted.0.et"
    trace = read_chakra(path)
    (g,) = trace.graphs.values()
    # count dangling references independently: ids referenced but not defined
    ids = set(g.id.tolist())
    expected = sum(1 for d in g.dep_id.tolist() if d not in ids)
    problems = check_no_dangling(g)
    assert len(problems) == expected > 0
    coll = np.flatnonzero(g.type == COLL)
    bad = check_comm_attrs(g, trace.meta)
    assert len(bad) == len(coll)  # none carries pg_name; 14 lack type and size too
    missing_type = sum("no comm_type" in p.message for p in bad)
    assert missing_type == int((g.comm_type[coll] < 0).sum())
    problems = verify(trace)
    assert sum(p.check == "dangling" for p in problems) == expected
    # Chakra's converter also left a dependency cycle; networkx is the independent oracle
    import networkx as nx

    src, dst, _ = g.edge_rows()
    ok = src >= 0
    dg = nx.DiGraph()
    dg.add_edges_from(zip(g.id[src[ok]].tolist(), g.id[dst[ok]].tolist()))
    sccs = [c for c in nx.strongly_connected_components(dg)
            if len(c) > 1 or dg.has_edge(next(iter(c)), next(iter(c)))]
    cycles = check_acyclic(g)
    assert len(cycles) == len(sccs) >= 1
    for p in cycles:
        scc = next(c for c in sccs if p.node_id in c)
        listed = {int(x) for x in p.message.split(": ")[1].split(" (")[0].split(" -> ")}
        assert listed <= scc


def test_hta_world128_sampled_partial_groups(shared_traces):
    """Two ranks of a 128-rank job: the world group is partial, so agreeing collectives are
    unverifiable; where the two present ranks disagree (this HTA sample kept a subset of events)
    the disagreement is reported. Expectations are recomputed here from the graphs' columns."""
    d = shared_traces / "kineto" / "hta_world128_sampled"
    trace = read_kineto(sorted(d.glob("rank*.json.gz")))
    assert trace.ranks == [0, 1] and trace.meta.world_size == 128
    rep = match_collectives(trace)
    seqs = {}
    for g in trace:
        rows = [r for r in range(len(g)) if g.type[r] == COLL]
        rows.sort(key=lambda r: (g.start[r], g.id[r]))
        seqs[g.rank] = [(g.group_name(r), int(g.comm_type[r]), int(g.comm_bytes[r])) for r in rows]
    assert rep.nodes == sum(len(v) for v in seqs.values()) > 0
    groups = {grp for v in seqs.values() for grp, _, _ in v}
    for grp in groups:
        members = trace.meta.process_groups[grp].ranks
        assert len(members) == 128
        a = [x for x in seqs[0] if x[0] == grp]
        b = [x for x in seqs[1] if x[0] == grp]
        assert len(a) == len(b)
        bad = {k for k, (x, y) in enumerate(zip(a, b))
               if x[1] != y[1] or (x[1] != CollectiveType.ALL_TO_ALL and x[2] != y[2])}
        got = [u.index for u in rep.unmatched if u.group == grp]
        assert sorted(got) == sorted(bad)  # one entry per disagreeing position
        assert {u.kind for u in rep.unmatched if u.group == grp} <= {"type", "bytes"}
        pg = next(p for p in rep.partial_groups if p["group"] == grp)
        assert (pg["present"], pg["absent"]) == (2, 126)
    assert rep.matched == 0  # nothing can be fully verified with 126 members absent
    assert rep.unverifiable == sum(len([x for x in seqs[0] if x[0] == grp]) for grp in groups) - len(
        {(u.group, u.index) for u in rep.unmatched})


def test_shared_structure_problems_relabelled_per_rank():
    trace, strings = new_trace(world_size=3)
    b = GraphBuilder(0, strings)
    b.add_node("a")
    b.add_dep(0, 77)
    g = b.build()
    for r in range(3):
        trace.graphs[r] = g.with_rank(r)
    probs = [p for p in verify(trace) if p.check == "dangling"]
    assert [(p.rank, p.node_id) for p in probs] == [(0, 0), (1, 0), (2, 0)]


def _read_sample(sample_traces, name):
    files = sorted((sample_traces / name).glob("rank*.kineto.json.gz"))
    if len(files) != 2:
        pytest.skip(f"sample capture {name} not present")
    return read_kineto(files)


def test_real_two_rank_tp_capture_collectives_match_and_a_dropped_one_is_found(sample_traces):
    trace = _read_sample(sample_traces, "tp_sp")
    counts = [int((g.type == COLL).sum()) for g in trace]
    assert counts[0] == counts[1] > 0
    rep = match_collectives(trace)
    assert rep.ok and rep.matched == counts[0] and rep.matched_nodes == sum(counts)
    assert verify(trace) == []
    # drop rank 1's 5th collective (in start order): rank 1 is missing it, later ones shift
    g1 = trace[1]
    rows = np.flatnonzero(g1.type == COLL)
    rows = rows[np.argsort(g1.start[rows], kind="stable")]
    keep = np.ones(len(g1), bool)
    keep[rows[4]] = False
    trace.graphs[1] = g1.select(keep)
    rep = match_collectives(trace)
    missing = [u for u in rep.unmatched if u.kind == "missing"]
    assert [(u.rank, u.index) for u in missing] == [(1, counts[0] - 1)]
    assert all(u.index >= 4 for u in rep.unmatched)
    assert rep.matched >= 4


def test_real_two_rank_pipeline_capture_sends_pair_and_a_dropped_recv_is_found(sample_traces):
    trace = _read_sample(sample_traces, "pp_1f1b")
    sends = sum(int((g.type == SEND).sum()) for g in trace)
    recvs = sum(int((g.type == RECV).sum()) for g in trace)
    assert sends == recvs > 0
    rep = match_p2p(trace)
    assert rep.ok and rep.matched == sends
    # drop rank 1's last recv: exactly one send of rank 0 loses its partner
    g1 = trace[1]
    r = np.flatnonzero(g1.type == RECV)
    last = r[np.argmax(g1.start[r])]
    peer = int(g1.comm_peer[last])
    keep = np.ones(len(g1), bool)
    keep[last] = False
    trace.graphs[1] = g1.select(keep)
    rep = match_p2p(trace)
    assert [(u.rank, u.kind) for u in rep.unmatched] == [(peer, "unpaired")]
    assert rep.matched == sends - 1
    assert "no matching recv on rank 1" in rep.unmatched[0].reason
