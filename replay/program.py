"""From the prepared ranks (:class:`RankPrep`) to the engine's :class:`~.engine.Program`.

Across ranks (:func:`build_program`): the k-th collective of a process group on each member (program
order, as :func:`ettools.collate.match_collectives` matches them) forms one *instance*; the i-th
send of channel (src, dst, tag) and the i-th recv of that channel form a pair. Pairs of dependency
graphs (Chakra, synthesized) have eager sends, as in ASTRA-sim; pairs of measured traces rendezvous
(both sides end together, the transfer after the later one started), as NCCL send/recv kernels do. Collectives whose group
has members absent from the trace (two ranks of a 128-rank job) and sends/recvs whose peer is absent
cannot be modelled: they replay their measured duration locally (or, lacking one, the network's time
as if every member arrived together). A member that lacks an instance the others reach makes the
replay deadlock, and the report names it.

Transfer time of an instance: the network's closed form when a network is given; otherwise, for a
trace with measured times, the shortest measured duration among the members (the last member to
arrive waited least: its kernel or gloo span is the transfer itself); otherwise the default network
of the hardware description. With a congestion-aware network the instance is handed to the flow
simulation instead.

When each rank starts (:func:`rank_releases`): its first traced event relative to the earliest
rank's, so measured rank skew is replayed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.collate import group_members
from ettools.graph import CollectiveType, NodeType, RankGraph, Trace
from ettools.graph_algorithms import structure_key

from .commorder import issue_order
from .devices import Hardware
from .engine import COLL, COMPUTE, P2P, Instance, Program
from .loopcols import DTYPE, narrowest
from .network import Network, default_network


@dataclass
class RankPrep:
    """One rank made ready for the engine."""

    rank: int
    source: RankGraph
    graph: RankGraph
    form: str  # kineto | graph | fallback
    dur: np.ndarray
    dur_src: np.ndarray
    lane: np.ndarray  # local lane index, -1 none
    lane_names: list[str]
    kind: np.ndarray
    start_dep_src: np.ndarray  # rows whose *start* releases start_dep_dst
    start_dep_dst: np.ndarray
    features: tuple[np.ndarray, np.ndarray]
    release: float = 0.0
    measured_span: float | None = None
    steps: list[tuple[str, float, float]] = field(default_factory=list)
    step_rows: list[np.ndarray] = field(default_factory=list)  # host slices of each step
    step_device_rows: list[np.ndarray] = field(default_factory=list)  # device ops each step launched
    step_bounds: list[tuple[float, float]] = field(default_factory=list)  # measured (start, boundary) of each step
    span_rows: np.ndarray | None = None  # rows whose end ends the rank's span
    notes: dict[str, Any] = field(default_factory=dict)
    contention: np.ndarray | None = None  # per node: contention slope of its op-model time (0: none)


@dataclass
class Built:
    """A program plus what reports need to map it back to the trace."""

    program: Program
    preps: dict[int, RankPrep]
    sim_ranks: list[int]
    rep_of: dict[int, int]
    local_comm: int = 0  # comm nodes replayed locally (group or peer absent)


def _comm_rows(g: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    p2p = np.flatnonzero((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE))
    return coll, p2p


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the columns ``cols`` (as an ``(k, len(cols))`` int64 array) and each row's
    index among them — ``np.unique(axis=0)`` through one 1-D key of per-column codes (several
    times faster: no structured-array sort)."""
    key = np.zeros(len(cols[0]), np.int64)
    for i, c in enumerate(cols):
        vals, code = np.unique(np.asarray(c, np.int64), return_inverse=True)
        key = key * len(vals) + code.reshape(-1)
        if i < len(cols) - 1:  # re-code so the key stays below len(rows) (no int64 overflow)
            key = np.unique(key, return_inverse=True)[1].reshape(-1)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return np.stack([np.asarray(c, np.int64)[first] for c in cols], axis=1), inv.reshape(-1)


_NONE = np.zeros(0)


def comm_times(trace: Trace, preps: dict[int, RankPrep], net: Network | None, hw: Hardware) -> dict[int, np.ndarray]:
    """Per rank, the network time (µs) of each comm node as if all its members arrived together
    (NaN where unknown): the closed form of ``net`` or, without one, the hardware's default network.
    Computed once per distinct (group, type, bytes) and (type, peer, bytes) of a rank."""
    world = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)
    model = net if net is not None else default_network(world, hw)
    out: dict[int, np.ndarray] = {}
    members_of: dict[str, tuple[int, ...] | None] = {}
    times_of: dict[tuple[str, int, int], float] = {}
    # ranks stamped from one graph share its type/comm_type/comm_bytes columns and differ only in
    # groups and peers: their comm rows and (type, bytes) codes are found once
    shared: dict[tuple[int, int, int], tuple] = {}
    full_of: dict[tuple, np.ndarray] = {}
    for r, p in preps.items():
        g = p.graph
        sk = (id(g.type), id(g.comm_type), id(g.comm_bytes))
        hit = shared.get(sk)
        if hit is None:
            coll, p2p = _comm_rows(g)
            tb, tb_code = _unique_rows(g.comm_type[coll], g.comm_bytes[coll])
            sb, sb_code = _unique_rows(g.type[p2p] == NodeType.COMM_SEND_NODE, g.comm_bytes[p2p])
            # the columns themselves are kept so that their ids stay theirs while the loop runs
            hit = shared[sk] = (coll, p2p, tb, tb_code, sb, sb_code, (g.type, g.comm_type, g.comm_bytes))
        coll, p2p, tb, tb_code, sb, sb_code, _keep = hit
        tc = tp = _NONE
        if len(coll):
            gid = g.comm_group[coll].astype(np.int64)
            _u, first, inv = np.unique((gid + 1) * max(len(tb), 1) + tb_code, return_index=True,
                                       return_inverse=True)
            vals = np.full(len(first), np.nan)
            for k, (gi, (ct, b)) in enumerate(zip(gid[first].tolist(), tb[tb_code[first]].tolist())):
                nm = g.strings[gi] if gi >= 0 else ""
                v = times_of.get((nm, ct, b))
                if v is None:
                    if nm not in members_of:
                        m = group_members(trace, nm)
                        members_of[nm] = None if m is None else tuple(m)
                    mem = members_of[nm]
                    v = np.nan if mem is None or b < 0 else model.collective_time(ct, b, mem) / 1000.0
                    times_of[(nm, ct, b)] = v  # one group's members share its times
                vals[k] = v
            tc = vals[inv.reshape(-1)]
        if len(p2p):
            peer_col = g.comm_peer[p2p].astype(np.int64)
            _u, first, inv = np.unique((peer_col + 1) * max(len(sb), 1) + sb_code, return_index=True,
                                       return_inverse=True)
            vals = np.full(len(first), np.nan)
            for k, (peer, (is_send, b)) in enumerate(zip(peer_col[first].tolist(), sb[sb_code[first]].tolist())):
                if peer < 0 or b < 0 or peer >= max(world, model.npus or world):
                    continue
                a, z = (r, peer) if is_send else (peer, r)
                vals[k] = model.send_time(a, z, b) / 1000.0
            tp = vals[inv.reshape(-1)]
        # ranks alike share one array (read-only): thousands of ranks of one structure and times
        fk = (sk, tc.tobytes(), tp.tobytes())
        t = full_of.get(fk)
        if t is None:
            t = np.full(len(g), np.nan)
            t[coll], t[p2p] = tc, tp
            t.setflags(write=False)
            full_of[fk] = t
        out[r] = t
    return out


def build_program(trace: Trace, preps: dict[int, RankPrep], net: Network | None, hw: Hardware,
                  rep_of: dict[int, int] | None = None, ctimes: dict[int, np.ndarray] | None = None,
                  align_ranks: bool = False) -> Built:
    """Flatten the prepared ranks (representatives only, under symmetry) into a :class:`Program`.

    ``align_ranks``: release every rank at time 0 (the no-skew answer) instead of at its first
    traced event on the job's clock (see :func:`rank_releases`).
    """
    all_ranks = sorted(preps)
    rep_of = rep_of or {r: r for r in all_ranks}
    sim = sorted(set(rep_of.values()))
    present = set(trace.graphs)
    if ctimes is None:
        ctimes = comm_times(trace, {r: preps[r] for r in sim}, net, hw)
    flow_mode = net is not None and net.congestion
    offsets = [0]
    for r in sim:
        offsets.append(offsets[-1] + len(preps[r].graph))
    n = offsets[-1]
    dur = np.concatenate([preps[r].dur for r in sim]) if sim else np.zeros(0)
    kind = np.concatenate([preps[r].kind for r in sim]) if sim else np.zeros(0, np.int8)
    lane = np.full(n, -1, np.int32)
    lane_names: list[str] = []
    for j, r in enumerate(sim):
        p = preps[r]
        loc = p.lane
        lane[offsets[j]:offsets[j + 1]] = np.where(loc >= 0, loc + len(lane_names), -1)
        lane_names += [f"rank {r} {nm}" for nm in p.lane_names]
    rank_of = np.repeat(np.arange(len(sim), dtype=np.int32), np.diff(offsets))
    node_row = (np.concatenate([np.arange(len(preps[r].graph), dtype=np.int32) for r in sim]) if sim
                else np.zeros(0, np.int32))
    inst = np.full(n, -1, np.int32)
    instances: list[Instance] = []
    inst_dur: list[float] = []
    flow_steps: dict[int, list] = {}
    keymap: dict[tuple, int] = {}
    local = 0
    world = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)

    def add_instance(key: tuple, k: int, label: str, members: tuple[int, ...], need: int) -> int:
        i = keymap.get(key)
        if i is None:
            i = keymap[key] = len(instances)
            instances.append(Instance(k, label, members, need))
            inst_dur.append(np.nan)
        return i

    measured_by_inst: dict[int, list[float]] = {}
    members_cache: dict[str, Any] = {}
    coll_names: dict[int, str] = {}
    topo: dict[tuple, np.ndarray] = {}  # topological positions per shared graph structure
    model_by_inst: dict[int, float] = {}
    for j, r in enumerate(sim):
        p = preps[r]
        g = p.graph
        off = offsets[j]
        coll, p2p = _comm_rows(g)
        ct = ctimes[r]
        if len(coll):
            gid = g.comm_group[coll].astype(np.int64)
            okey = issue_order(g, coll, topo)
            o = np.lexsort((okey, gid))
            rows_sorted, gid_sorted = coll[o], gid[o]
            new = np.ones(len(o), bool)
            new[1:] = gid_sorted[1:] != gid_sorted[:-1]
            seg = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
            kth = np.arange(len(o)) - seg
            role_count: dict[tuple, int] = {}
            ginfo: dict[int, tuple | None] = {}  # per group of this rank: (name, members, key prefix, need)
            durs = g.dur[rows_sorted].tolist()
            starts = g.start[rows_sorted].tolist()
            ctypes = g.comm_type[rows_sorted].tolist()
            cts = ct[rows_sorted].tolist()
            for j, (row, gi, k) in enumerate(zip(rows_sorted.tolist(), gid_sorted.tolist(), kth.tolist())):
                info = ginfo.get(gi, False)
                if info is False:
                    gname = g.strings[gi] if gi >= 0 else ""
                    mem = members_cache.get(gname, False)
                    if mem is False:
                        mem = members_cache[gname] = group_members(trace, gname)
                    if mem is None or not present.issuperset(mem) or r not in mem:
                        info = None
                    else:
                        reps = tuple(sorted({rep_of[m] for m in mem}))
                        if len(sim) == len(all_ranks):
                            prefix = ("c", gname)
                        else:  # symmetric: the n-th group of this class pattern on the representative
                            base = ("c", reps)
                            prefix = base + (role_count.get(base, 0),)
                            role_count[base] = role_count.get(base, 0) + 1
                        info = (gname, tuple(mem), prefix, len(reps))
                    ginfo[gi] = info
                ctype = ctypes[j]
                cname = coll_names.get(ctype)
                if cname is None:
                    try:
                        cname = CollectiveType(ctype).name.lower()
                    except ValueError:
                        cname = f"collective type {ctype}"
                    coll_names[ctype] = cname
                if info is None:
                    local += 1
                    if flow_mode:  # no flows without the members: timed on its own
                        dur[off + row] = _local_time(g, row, ct)
                        kind[off + row] = COMPUTE
                        continue
                    # members absent (a partial trace): still a transfer of this rank (compute beside
                    # it meets contention), timed as if every member arrived with it
                    i = add_instance(("l", r, row), COLL, f"{cname} of group {g.strings[gi] if gi >= 0 else ''!r} "
                                                          f"(members absent)", (r,), 1)
                else:
                    gname, mem, prefix, need = info
                    key = prefix + (k,)
                    i = keymap.get(key)
                    if i is None:
                        i = add_instance(key, COLL, f"{cname} #{k} of group {gname!r}", mem, need)
                inst[off + row] = i
                d = durs[j]
                if d == d and d >= 0:
                    measured_by_inst.setdefault(i, []).append((starts[j], d))
                if cts[j] == cts[j]:
                    model_by_inst[i] = cts[j]
                if flow_mode and info is not None and i not in flow_steps:
                    flow_steps[i] = net.collective_steps(ctype, max(int(g.comm_bytes[row]), 0), info[1])
        if len(p2p):
            # measured traces (NCCL send/recv kernels, gloo spans) rendezvous; dependency graphs
            # (Chakra, synthesized) have ASTRA-sim's eager sends
            measured_pair = p.form == "kineto"
            okey = issue_order(g, p2p, topo)
            order = p2p[np.argsort(okey, kind="stable")]
            count: dict[tuple, int] = {}
            for row in order.tolist():
                peer = int(g.comm_peer[row])
                is_send = g.type[row] == NodeType.COMM_SEND_NODE
                if peer < 0 or peer >= world or peer not in present:
                    dur[off + row] = _local_time(g, row, ct)
                    kind[off + row] = COMPUTE
                    local += 1
                    continue
                a, b = (r, peer) if is_send else (peer, r)
                ra, rb = rep_of.get(a, a), rep_of.get(b, b)
                chan = (ra, rb, int(g.comm_tag[row]), bool(is_send))
                k = count.get(chan, 0)
                count[chan] = k + 1
                key = ("p", ra, rb, int(g.comm_tag[row]), k)
                i = add_instance(key, P2P, f"send/recv {a}->{b} tag {int(g.comm_tag[row])} #{k}", (a, b), 2)
                inst[off + row] = i
                if measured_pair:
                    kind[off + row] = COLL  # rendezvous: measured send/recv kernels (spans) wait for each other
                d = g.dur[row]
                if np.isfinite(d) and d >= 0:
                    measured_by_inst.setdefault(i, []).append((float(g.start[row]), float(d)))
                if np.isfinite(ct[row]):
                    model_by_inst[i] = float(ct[row])
                if flow_mode and i not in flow_steps:
                    flow_steps[i] = [[(a, b, max(int(g.comm_bytes[row]), 0))]]
    idur = np.asarray(inst_dur, np.float64)
    for i in range(len(instances)):
        if flow_mode:
            idur[i] = np.nan
        elif net is not None and i in model_by_inst:
            idur[i] = model_by_inst[i]
        elif i in measured_by_inst:
            idur[i] = measured_transfer(measured_by_inst[i])
        elif i in model_by_inst:
            idur[i] = model_by_inst[i]
        else:
            idur[i] = 0.0
    # edges: 4-byte indices where they fit; the start dependencies (launch queue) are few
    succ_ptr, succ, indeg = _end_edges(preps, sim, offsets)
    s_src_a = np.concatenate([preps[r].start_dep_src + offsets[j] for j, r in enumerate(sim)] or [np.zeros(0)])
    s_dst_a = np.concatenate([preps[r].start_dep_dst + offsets[j] for j, r in enumerate(sim)] or [np.zeros(0)])
    s_src_a, s_dst_a = s_src_a.astype(np.int64), s_dst_a.astype(np.int64)
    ssucc_ptr, ssucc = _csr(s_src_a, s_dst_a, n)
    if len(s_dst_a):
        indeg += np.bincount(s_dst_a, minlength=n).astype(indeg.dtype)
    del s_src_a, s_dst_a
    # release: each rank's first event, relative to the earliest rank (measured traces on one
    # clock: rank skew is replayed); sources that start later in the trace than their rank's first
    # event (orphans) at their own start, relative to their rank's
    release = np.zeros(n)
    starts = first_events(preps, sim)
    rel = rank_releases(preps, sim, align_ranks)
    rank_release = np.asarray([rel.get(r, 0.0) for r in sim], np.float64)
    for j, r in enumerate(sim):
        if r in starts:
            a, z = offsets[j], offsets[j + 1]
            release[a:z] = rel[r]
            rg_start = preps[r].graph.start
            src_rows = np.flatnonzero(indeg[a:z] == 0)
            late = src_rows[np.isfinite(rg_start[src_rows]) & (rg_start[src_rows] > starts[r])]
            release[a + late] = rg_start[late] - starts[r] + rel[r]
    prog = Program(
        dur=np.nan_to_num(dur, nan=0.0, copy=False), lane=_narrow(lane), kind=kind, inst=_narrow(inst),
        succ_ptr=succ_ptr, succ=succ, ssucc_ptr=_narrow(ssucc_ptr), ssucc=ssucc, indeg=_narrow(indeg),
        rank_of=_narrow(rank_of), release=release, inst_dur=idur, instances=instances, ranks=sim,
        node_row=_narrow(node_row),
        rank_offset=np.asarray(offsets, np.int64), lane_names=lane_names,
        flow_steps=flow_steps, rank_release=rank_release,
    )
    if isinstance(net, Network) and net.dims and net.system.from_file:
        astrasim_lanes(prog, [preps[r].graph for r in sim], offsets)
    elif isinstance(net, Network) and net.dims:
        # ASTRA-sim's system layer: a rank's collectives one at a time (see replay/engine.py)
        prog.serialize_colls = "lifo" if net.system.lifo else "fifo"
    if sim and any(preps[r].contention is not None and preps[r].contention.any() for r in sim):
        prog.contention = np.concatenate([preps[r].contention if preps[r].contention is not None
                                          else np.zeros(len(preps[r].graph)) for r in sim])
    prog.is_send = np.concatenate([preps[r].graph.type == NodeType.COMM_SEND_NODE for r in sim]) if sim else np.zeros(0, bool)
    # node ids and names for a deadlock report, looked up in the rank graphs when one is made
    prog.node_id = lambda ri, row: int(preps[sim[ri]].graph.id[row])
    prog.node_names = lambda ri, row: preps[sim[ri]].graph.name_of(row)
    return Built(prog, preps, sim, rep_of, local)


def astrasim_lanes(prog: Program, graphs: list[RankGraph], offsets: list[int]) -> None:
    """ASTRA-sim's execution model (``--network`` YAML with ``--collectives`` SYS): per rank one host
    node (``is_cpu_op``), one device compute node and one collective or send at a time, whatever
    thread or stream a node came from; a recv holds nothing. A freed resource goes to the waiting
    node of smallest id (ASTRA-sim's feeder hands out dependency-free nodes in id order)."""
    n = prog.n
    lane = np.full(n, -1, np.int32)
    names: list[str] = []
    for j, g in enumerate(graphs):
        a, z = offsets[j], offsets[j + 1]
        t = g.type
        comm = (t == NodeType.COMM_COLL_NODE) | (t == NodeType.COMM_SEND_NODE)
        host = (t == NodeType.COMP_NODE) & (g.is_cpu_op == 1)
        dev = (t == NodeType.COMP_NODE) & (g.is_cpu_op != 1)
        base = len(names)
        lane[a:z] = np.select([host, dev, comm], [base, base + 1, base + 2], -1)
        names += [f"rank {prog.ranks[j]} host", f"rank {prog.ranks[j]} device", f"rank {prog.ranks[j]} comm"]
    prog.lane = _narrow(lane)
    prog.lane_names = names
    prog.lane_by_id = True


def first_events(preps: dict[int, RankPrep], ranks: list[int] | None = None) -> dict[int, float]:
    """Start of each measured rank's first kept event (µs on the trace's clock). Only measured
    traces (Kineto form, every start known) have one; other ranks start at 0."""
    ranks = sorted(preps) if ranks is None else ranks
    return {r: float(preps[r].source.start.min()) for r in ranks
            if len(preps[r].source) and np.isfinite(preps[r].source.start).all()
            and (preps[r].form == "kineto" or (preps[r].form == "graph" and "rank_clock" in preps[r].source.meta))}


def rank_releases(preps: dict[int, RankPrep], ranks: list[int] | None = None,
                  align_ranks: bool = False) -> dict[int, float]:
    """When each rank starts in the replay (µs): its first traced event relative to the earliest
    rank's, so ranks that entered the step late (a slow data loader, a straggler) enter it late in
    the replay too and their peers wait for them in collectives; all 0 with ``align_ranks`` (the
    no-skew answer) or when the trace has no measured times. The reader puts ranks on one clock
    when the files allow (``meta.extra["rank_clock"]``), else at their own first event."""
    ranks = sorted(preps) if ranks is None else ranks
    starts = first_events(preps, ranks)
    t0 = min(starts.values()) if starts else 0.0
    return {r: (0.0 if align_ranks or r not in starts else starts[r] - t0) for r in ranks}


def measured_transfer(spans: list[tuple[float, float]]) -> float:
    """Transfer time of an instance from its members' measured ``(start, dur)``: the shortest span
    (the last member to arrive waited least: its kernel or gloo span is the transfer itself).

    From the last member's start to the first member's end would need the ranks' clocks to agree,
    and gloo's send spans time the ``wait()`` on the send, not the transfer: tried on the sample
    captures, it was further off than the shortest span."""
    return min(d for _, d in spans)


def _local_time(g: RankGraph, row: int, ct: np.ndarray) -> float:
    """A comm node replayed on its own: measured time, else the network's."""
    d = g.dur[row]
    if np.isfinite(d) and d >= 0:
        return float(d)
    return float(ct[row]) if np.isfinite(ct[row]) else 0.0


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest signed integer type that holds its values: a program of 1,024 ranks
    has a few thousand lanes and instances, and ranks of a few hundred nodes, in 2 bytes a node."""
    return a.astype(DTYPE[narrowest(a)], copy=False)


def _index_dtype(top: int) -> type:
    """int32 for indices up to ``top`` where they fit (half the bytes per node or edge), else int64."""
    return np.int32 if top <= np.iinfo(np.int32).max else np.int64


def _csr(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Successors of each of ``n`` nodes from edges ``src -> dst``, in edge order per node."""
    o = np.argsort(src, kind="stable")
    ptr = np.zeros(n + 1, _index_dtype(len(src)))
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    return ptr, dst[o].astype(_index_dtype(n))


def _end_edges(preps: dict[int, RankPrep], sim: list[int], offsets: list[int]) -> tuple[np.ndarray, ...]:
    """``(succ_ptr, succ, indeg)`` of the end dependencies of the ranks ``sim``, laid out one after
    another at ``offsets``, dangling edges dropped: as one stable sort of every edge by source would
    give them (each rank's edges are a block of that order), without the job-wide temporaries.

    Ranks stamped from one graph (same :func:`~ettools.graph_algorithms.structure_key`) share their
    local adjacency, computed once (so only the first of them builds and keeps the 16-byte-a-node id
    index of :meth:`~ettools.rank_graph.RankGraph.rows_of`)."""
    uses = Counter(structure_key(preps[r].graph) for r in sim)
    local: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    ptrs, succs, indegs = [], [], []
    n = offsets[-1] if sim else 0
    edges = 0
    it = _index_dtype(n)
    for j, r in enumerate(sim):
        g = preps[r].graph
        key = structure_key(g)
        got = local.get(key)
        if got is None:
            src, dst, _ = g.edge_rows()
            ok = src >= 0
            src, dst = src[ok], dst[ok]
            o = np.argsort(src, kind="stable")
            got = (np.bincount(src, minlength=len(g)), dst[o].astype(it),
                   np.bincount(dst, minlength=len(g)).astype(it))
            del src, dst, ok, o
            if uses[key] > 1:
                local[key] = got
        uses[key] -= 1
        if not uses[key]:
            local.pop(key, None)
        deg, lsucc, lindeg = got
        ptrs.append(deg)
        succs.append(lsucc + it(offsets[j]))
        indegs.append(lindeg)
        edges += len(lsucc)
    ptr = np.zeros(n + 1, _index_dtype(edges))
    if sim:
        np.cumsum(np.concatenate(ptrs), out=ptr[1:])
    del ptrs
    succ = np.concatenate(succs) if succs else np.zeros(0, it)
    del succs
    indeg = np.concatenate(indegs) if indegs else np.zeros(0, it)
    return ptr, succ, indeg
