"""Network model: ASTRA-sim network YAML / system JSON, closed-form collective times on Ring, Switch and
FullyConnected dimensions, agreement with ASTRA-sim's congestion-unaware formula for a collectives-only
workload, flow-level bandwidth sharing, link graphs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ettools.converters.chakra import read_chakra, write_chakra
from ettools.errors import TraceError
from ettools.graph import CollectiveType, GraphBuilder, NodeType, ProcessGroup, new_trace
from ettools.replay import load_network, load_system, replay_trace
from ettools.replay.network import Network, parse_flat_yaml

AR, AG, RS, A2A = (int(CollectiveType.ALL_REDUCE), int(CollectiveType.ALL_GATHER),
                   int(CollectiveType.REDUCE_SCATTER), int(CollectiveType.ALL_TO_ALL))


def msg_ns(nbytes: int, hops: int, bw_gbps: float, lat_ns: float) -> int:
    """ASTRA-sim congestion-unaware: floor(hops·latency + bytes / (GB/s · 2^30 / 1e9)) ns."""
    return math.floor(hops * lat_ns + nbytes / (bw_gbps * (1 << 30) / 1e9))


def ring_time(kind: int, S: int, n: int, hops: int, bw: float, lat: float) -> int:
    if kind == AR:
        return 2 * (n - 1) * msg_ns(S // n, hops, bw, lat)
    if kind == AG:
        return (n - 1) * msg_ns(S, hops, bw, lat)
    if kind == A2A:  # ASTRA-sim's ring all-to-all: n(n-1)/2 ring messages of S/n, one after another
        return n * (n - 1) // 2 * msg_ns(S // n, hops, bw, lat)
    return (n - 1) * msg_ns(S // n, hops, bw, lat)


E, R = 10, 30  # ASTRA-sim system layer without endpoint-delay/local-mem-bw keys: 10 ns per hand-off,
# 3 memory accesses of 10 ns per local reduction


def sys_ns(steps: int, reductions: int = 0) -> int:
    """ASTRA-sim's system-layer time of a phase: (steps + 1) endpoint delays and its reductions."""
    return (steps + 1) * E + reductions * R


def coll_trace(n: int, colls: list[tuple[int, int]], group: tuple[int, ...] | None = None):
    """Ranks each running ``colls`` back to back on one group (a collectives-only workload)."""
    tr, strings = new_trace("collectives only", n)
    members = group or tuple(range(n))
    tr.meta.add_group(ProcessGroup("1", members))
    for r in members:
        b = GraphBuilder(r, strings)
        prev = None
        for ct, nb in colls:
            nid = b.add_node(f"coll_{ct}", NodeType.COMM_COLL_NODE, comm_type=ct, comm_bytes=nb, comm_group="1",
                             is_cpu_op=0)
            if prev is not None:
                b.add_dep(b.last_row, prev)
            prev = nid
        tr.graphs[r] = b.build()
    return tr


def test_flat_yaml_subset(tmp_path):
    text = "# ASTRA-sim analytical\ntopology: [ Ring, Switch ]\nnpus_count: [ 4, 2 ]  # per dim\n" \
           "bandwidth:\n  - 50.0\n  - 25\nlatency: [ 500.0, 1000.0 ]\n"
    d = parse_flat_yaml(text)
    assert d == {"topology": ["Ring", "Switch"], "npus_count": [4, 2], "bandwidth": [50.0, 25],
                 "latency": [500.0, 1000.0]}
    p = tmp_path / "net.yml"
    p.write_text(text)
    net = load_network(p)
    assert [x.topology for x in net.dims] == ["Ring", "Switch"] and net.npus == 8
    assert net.coords(5) == (1, 1)  # dim 0 = id % 4, dim 1 = id // 4
    with pytest.raises(TraceError, match="nested mappings"):
        parse_flat_yaml("a:\n  b: 1\n", "x.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("topology: [ Torus ]\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1]\n")
    with pytest.raises(TraceError, match="unknown topology 'Torus'"):
        load_network(bad)
    bad.write_text("topology: [ Ring ]\nnpus_count: [4]\nbandwidth: [1]\n")
    with pytest.raises(TraceError, match="lacks 'latency'"):
        load_network(bad)


def test_system_json(tmp_path):
    p = tmp_path / "system.json"
    p.write_text(json.dumps({"scheduling-policy": "LIFO", "preferred-dataset-splits": 4,
                             "all-reduce-implementation": ["ring", "halvingDoubling"],
                             "all-to-all-implementation": ["direct"], "peak-perf": 900, "local-mem-bw": 3000,
                             "roofline-enabled": 1}))
    s = load_system(p)
    assert s.splits == 4 and s.algorithm("all-reduce", 1) == "halvingDoubling"
    assert s.algorithm("all-to-all", 3) == "direct" and s.algorithm("all-gather", 0) == "ring"
    assert s.peak_tflops == 900 and s.roofline_enabled
    p.write_text(json.dumps({"all-reduce-implementation": ["magic"]}))
    with pytest.raises(TraceError, match="unknown algorithm 'magic'"):
        load_system(p)


@pytest.mark.parametrize("topo,hops", [("Ring", 1), ("Switch", 2), ("FullyConnected", 1)])
@pytest.mark.parametrize("kind", [AR, AG, RS, A2A])
def test_ring_closed_forms(topo, hops, kind):
    n, S, bw, lat = 8, 3 * (1 << 20) + 5, 50.0, 500.0
    net = load_network({"topology": [topo], "npus_count": [n], "bandwidth": [bw], "latency": [lat]})
    assert net.collective_time(kind, S, tuple(range(n))) == ring_time(kind, S, n, hops, bw, lat)


@pytest.mark.parametrize("topo", ["Ring", "Switch", "FullyConnected"])
def test_direct_and_halving_doubling(topo):
    n, S, bw, lat = 8, 1 << 22, 100.0, 300.0
    dim = {"topology": [topo], "npus_count": [n], "bandwidth": [bw], "latency": [lat]}

    def hops(k: int) -> int:
        return 2 if topo == "Switch" else (1 if topo == "FullyConnected" else min(k, n - k))

    direct = load_network(dim, load_system({"all-reduce-implementation": ["direct"],
                                            "all-gather-implementation": ["direct"],
                                            "reduce-scatter-implementation": ["direct"],
                                            "all-to-all-implementation": ["direct"]}))
    rs = max(msg_ns(S // n, hops(k), bw, lat) for k in range(1, n))
    ag = max(msg_ns(S, hops(k), bw, lat) for k in range(1, n))
    assert direct.collective_time(RS, S, tuple(range(n))) == rs + sys_ns(1, 1)
    assert direct.collective_time(A2A, S, tuple(range(n))) == rs + sys_ns(1)
    assert direct.collective_time(AG, S, tuple(range(n))) == ag + sys_ns(1)
    ag_small = max(msg_ns(S // n, hops(k), bw, lat) for k in range(1, n))
    assert direct.collective_time(AR, S, tuple(range(n))) == rs + ag_small + sys_ns(2, 1)
    hd = load_network(dim, load_system({"all-reduce-implementation": ["halvingDoubling"],
                                        "reduce-scatter-implementation": ["halvingDoubling"],
                                        "all-gather-implementation": ["halvingDoubling"]}))
    rs_hd = sum(msg_ns(S >> s, hops(n >> s), bw, lat) for s in (1, 2, 3))
    ag_hd = sum(msg_ns(S << (s - 1), hops(n >> s), bw, lat) for s in (1, 2, 3))
    # measured in ASTRA-sim: n/2 - 1 local reductions
    assert hd.collective_time(RS, S, tuple(range(n))) == rs_hd + sys_ns(3, 3)
    assert hd.collective_time(AG, S, tuple(range(n))) == ag_hd + sys_ns(3)
    ag_of_shard = sum(msg_ns((S // n) << (s - 1), hops(n >> s), bw, lat) for s in (1, 2, 3))
    assert hd.collective_time(AR, S, tuple(range(n))) == rs_hd + ag_of_shard + sys_ns(6, 3)
    dbt = load_network(dim, load_system({"all-reduce-implementation": ["doubleBinaryTree"]}))
    h1 = 2 if topo == "Switch" else 1
    assert dbt.collective_time(AR, S, tuple(range(n))) == 2 * 3 * msg_ns(S // 2, h1, bw, lat) + sys_ns(6, 3)


def test_hierarchical_two_dimensions_and_subgroups():
    net = load_network({"topology": ["Ring", "Switch"], "npus_count": [4, 2], "bandwidth": [200.0, 25.0],
                        "latency": [100.0, 2000.0]})
    S = 1 << 24
    world = tuple(range(8))
    # ALL_REDUCE of the whole network (ASTRA-sim's localBWAware): RS over dim 0 (S), AR over the last
    # dimension (S/4), AG over dim 0 of the S/4 that phase leaves
    want = (ring_time(RS, S, 4, 1, 200.0, 100.0) + ring_time(AR, S // 4, 2, 2, 25.0, 2000.0)
            + ring_time(AG, S // 4, 4, 1, 200.0, 100.0))
    assert net.collective_time(AR, S, world) == want
    # ALL_GATHER: the last dimension first (S), then dim 0 (2S)
    assert net.collective_time(AG, S, world) == (ring_time(AG, S, 2, 2, 25.0, 2000.0)
                                                 + ring_time(AG, 2 * S, 4, 1, 200.0, 100.0))
    # a group inside dim 0 only, and one across dim 1 only
    assert net.collective_time(AG, S, (4, 5, 6, 7)) == ring_time(AG, S, 4, 1, 200.0, 100.0)
    assert net.collective_time(AR, S, (1, 5)) == ring_time(AR, S, 2, 2, 25.0, 2000.0)
    # not a sub-grid: one logical ring, each step as slow as its slowest hop
    step = max(net.send_time(a, b, S // 3) for a, b in ((0, 1), (1, 6), (6, 0)))
    assert net.collective_time(RS, S, (0, 1, 6)) == 2 * step
    # send/recv: the first dimension in which the addresses differ carries it
    assert net.send_time(0, 2, 1000) == msg_ns(1000, 2, 200.0, 100.0)
    assert net.send_time(0, 4, 1000) == msg_ns(1000, 2, 25.0, 2000.0)
    assert net.send_time(0, 5, 1000) == msg_ns(1000, 1, 200.0, 100.0)  # ASTRA-sim: only the first one
    with pytest.raises(ValueError, match="8 NPUs but the trace has 9"):
        net.check_ranks(9)


def test_dataset_splits_pipeline():
    base = {"topology": ["Ring", "Ring"], "npus_count": [4, 4], "bandwidth": [100.0, 10.0], "latency": [50.0, 500.0]}
    S = 1 << 24
    net = load_network(base, load_system({"preferred-dataset-splits": 4}))
    c = S // 4
    phases = [ring_time(RS, c, 4, 1, 100.0, 50.0) + sys_ns(3, 3),
              ring_time(AR, c // 4, 4, 1, 10.0, 500.0) + sys_ns(6, 3),
              ring_time(AG, c // 4, 4, 1, 100.0, 50.0) + sys_ns(3)]
    assert net.collective_time(AR, S, tuple(range(16))) == sum(phases) + 3 * max(phases)
    # a group that is not the whole network: one logical ring, its 4 chunks one after another
    assert net.collective_time(AR, S, (0, 1, 2, 3)) == 4 * (ring_time(AR, c, 4, 1, 100.0, 50.0) + sys_ns(6, 3))


def test_collectives_only_workload_matches_astra_sim_formula(tmp_path):
    """A collectives-only Chakra workload replayed on an ASTRA-sim network YAML takes the sum of the
    congestion-unaware formula's collective times (ns, truncated per message) — what ASTRA-sim's
    analytical congestion-unaware backend gives for back-to-back collectives with one dataset split."""
    yml = tmp_path / "network.yml"
    yml.write_text("topology: [ Switch, Ring ]\nnpus_count: [ 4, 2 ]\nbandwidth: [ 400.0, 50.0 ]  # GB/s\n"
                   "latency: [ 936.25, 500.0 ]  # ns\n")
    system = tmp_path / "system.json"
    system.write_text(json.dumps({"all-reduce-implementation": ["ring", "ring"],
                                  "all-gather-implementation": ["ring", "ring"],
                                  "reduce-scatter-implementation": ["ring", "ring"],
                                  "all-to-all-implementation": ["ring", "ring"],
                                  "preferred-dataset-splits": 1}))
    colls = [(AR, 1 << 20), (AG, 1 << 18), (RS, 1 << 22), (A2A, 1 << 20), (AR, 12345)]
    paths = write_chakra(coll_trace(8, colls), tmp_path / "et", name="workload")
    trace = read_chakra(paths[:-1] if paths[-1].suffix == ".json" else paths)
    res = replay_trace(trace, network=yml, collectives=system)
    sw = (400.0, 936.25, 2)
    rg = (50.0, 500.0, 1)

    def two_dim(kind: int, S: int) -> int:
        # ASTRA-sim: all-reduce = RS dim 0, AR last dim, AG dim 0; all-gather last dimension first;
        # plus (steps + 1) endpoint delays and the reductions per phase
        if kind == AR:
            return (ring_time(RS, S, 4, sw[2], sw[0], sw[1]) + sys_ns(3, 3)
                    + ring_time(AR, S // 4, 2, rg[2], rg[0], rg[1]) + sys_ns(2, 1)
                    + ring_time(AG, S // 4, 4, sw[2], sw[0], sw[1]) + sys_ns(3))
        if kind == AG:
            return (ring_time(AG, S, 2, rg[2], rg[0], rg[1]) + sys_ns(1)
                    + ring_time(AG, S * 2, 4, sw[2], sw[0], sw[1]) + sys_ns(3))
        if kind == RS:
            return (ring_time(RS, S, 4, sw[2], sw[0], sw[1]) + sys_ns(3, 3)
                    + ring_time(RS, S // 4, 2, rg[2], rg[0], rg[1]) + sys_ns(1, 1))
        return (ring_time(A2A, S, 4, sw[2], sw[0], sw[1]) + sys_ns(6)
                + ring_time(A2A, S, 2, rg[2], rg[0], rg[1]) + sys_ns(1))

    want_ns = sum(two_dim(k, s) for k, s in colls)
    assert res.step_time_us == pytest.approx(want_ns / 1000.0, abs=1e-9)
    for rr in res.ranks.values():
        assert rr.comm_us == pytest.approx(want_ns / 1000.0) and rr.compute_us == 0


def test_flow_level_alone_equals_closed_form_and_sharing_slows_down():
    n, S = 8, 1 << 24
    dims = {"topology": ["Ring"], "npus_count": [n], "bandwidth": [50.0], "latency": [0.0]}
    one = coll_trace(n, [(AR, S)])
    closed = replay_trace(one, network=dims).step_time_us
    flow = replay_trace(one, network=dims, congestion=True).step_time_us
    assert flow == pytest.approx(closed, rel=1e-3)
    # two all-reduces at once on the same ring: each link carries both, so both take twice as long
    tr, strings = new_trace("two", n)
    tr.meta.add_group(ProcessGroup("a", tuple(range(n))))
    tr.meta.add_group(ProcessGroup("b", tuple(range(n))))
    for r in range(n):
        b = GraphBuilder(r, strings)
        b.add_node("ar_a", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=S, comm_group="a")
        b.add_node("ar_b", NodeType.COMM_COLL_NODE, comm_type=AR, comm_bytes=S, comm_group="b")
        tr.graphs[r] = b.build()
    both_closed = replay_trace(tr, network=dims).step_time_us
    both_flow = replay_trace(tr, network=dims, congestion=True).step_time_us
    # ASTRA-sim runs one rank's collectives one after another (the closed form itself is unaware)
    assert both_closed == pytest.approx(2 * closed)
    assert both_flow == pytest.approx(2 * closed, rel=1e-3)


def test_link_graph_network(tmp_path):
    # two NPUs behind one switch with a slow uplink to a third
    links = {"links": [{"src": 0, "dst": "s", "bandwidth": 100.0, "latency": 100.0},
                       {"src": 1, "dst": "s", "bandwidth": 100.0, "latency": 100.0},
                       {"src": 2, "dst": "s", "bandwidth": 10.0, "latency": 1000.0}]}
    p = tmp_path / "links.json"
    p.write_text(json.dumps(links))
    net = load_network(p)
    assert isinstance(net, Network) and net.congestion and net.npus == 3
    assert net.send_time(0, 1, 1 << 20) == math.floor(200.0 + (1 << 20) / (100.0 * (1 << 30) / 1e9))
    assert net.send_time(0, 2, 1 << 20) == math.floor(1100.0 + (1 << 20) / (10.0 * (1 << 30) / 1e9))
    tr, strings = new_trace("p2p", 3)
    for r in range(3):
        tr.graphs[r] = GraphBuilder(r, strings).build()
    b0 = GraphBuilder(0, strings)
    b0.add_node("send", NodeType.COMM_SEND_NODE, comm_peer=2, comm_tag=1, comm_bytes=1 << 20)
    b2 = GraphBuilder(2, strings)
    b2.add_node("recv", NodeType.COMM_RECV_NODE, comm_peer=0, comm_tag=1, comm_bytes=1 << 20)
    tr.graphs[0], tr.graphs[2] = b0.build(), b2.build()
    res = replay_trace(tr, network=p)
    # flow level: the route's latency, then the bytes at the bottleneck link's rate
    want = (1100.0 + (1 << 20) / (10.0 * (1 << 30) / 1e9)) / 1000.0
    assert res.ranks[2].span_us == pytest.approx(want, rel=1e-6)


def test_network_too_small_for_trace(tmp_path):
    p = tmp_path / "n.yml"
    p.write_text("topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 10 ]\nlatency: [ 1 ]\n")
    with pytest.raises(TraceError, match="4 NPUs but the trace has 8 ranks"):
        replay_trace(coll_trace(8, [(AR, 100)]), network=p)
    assert np.isfinite(replay_trace(coll_trace(4, [(AR, 100)]), network=p).step_time_us)
