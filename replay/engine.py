"""The event-driven replay engine: every rank's nodes on one global clock.

A :class:`Program` is the whole job flattened into arrays (built by :mod:`.prepare`): node ``u``
has a duration, a *lane* (a host thread or device stream of its rank: one node at a time, FIFO in
the order nodes become ready; ``-1``: no lane, e.g. a collective of a graph without streams),
successors released when it *ends* and successors released when it *starts* (the launch queue:
a launch waits until the op launched ``Q`` places earlier has started), and a kind:

* ``COMPUTE`` — runs ``dur`` once started (longer beside a transfer of its rank: *contention* below);
* ``COLL`` — a member of a collective *instance*: the instance starts when every member has started
  (the global wait map: arrivals are counted per instance) and all members end together, the
  instance's transfer time later (or when a :class:`~.flownet.FlowNetwork` says its flows drained);
* ``P2P`` — one side of a send/recv pair (an instance of two members). Sends are eager, as in
  ASTRA-sim: a send ends its transfer time after it starts, whether or not the recv is posted; the
  recv ends when it has started and the message has arrived (``max(recv start, send start + T)``).
  A send nobody receives is reported like a deadlock once the rest has finished.

Nothing replays measured start times: a node starts when its dependencies are done and its lane is
free (sources at their rank's release time). The loop is a binary heap of end events over the
program's columns copied into typed arrays (:mod:`.loopcols`, 1-8 bytes a node each, freed before
the schedule is built); per node it costs one push, one pop and a walk over its successors.

**Contention.** A kernel that runs beside a collective (NCCL) kernel on its GPU shares the SMs and
memory bandwidth with it and runs slower: the fitted op models carry, per class, the slope ``c`` of
``t·(1 + c·overlap)`` (:attr:`.opclass.ClassFit.contention`, fitted on real kernels).
``Program.contention`` gives each node's ``c`` (0 for measured durations: a captured kernel already
contains the contention it met). A compute node with ``c > 0`` that starts while a collective or
send/recv of its rank is in flight progresses at rate ``1/(1+c)`` until that transfer ends, at full
rate after: with ``w`` the work left (µs alone) at time ``t`` and ``E`` the end of the rank's
in-flight transfers, it ends at ``t + w + min(w·c, (E − t)·c/(1+c))``. ``E`` is what the closed-form
transfer times say; under a flow network (ends not known ahead) ``E`` is unbounded while a transfer
of the rank runs. Whenever ``E`` changes — a transfer of the rank starts (also one that starts while
the node already runs, or at the same instant), or the rank's flow-timed transfers end — the
running modelled nodes of the rank are re-planned from the work they have left (their earlier end
event goes stale). ``Schedule.contention_us`` sums the time added.

If the heap empties with nodes left, the job deadlocked: :class:`ReplayDeadlock` names the
collectives some members reached and others never will, the sends without a recv (and recvs
without a send), and the nodes each stuck rank is blocked at.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .loopcols import DTYPE, I32, compact, csr_permuted, interleaved, typed

COMPUTE, COLL, P2P = 0, 1, 2
FLOW_EVENT = -(1 << 62)  # heap code of a flow-network event (node ends are >= 0, releases ~u)


class ReplayDeadlock(RuntimeError):
    """The replay cannot finish: some collective or send/recv never gets all its members.

    ``details`` lists one dict per problem (``kind``: ``collective``/``p2p``/``blocked``, ``ranks``,
    ``nodes`` ...); ``str()`` is a readable report. The CLI maps it to exit code 1.
    """

    def __init__(self, message: str, details: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.details = details


@dataclass(slots=True)
class Instance:
    """Static description of a collective or send/recv instance (for reports)."""

    kind: int  # COLL or P2P
    label: str  # "all_reduce #3 of group 'tp.0'" / "send/recv 0->1 tag 4 #0"
    members: tuple[int, ...]  # global ranks expected
    need: int  # member nodes that must arrive (members present in the program)


@dataclass
class Program:
    """A job flattened for :func:`simulate` (see the module docstring). Arrays have one entry per node;
    integer columns may be of any signed type (:func:`.program.build_program` makes each as narrow as
    its values allow)."""

    dur: np.ndarray  # float64 µs
    lane: np.ndarray  # -1 none
    kind: np.ndarray  # int8
    inst: np.ndarray  # instance id (COLL/P2P), -1
    succ_ptr: np.ndarray
    succ: np.ndarray
    ssucc_ptr: np.ndarray  # start-successors
    ssucc: np.ndarray
    indeg: np.ndarray  # end-dependencies + start-dependencies
    rank_of: np.ndarray  # index into ``ranks``
    release: np.ndarray  # float64 earliest start of sources (µs)
    inst_dur: np.ndarray  # float64 transfer time per instance (µs); NaN: ask the flow network
    instances: list[Instance]
    ranks: list[int]  # global rank of each rank index
    node_row: np.ndarray  # row of the node in its rank graph
    rank_offset: np.ndarray  # first node of each rank index (len ranks + 1)
    lane_names: list[str] = field(default_factory=list)
    flow_steps: dict[int, list] = field(default_factory=dict)  # instance -> message steps (flow mode)
    is_send: np.ndarray | None = None  # bool per node: the send side of a P2P pair
    rank_release: np.ndarray | None = None  # float64 per rank index: when the rank starts (µs)
    # ASTRA-sim's system layer runs one collective of a rank at a time: a started COLL member waits
    # until its rank's previous collective ended ("fifo"/"lifo": which waiting one goes next; None: off)
    serialize_colls: str | None = None
    # ASTRA-sim's workload layer: a lane that frees goes to its waiting node of smallest index (node
    # id order within a rank), not to the one that became ready first
    lane_by_id: bool = False
    # float64 per node: contention slope c of its modelled time (module docstring); None: off
    contention: np.ndarray | None = None

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.dur)


@dataclass
class Schedule:
    """What :func:`simulate` computed: per node start/end (µs), per instance start/end, and for each
    node the node that released it last (``cause``: dependency, lane predecessor, or for a
    collective the last member to arrive; -1 for sources)."""

    start: np.ndarray
    end: np.ndarray
    cause: np.ndarray
    inst_start: np.ndarray
    inst_end: np.ndarray
    events: int
    contention_us: float = 0.0  # compute time added by contention with transfers (simulated nodes)
    contended: int = 0  # compute nodes that ran slower beside a transfer (simulated nodes)
    contention_by_rank: list[float] = field(default_factory=list)  # the same per simulated rank
    contended_by_rank: list[int] = field(default_factory=list)


def simulate(p: Program, flow: Any = None) -> Schedule:
    """Run the program to completion; raises :class:`ReplayDeadlock` if it cannot finish.

    Ranks are interleaved in memory for the loop (:func:`.loopcols.interleaved`); the schedule is
    indexed by the program's own node order."""
    return _run(p, flow, interleave=True)


def _run(p: Program, flow: Any, interleave: bool) -> Schedule:
    """The event loop of :func:`simulate`, over the nodes in the order
    :func:`.loopcols.interleaved` (the program's own order without ``interleave``). The heap keys
    events by the program's node index, so events at the same instant are taken as they would be
    without the permutation."""
    # (computed here, not by the caller: nothing else holds the int64 order while the loop runs)
    perm = interleaved(p.rank_of, p.rank_offset) if interleave and len(p.ranks) > 1 else None
    n = p.n
    ic = "i" if n <= I32.max else "q"  # node indices
    key, perm_v = typed(ic, n)  # heap tie order: the program's node index (perm_v: its numpy view)
    perm_v[:] = np.arange(n) if perm is None else perm
    del perm
    back, inv = typed(ic, n)  # program node -> loop node
    inv[perm_v] = np.arange(n, dtype=inv.dtype)
    # the adjacency first, while few other columns are alive: its temporaries are the largest
    sp, sc = csr_permuted(p.succ_ptr, p.succ, perm_v, inv)
    ssp, ssc = csr_permuted(p.ssucc_ptr, p.ssucc, perm_v, inv)

    def col(a: np.ndarray) -> array:
        return compact(a, perm_v)

    dur = col(p.dur)
    lane = col(p.lane)
    kind = col(p.kind)
    inst = col(p.inst)
    indeg = col(p.indeg)
    ni = len(p.instances)
    need = [i.need for i in p.instances]
    idur = p.inst_dur.tolist()
    arrived = [0] * ni
    members: list[list[int] | None] = [None] * ni
    inst_start = [math.nan] * ni
    inst_end = [math.nan] * ni
    last_arrival = [-1] * ni
    avail = [math.nan] * ni  # P2P: when the message is at the receiver
    waiting = [-1] * ni  # P2P: a recv posted before its send
    is_send = col(p.is_send) if p.is_send is not None else array("b", [0]) * n
    start = array("d", [math.nan]) * n
    end = array("d", [math.nan]) * n
    cause = array(ic, [-1]) * n
    nlanes = int(p.lane.max()) + 1 if n and len(p.lane) and p.lane.max() >= 0 else 0
    busy = [False] * nlanes
    queues: list[deque | None] = [None] * nlanes
    cvec = col(p.contention) if p.contention is not None and p.contention.any() else None
    rank_of = col(p.rank_of) if cvec else None
    # contention: when the in-flight transfers of each rank end (closed form; inf under a flow
    # network while one runs, reset when the rank's last one ends)
    comm_until = [-math.inf] * len(p.ranks)
    track = bool(cvec)  # count each rank's transfers in flight
    added = [0.0] * len(p.ranks)  # per simulated rank: compute time added by contention
    contended = [0] * len(p.ranks)  # and the nodes it slowed
    # per rank: its running modelled nodes; due[u]: the end planned for u (NaN: not a running one);
    # plans: (plan start, work left then, E then) of nodes re-planned since they started (a node's
    # first plan is its start, its rank's E then — unchanged until a bump — and its end)
    running: list[set[int]] = [set() for _ in p.ranks] if cvec else []
    due = array("d", [math.nan]) * n if cvec else array("d")
    plans: dict[int, tuple[float, float, float]] = {}

    def bump(q: int, e: float, t: float) -> None:
        """The in-flight transfers of rank ``q`` now end at ``e``: re-plan its running modelled nodes."""
        e_old = comm_until[q]
        comm_until[q] = e
        for v in running[q]:
            dv = due[v]
            if dv <= t:
                continue  # ends now
            c = cvec[v]
            pl = plans.get(v)
            if pl is None:  # first plan: its work from the planned span (inverse of the end formula)
                t0, e0 = start[v], e_old
                span = dv - t0
                w0 = span if e0 <= t0 else span / (1.0 + c) if span <= e0 - t0 else span - (e0 - t0) * c / (1.0 + c)
                first = e0 <= t0  # not slowed so far
            else:
                t0, w0, e0 = pl
                first = False
            se = e0 if e0 < t else t
            sl = se - t0 if se > t0 else 0.0  # time it ran slowed since its plan
            w = w0 - sl / (1.0 + c) - (t - t0 - sl)
            if w < 0.0:
                w = 0.0
            x = 0.0
            if e > t:
                x = w * c
                y = (e - t) * c / (1.0 + c)
                x = x if x < y else y
            te = t + w + x
            plans[v] = (t, w, e)
            if te != dv:
                added[q] += te - dv
                if first and x:
                    contended[q] += 1
                due[v] = te
                push(heap, (te, key[v]))

    active_comm = [0] * len(p.ranks)
    heap: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    events = 0
    ready: deque[int] = deque()
    sources = np.flatnonzero(p.indeg == 0)  # in the program's order; only they read a release
    for u, r in zip(inv[sources].tolist(), p.release[sources].tolist()):
        if r > 0:
            push(heap, (r, ~key[u]))  # a ready event
        else:
            ready.append(u)
    t = 0.0
    done = 0
    handoff: deque[int] = deque()  # nodes that inherit a lane from the node that just ended
    serial = p.serialize_colls
    lifo = serial == "lifo"
    coll_rank = col(p.rank_of) if serial else None
    inst_is_coll = [ins.kind == COLL for ins in p.instances] if serial else None
    cq_busy = [False] * len(p.ranks)
    cq_wait: list[deque] = [deque() for _ in p.ranks] if serial else []
    arrivals: deque[int] = deque()  # collective members whose rank's collective queue just freed
    by_id = p.lane_by_id
    heaps: list[list[int]] = [[] for _ in range(nlanes)] if by_id else []
    dirty: list[int] = []  # by_id: lanes with waiting nodes to hand out once time t settles
    while True:
        # start everything that became ready at time t
        while handoff or ready or arrivals or dirty:
            if not (handoff or ready or arrivals):
                # by_id: every node that became ready at t competes; the smallest index wins its lane
                for lu in dirty:
                    hq = heaps[lu]
                    if hq and not busy[lu]:
                        busy[lu] = True
                        handoff.append(pop(hq))
                dirty.clear()
                continue
            queued = False
            if arrivals:
                u = arrivals.popleft()
                queued = True
            elif handoff:
                u = handoff.popleft()
            else:
                u = ready.popleft()
                lu = lane[u]
                if lu >= 0 and by_id:
                    push(heaps[lu], u)
                    dirty.append(lu)
                    continue
                if lu >= 0:
                    if busy[lu]:
                        q = queues[lu]
                        if q is None:
                            q = queues[lu] = deque()
                        q.append(u)
                        continue
                    busy[lu] = True
            if not queued:
                start[u] = t
                a, b = ssp[u], ssp[u + 1]
                for k in range(a, b):
                    v = ssc[k]
                    indeg[v] -= 1
                    if indeg[v] == 0:
                        cause[v] = u
                        ready.append(v)
            ku = kind[u]
            if ku == 0:
                d = dur[u]
                if cvec:
                    c = cvec[u]
                    if c:
                        q = rank_of[u]
                        e = comm_until[q]
                        if e > t:  # beside a transfer: rate 1/(1+c) until it ends (module doc)
                            x = d * c
                            y = (e - t) * c / (1.0 + c)
                            x = x if x < y else y
                            d += x
                            added[q] += x
                            contended[q] += 1
                        due[u] = t + d
                        running[q].add(u)
                push(heap, (t + d, key[u]))
            elif ku == 2:
                i = inst[u]
                ms = members[i]
                if ms is None:
                    ms = members[i] = []
                ms.append(u)
                arrived[i] += 1
                if is_send[u]:
                    inst_start[i] = t
                    last_arrival[i] = u
                    if track:
                        active_comm[rank_of[u]] += 1
                    di = idur[i]
                    if cvec:
                        q = rank_of[u]
                        e = t + di if di == di else math.inf
                        if e > comm_until[q]:
                            bump(q, e, t)
                        v = waiting[i]
                        if v >= 0 and di == di and e > comm_until[rank_of[v]]:
                            bump(rank_of[v], e, t)  # the posted recv takes the message in
                    if di != di:
                        flow.start(i, p.flow_steps.get(i, []), t)
                        te = flow.next_event()
                        if te < math.inf:
                            push(heap, (te, FLOW_EVENT))
                    else:
                        e = t + di
                        avail[i] = e
                        push(heap, (e, key[u]))
                        v = waiting[i]
                        if v >= 0:
                            push(heap, (e, key[v]))
                else:
                    a = avail[i]
                    if a == a:  # the message is there (or on its way): done when it arrives
                        push(heap, (a if a > t else t, key[u]))
                        if cvec and a > comm_until[rank_of[u]]:
                            bump(rank_of[u], a, t)
                    else:
                        waiting[i] = u
            else:
                i = inst[u]
                if serial and not queued and inst_is_coll[i]:
                    q = coll_rank[u]
                    if cq_busy[q]:
                        cq_wait[q].append(u)
                        continue
                    cq_busy[q] = True
                ms = members[i]
                if ms is None:
                    ms = members[i] = []
                ms.append(u)
                arrived[i] += 1
                if arrived[i] == need[i]:
                    inst_start[i] = t
                    last_arrival[i] = u
                    if track:
                        for m in ms:
                            active_comm[rank_of[m]] += 1
                    di = idur[i]
                    if cvec:
                        e = t + di if di == di else math.inf
                        for m in ms:
                            q = rank_of[m]
                            if e > comm_until[q]:
                                bump(q, e, t)
                    if di != di:  # NaN: the flow network times it
                        flow.start(i, p.flow_steps.get(i, []), t)
                        te = flow.next_event()
                        if te < math.inf:
                            push(heap, (te, FLOW_EVENT))
                    else:
                        e = t + di
                        for m in ms:
                            push(heap, (e, key[m]))
        if not heap:
            break
        t, u = pop(heap)
        events += 1
        if u >= 0:
            u = back[u]
        elif u != FLOW_EVENT:
            u = ~back[~u]
        if u < 0:
            if u == FLOW_EVENT:  # flow network event
                if flow.next_event() > t + 1e-9:
                    continue  # stale
                for i in flow.advance(t):
                    if p.instances[i].kind == P2P:
                        avail[i] = t
                        # the started members: the send and a recv already posted (a waiting recv is
                        # one of them: pushing it again would end it twice and release its
                        # dependents early); a recv posted later sees ``avail``
                        for m in members[i]:
                            push(heap, (t, key[m]))
                        continue
                    for m in members[i]:
                        push(heap, (t, key[m]))
                te = flow.next_event()
                if te < math.inf:
                    push(heap, (te, FLOW_EVENT))
                continue
            ready.append(~u)  # released source
            continue
        if cvec:
            dv = due[u]
            if dv == dv:  # a running modelled node
                if dv != t:
                    continue  # re-planned: a stale end event
                due[u] = math.nan
                running[rank_of[u]].discard(u)
                if plans:
                    plans.pop(u, None)
        end[u] = t
        done += 1
        ku = kind[u]
        if ku != 0:
            i = inst[u]
            inst_end[i] = t
            la = last_arrival[i]
            if ku == 1 or (la != u and t > start[u]):
                # a collective member, or a recv that waited for its message: the sender decided
                cause[u] = la if la != u else cause[u]
            if track and (ku == 1 or is_send[u]):
                q = rank_of[u]
                active_comm[q] -= 1
                if cvec and not active_comm[q] and comm_until[q] == math.inf:
                    bump(q, t, t)  # the flow-timed transfers (ends unknown ahead) ended
            if serial and inst_is_coll[i]:
                q = coll_rank[u]
                w = cq_wait[q]
                if w:
                    arrivals.append(w.pop() if lifo else w.popleft())
                else:
                    cq_busy[q] = False
        lu = lane[u]
        if lu >= 0 and by_id:
            busy[lu] = False
            if heaps[lu]:
                dirty.append(lu)
        elif lu >= 0:
            q = queues[lu]
            if q:
                v = q.popleft()
                cause[v] = u
                handoff.append(v)
            else:
                busy[lu] = False
        a, b = sp[u], sp[u + 1]
        for k in range(a, b):
            v = sc[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                cause[v] = u
                ready.append(v)
    unreceived = [i for i in range(ni) if p.instances[i].kind == P2P and arrived[i] == 1
                  and is_send[members[i][0]]] if ni else []
    # the loop's columns go before the schedule is built, so that it does not add to their peak
    del dur, lane, kind, inst, sp, sc, ssp, ssc, indeg, is_send, rank_of, coll_rank, queues, heaps
    # back to the program's node order (start and due are the closure's: rebound, not deleted)
    start_p = np.frombuffer(start)[inv]
    start = due = array("d")
    end_p = np.frombuffer(end)[inv]
    del end
    c = np.frombuffer(cause, DTYPE[ic])[inv]
    del cause
    cause_p = c.astype(np.int64)
    sel = c >= 0
    cause_p[sel] = perm_v[c[sel]]
    del c, sel
    if done < n or unreceived:
        raise _deadlock(p, start_p.tolist(), end_p.tolist(), arrived,
                        [None if ms is None else [key[m] for m in ms] for ms in members])
    return Schedule(start_p, end_p, cause_p, np.asarray(inst_start), np.asarray(inst_end), events,
                    float(sum(added)), int(sum(contended)), added, contended)


def _deadlock(p: Program, start: list[float], end: list[float], arrived: list[int],
              members: list[list[int] | None]) -> ReplayDeadlock:
    """Build the deadlock report: incomplete instances first, then where each stuck rank waits."""
    details: list[dict[str, Any]] = []
    lines: list[str] = []
    names = p.__dict__.get("node_names")  # optional callable (rank index, row) -> str
    node_id = p.__dict__.get("node_id")  # optional callable (rank index, row) -> id

    def describe(u: int) -> dict[str, Any]:
        ri = int(p.rank_of[u])
        row = int(p.node_row[u])
        d = {"rank": p.ranks[ri], "row": row}
        if node_id is not None:
            d["node_id"] = node_id(ri, row)
        if names is not None:
            d["name"] = names(ri, row)
        return d

    def fmt(d: dict[str, Any]) -> str:
        s = f"rank {d['rank']} node {d.get('node_id', d['row'])}"
        if d.get("name"):
            s += f" ({d['name']})"
        return s

    for i, ins in enumerate(p.instances):
        got = arrived[i]
        if got == 0 or got >= ins.need:
            continue
        here = [describe(u) for u in (members[i] or [])]
        reached = sorted({d["rank"] for d in here})
        if ins.kind == P2P:
            is_send = p.is_send is not None and bool(p.is_send[(members[i] or [0])[0]])
            src, dst = ins.members
            missing = [dst] if is_send else [src]
            what = (f"sent by rank {src} but never received by rank {dst}" if is_send
                    else f"posted by rank {dst} but never sent by rank {src}")
            details.append({"kind": "p2p", "instance": ins.label, "reached_by": reached,
                            "waiting_for": missing, "nodes": here, "side": "send" if is_send else "recv"})
            lines.append(f"{ins.label}: {what} (" + ", ".join(fmt(d) for d in here) + ")")
            continue
        missing = [r for r in ins.members if r not in reached]
        details.append({"kind": "collective", "instance": ins.label, "reached_by": reached, "waiting_for": missing,
                        "nodes": here})
        lines.append(f"{ins.label}: reached by rank(s) {reached} at " + ", ".join(fmt(d) for d in here)
                     + f"; never reached by rank(s) {missing}")
    # where does each rank with unfinished nodes stand: its started-but-unfinished nodes
    stuck: dict[int, list[int]] = {}
    for u in range(p.n):
        if end[u] != end[u] and start[u] == start[u]:
            stuck.setdefault(int(p.rank_of[u]), []).append(u)
    unfinished_ranks = sorted({int(p.rank_of[u]) for u in range(p.n) if end[u] != end[u]})
    for ri in unfinished_ranks:
        us = stuck.get(ri, [])
        if not us:
            continue
        ds = [describe(u) for u in us[:5]]
        details.append({"kind": "blocked", "rank": p.ranks[ri], "nodes": ds})
        lines.append(f"rank {p.ranks[ri]} blocked at " + ", ".join(fmt(d) for d in ds))
    if not lines:
        lines.append("nodes never became ready (a dependency cycle across ranks?)")
    n_left = sum(1 for u in range(p.n) if end[u] != end[u])
    msg = f"replay deadlocked with {n_left} of {p.n} nodes unfinished:\n  " + "\n  ".join(lines)
    return ReplayDeadlock(msg, details)
