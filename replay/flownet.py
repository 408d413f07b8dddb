"""Flow-level sharing of link bandwidth between concurrent transfers (a congestion-aware replay).

Every message becomes a flow over the links of its route (Ring: the shorter way round, one link per
hop; Switch: the sender's up-link and the receiver's down-link; FullyConnected: the direct link; a
link graph: a shortest path by hop count, computed with networkx). Concurrent flows share each
link's bandwidth max-min fairly (progressive filling); rates are recomputed whenever a flow starts
or ends, as TrioSim does. A collective's steps run one after the other; a step's flows start
together after the step's hop latency and the step ends when its last flow drains. See
:class:`FlowNetwork`; the routes and links are a :class:`~.network.Network`'s.
"""

from __future__ import annotations

import math
from typing import Any, Protocol


class Links(Protocol):
    """What the flow simulation asks of a network (:class:`~.network.Network` answers it): kept as a
    protocol so that this module imports nothing of the network model, which re-exports it."""

    def route(self, src: int, dst: int) -> list[tuple[Any, Any]]:
        """Directed links ``(a, b)`` a message from ``src`` to ``dst`` crosses."""
        ...

    def link_bandwidth(self, link: tuple[Any, Any]) -> float:
        """Bytes per ns of a directed link."""
        ...

    def link_latency(self, links: list[tuple[Any, Any]]) -> float:
        """Latency (ns) of a route."""
        ...


class FlowNetwork:
    """Flow-level simulation of transfers sharing link bandwidth (max-min fair, recomputed on every
    start and end). A *transfer* (one collective or send/recv instance) is a list of steps; each
    step is a set of messages that start together, after the step's largest route latency, and the
    step ends when its last message drains. The engine drives it with :meth:`start` and
    :meth:`advance`; times are µs like the engine's.
    """

    def __init__(self, net: Links) -> None:
        self.net = net
        self.transfers: dict[int, dict[str, Any]] = {}
        self.flows: dict[int, dict[str, Any]] = {}  # flow id -> {transfer, links, left (bytes)}
        self.next_flow = 0
        self.now = 0.0
        self.version = 0
        self.pending: list[tuple[float, int]] = []  # (time µs, transfer) step starts after latency

    def start(self, tid: int, steps: list[list[tuple[int, int, int]]], t: float) -> None:
        """Begin transfer ``tid`` (its steps) at time ``t`` µs."""
        self._drain_to(t)
        self.transfers[tid] = {"steps": steps, "k": 0, "live": 0}
        self._begin_step(tid, t)

    def _begin_step(self, tid: int, t: float) -> None:
        tr = self.transfers[tid]
        if tr["k"] >= len(tr["steps"]):
            tr["done"] = t
            return
        msgs = tr["steps"][tr["k"]]
        routes = [self.net.route(s, d) for s, d, _ in msgs]
        lat_us = max((self.net.link_latency(r) for r in routes), default=0.0) / 1000.0
        tr["pending_msgs"] = [(r, b) for r, (_, _, b) in zip(routes, msgs) if r]
        self.pending.append((t + lat_us, tid))

    def _activate(self, tid: int) -> None:
        tr = self.transfers[tid]
        for route, b in tr.pop("pending_msgs", []):
            if b <= 0:
                continue
            self.flows[self.next_flow] = {"t": tid, "links": route, "left": float(b), "rate": 0.0}
            self.next_flow += 1
            tr["live"] += 1
        if tr["live"] == 0:
            tr["k"] += 1
            self._begin_step(tid, self.now)

    def _rates(self) -> None:
        """Max-min fair rates (bytes/ns) by progressive filling."""
        flows = self.flows
        for f in flows.values():
            f["rate"] = None
        cap: dict[Any, float] = {}
        users: dict[Any, list[int]] = {}
        for fid, f in flows.items():
            for lk in f["links"]:
                if lk not in cap:
                    cap[lk] = self.net.link_bandwidth(lk)
                users.setdefault(lk, []).append(fid)
        active = {lk: [fid for fid in us] for lk, us in users.items()}
        while active:
            # the link whose fair share is smallest fixes the rates of its unfixed flows
            best, share = None, math.inf
            for lk, us in active.items():
                s = cap[lk] / len(us)
                if s < share:
                    best, share = lk, s
            for fid in active[best]:
                flows[fid]["rate"] = share
                for lk in flows[fid]["links"]:
                    if lk in active and lk != best:
                        cap[lk] -= share
                        active[lk].remove(fid)
                        if not active[lk]:
                            del active[lk]
            del active[best]

    def next_event(self) -> float:
        """Time (µs) of the next flow completion or step activation; inf if none."""
        t = min((p[0] for p in self.pending), default=math.inf)
        for f in self.flows.values():
            if f["rate"]:
                t = min(t, self.now + f["left"] / f["rate"] / 1000.0)
        return t

    def _drain_to(self, t: float) -> None:
        dt_ns = (t - self.now) * 1000.0
        if dt_ns > 0:
            for f in self.flows.values():
                if f["rate"]:
                    f["left"] -= f["rate"] * dt_ns
        self.now = max(self.now, t)

    def advance(self, t: float) -> list[int]:
        """Move to time ``t`` µs (a time :meth:`next_event` returned); returns transfers finished."""
        self._drain_to(t)
        done: list[int] = []
        changed = True
        while changed:
            changed = False
            due = [p for p in self.pending if p[0] <= t + 1e-9]
            if due:
                self.pending = [p for p in self.pending if p[0] > t + 1e-9]
                for _, tid in due:
                    self._activate(tid)
                changed = True
            fin = [fid for fid, f in self.flows.items() if f["left"] <= 1e-6 * max(1.0, f["rate"] or 0.0)]
            for fid in fin:
                f = self.flows.pop(fid)
                tr = self.transfers[f["t"]]
                tr["live"] -= 1
                if tr["live"] == 0:
                    tr["k"] += 1
                    self._begin_step(f["t"], t)
                changed = True
            for tid, tr in list(self.transfers.items()):
                if "done" in tr:
                    done.append(tid)
                    del self.transfers[tid]
                    changed = True
        self._rates()
        return done
