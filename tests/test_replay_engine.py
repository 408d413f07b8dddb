"""The event engine on small hand-built graphs: lanes, collectives, eager sends, deadlock reports,
symmetric ranks, overlap slowdown."""

from __future__ import annotations

import numpy as np
import pytest

from ettools.converters.symbolic import synthesize
from ettools.graph import CollectiveType, EdgeKind, GraphBuilder, NodeType, ProcessGroup, new_trace
from ettools.replay import ReplayDeadlock, replay_trace

AR = int(CollectiveType.ALL_REDUCE)


def _trace(n: int, build) -> object:
    tr, strings = new_trace("hand built", n)
    tr.meta.add_group(ProcessGroup("world", tuple(range(n))))
    for r in range(n):
        b = GraphBuilder(r, strings)
        build(r, b)
        tr.graphs[r] = b.build()
    return tr


def test_device_lane_serializes_and_comm_overlaps():
    def build(r, b):
        b.add_node("k1", dur=10.0, is_cpu_op=0)
        b.add_node("k2", dur=5.0, is_cpu_op=0)  # independent, but one device: runs after k1
        b.add_node("ar", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=1, comm_group="world", dur=7.0)

    res = replay_trace(_trace(2, build))
    st, en = res.replayed_times(0)
    assert st.tolist() == [0.0, 10.0, 0.0] and en.tolist() == [10.0, 15.0, 7.0]
    rr = res.ranks[0]
    assert rr.compute_us == 15.0 and rr.comm_us == 7.0 and rr.overlap_us == 7.0 and rr.exposed_comm_us == 0.0
    assert rr.span_us == 15.0 and rr.idle_us == 0.0


def test_collective_waits_for_last_member_and_takes_shortest_measured():
    def build(r, b):
        b.add_node("work", dur=10.0 * (r + 1), is_cpu_op=0)
        b.add_node("ar", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=64, comm_group="world",
                   dur=[40.0, 25.0, 30.0][r], resource="stream 9")
        b.add_dep(1, 0, EdgeKind.DATA)
        b.add_node("after", dur=1.0, is_cpu_op=0)
        b.add_dep(2, 1, EdgeKind.DATA)

    res = replay_trace(_trace(3, build))
    # arrivals at 10, 20, 30; transfer = the shortest measured span (25): all end at 55
    for r in range(3):
        st, en = res.replayed_times(r)
        assert en[1] == 55.0 and st[2] == 55.0
    assert res.schedule.inst_start[0] == 30.0
    # the critical path goes through the last member to arrive (rank 2's work)
    cp = res.critical_path()
    assert cp["length_us"] == 56.0 and 2 in cp["ranks"]
    assert res.ranks[0].comm_us == 25.0 and res.ranks[0].idle_us == 20.0  # waited 20 µs for peers


def test_sends_are_eager_and_recvs_wait_for_the_message():
    def build(r, b):
        if r == 0:
            b.add_node("send", NodeType.COMM_SEND_NODE, comm_peer=1, comm_tag=3, comm_bytes=8, dur=4.0)
            b.add_node("more", dur=2.0, is_cpu_op=0)
            b.add_dep(1, 0, EdgeKind.CTRL)
        else:
            b.add_node("busy", dur=50.0, is_cpu_op=0)
            b.add_node("recv", NodeType.COMM_RECV_NODE, comm_peer=0, comm_tag=3, comm_bytes=8, dur=4.0)
            b.add_dep(1, 0, EdgeKind.CTRL)

    res = replay_trace(_trace(2, build))
    st0, en0 = res.replayed_times(0)
    st1, en1 = res.replayed_times(1)
    assert en0[0] == 4.0 and en0[1] == 6.0  # the sender did not wait for the late recv
    assert st1[1] == 50.0 and en1[1] == 50.0  # message already there
    # recv posted first waits for the message
    def build2(r, b):
        if r == 0:
            b.add_node("busy", dur=30.0, is_cpu_op=0)
            b.add_node("send", NodeType.COMM_SEND_NODE, comm_peer=1, comm_tag=0, comm_bytes=8, dur=4.0)
            b.add_dep(1, 0, EdgeKind.CTRL)
        else:
            b.add_node("recv", NodeType.COMM_RECV_NODE, comm_peer=0, comm_tag=0, comm_bytes=8, dur=4.0)

    res = replay_trace(_trace(2, build2))
    assert res.replayed_times(1)[1][0] == 34.0


def test_deadlock_collective_missing_on_one_member():
    def build(r, b):
        b.add_node("ar0", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=4, comm_group="world", dur=1.0,
                   node_id=100)
        if r != 2:  # rank 2 never calls the second all-reduce
            b.add_node("ar1", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=4, comm_group="world", dur=1.0,
                       node_id=101)
            b.add_dep(1, 100, EdgeKind.CTRL)

    with pytest.raises(ReplayDeadlock) as ei:
        replay_trace(_trace(3, build))
    msg = str(ei.value)
    assert "all_reduce #1 of group 'world'" in msg and "never reached by rank(s) [2]" in msg
    assert "rank 0 node 101 (ar1)" in msg and "rank 1 node 101 (ar1)" in msg
    d = [x for x in ei.value.details if x["kind"] == "collective"][0]
    assert d["reached_by"] == [0, 1] and d["waiting_for"] == [2]
    assert {n["node_id"] for n in d["nodes"]} == {101}


def test_deadlock_send_without_recv_and_recv_without_send():
    def build(r, b):
        if r == 0:
            b.add_node("send", NodeType.COMM_SEND_NODE, comm_peer=1, comm_tag=7, comm_bytes=8, dur=1.0, node_id=5)

    with pytest.raises(ReplayDeadlock) as ei:
        replay_trace(_trace(2, build))
    assert "sent by rank 0 but never received by rank 1" in str(ei.value)
    assert "rank 0 node 5 (send)" in str(ei.value)

    def build2(r, b):
        if r == 1:
            b.add_node("recv", NodeType.COMM_RECV_NODE, comm_peer=0, comm_tag=7, comm_bytes=8, dur=1.0, node_id=9)
            b.add_node("after", dur=1.0, node_id=10)
            b.add_dep(1, 9, EdgeKind.CTRL)

    with pytest.raises(ReplayDeadlock) as ei:
        replay_trace(_trace(2, build2))
    msg = str(ei.value)
    assert "posted by rank 1 but never sent by rank 0" in msg and "rank 1 blocked at rank 1 node 9 (recv)" in msg
    assert "2 nodes unfinished" in msg or "2 of 2 nodes unfinished" in msg


def test_symmetric_ranks_simulated_once_same_result():
    res = synthesize("gpt3-5b", dims={"L": 4}, dp=2, tp=2, pp=2, batch=8, micro_batch=2)
    full = replay_trace(res.trace, symmetric=False)
    sym = replay_trace(res.trace)  # on by default
    assert sym.options["symmetric"] and not full.options["symmetric"]
    assert len(full.built.sim_ranks) == 8
    assert len(sym.built.sim_ranks) == 2  # one per pipeline stage
    assert sym.step_time_us == pytest.approx(full.step_time_us, rel=1e-12)
    for r in range(8):
        a, b = full.ranks[r], sym.ranks[r]
        assert (a.step_time_us, a.compute_us, a.comm_us, a.exposed_comm_us) == pytest.approx(
            (b.step_time_us, b.compute_us, b.comm_us, b.exposed_comm_us), rel=1e-12)
    assert {sym.ranks[r].simulated_as for r in range(8)} == set(sym.built.sim_ranks)


def test_a_rank_that_reports_differently_gets_its_own_class():
    """Same timing, different FLOPs on one node (so a different MFU): symmetry keeps it apart, and
    every rank reports its own figure as the full replay does."""
    res = synthesize("gpt3-5b", dims={"L": 2}, dp=4, batch=4, micro_batch=4)
    tr = res.trace
    g = tr.graphs[2]
    ops = g.num_ops.copy()
    i = int(np.flatnonzero(g.type == NodeType.COMP_NODE)[0])
    ops[i] = ops[i] * 2 + 1
    tr.graphs[2] = g.replace(num_ops=ops)
    sym, full = replay_trace(tr, symmetric=True), replay_trace(tr)
    assert 2 in sym.built.sim_ranks and len(sym.built.sim_ranks) == 2
    assert [sym.ranks[r].flops for r in range(4)] == [full.ranks[r].flops for r in range(4)]
    assert sym.ranks[2].flops > sym.ranks[0].flops


def test_asymmetric_rank_gets_its_own_class():
    res = synthesize("gpt3-5b", dims={"L": 2}, dp=4, batch=4, micro_batch=4)
    tr = res.trace
    for g in tr.graphs.values():  # take the synthesizer's estimates as if measured, straggler included
        g.meta.pop("durations", None)
    before = replay_trace(tr)
    g = tr.graphs[3]
    dur = g.dur.copy()
    dur[np.flatnonzero(g.type == NodeType.COMP_NODE)[0]] += 500.0  # a straggler
    tr.graphs[3] = g.replace(dur=dur)
    sym = replay_trace(tr, symmetric=True)
    full = replay_trace(tr)
    assert 3 in sym.built.sim_ranks and len(sym.built.sim_ranks) == 2
    assert sym.step_time_us == pytest.approx(full.step_time_us, rel=1e-12)
    # the others wait for the straggler at the gradient all-reduce: everyone's step grows by 500 µs
    assert full.ranks[0].step_time_us - before.ranks[0].step_time_us == pytest.approx(500.0, rel=0.01)


def test_overlap_slowdown():
    def build(r, b):
        b.add_node("ar", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=1, comm_group="world", dur=10.0)
        b.add_node("pre", dur=1.0, is_cpu_op=1)
        b.add_node("k", dur=10.0, is_cpu_op=0)  # starts at 1 µs, while the all-reduce runs
        b.add_dep(2, 1, EdgeKind.CTRL)

    base = replay_trace(_trace(2, build))
    slow = replay_trace(_trace(2, build), overlap_slowdown=0.5)
    # k runs 1..10 beside the all-reduce at 1/1.5 of its rate (6 µs of its work), the last 4 µs
    # alone: it ends at 14; the host op "pre" (0..1, beside the all-reduce too) is not slowed
    assert base.ranks[0].span_us == 11.0 and slow.ranks[0].span_us == pytest.approx(14.0, rel=1e-12)
    for symmetric in (False, True):  # the same whichever rank reaches the all-reduce first
        r = replay_trace(_trace(2, build), overlap_slowdown=0.5, symmetric=symmetric)
        assert r.ranks[1].span_us == pytest.approx(14.0, rel=1e-12)
        assert len(r.built.sim_ranks) == (1 if symmetric else 2)


def test_release_offsets_follow_each_ranks_first_event(shared_traces):
    from ettools.converters.kineto import read_kineto

    tr = read_kineto(shared_traces / "kineto" / "hta_world128_sampled")
    res = replay_trace(tr)
    off = tr.graphs[1].start.min() - tr.graphs[0].start.min()
    a, _ = res.rank_nodes(1)
    assert res.built.program.release[a] == pytest.approx(off)
    assert res.built.local_comm == 20  # every collective needs absent ranks: replayed locally


def test_cyclic_graph_is_bad_input():
    from ettools.errors import TraceError

    def build(r, b):
        b.add_node("a", dur=1.0, node_id=1)
        b.add_node("b", dur=1.0, node_id=2)
        b.add_dep(0, 2)
        b.add_dep(1, 1)

    with pytest.raises(TraceError, match=r"rank 0: the dependencies form a cycle: 2 nodes .*1 \(a\), 2 \(b\)"):
        replay_trace(_trace(1, build))
