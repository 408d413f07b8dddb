"""Network model of the replay: ASTRA-sim's analytical network YAML and system JSON, read as-is, and
collective times over multi-dimensional topologies (closed form) or over an explicit link graph
with flow-level bandwidth sharing.

Closed-form collective times (congestion-unaware, the model of ASTRA-sim's analytical
``congestion_unaware`` backend)
-------------------------------------------------------------------------------------------------
One message of ``m`` bytes over ``h`` hops of a dimension with link bandwidth ``B`` (B/ns =
GB/s · 2^30 / 10^9) and hop latency ``α`` (ns) takes ``d(m, h) = floor(h·α + m/B)`` ns — ASTRA-sim's
``BasicTopology::compute_communication_delay``, truncated to whole ns as its ``EventTime`` is. Hops:
``Switch`` 2 (NPU → switch → NPU), ``FullyConnected`` 1, ``Ring`` the shorter way round
(``min(k, n − k)`` for NPUs ``k`` apart, so 1 between ring neighbours). Messages of one algorithm
step run concurrently and a step lasts as long as its slowest message; message sizes are whole bytes
(integer division, as ASTRA-sim's ``msg_size = data_size / nodes``). With ``S`` the Chakra
``comm_size`` (per-rank buffer, see :mod:`ettools.graph`) on a dimension of ``n`` NPUs:

================  =====================================================================
algorithm         time on one dimension
================  =====================================================================
ring              ALL_REDUCE ``2(n−1)·d(S/n, h₁)``; REDUCE_SCATTER ``(n−1)·d(S/n, h₁)``;
                  ALL_GATHER ``(n−1)·d(S, h₁)``; ALL_TO_ALL ``(n−1)·d(S/n, h₁)``
                  (``h₁`` = hops between ring neighbours)
direct            one step, every member sends to every other: REDUCE_SCATTER and ALL_TO_ALL
                  ``max_k d(S/n, h_k)``; ALL_GATHER ``max_k d(S, h_k)``; ALL_REDUCE =
                  REDUCE_SCATTER + ALL_GATHER of ``S/n``
halvingDoubling   ``log₂n`` steps (``n`` a power of two, else ring): REDUCE_SCATTER step ``s``
                  sends ``S/2^s`` to the NPU ``n/2^s`` away; ALL_GATHER mirrors it with
                  ``S·2^(s−1)``; ALL_REDUCE = both with the same ``S``; ALL_TO_ALL as ring
doubleBinaryTree  ALL_REDUCE: reduce up and broadcast down two complementary trees, each
                  carrying ``S/2``, concurrently: ``2·⌈log₂ n⌉·d(S/2, h₁)``; other types as
                  ring
================  =====================================================================

A collective over several dimensions is hierarchical (ASTRA-sim's baseline): its group's extent in
each dimension (the distinct coordinates its members take there) gives ``k_0, k_1, …``;
REDUCE_SCATTER runs dimension 0 on ``S``, then dimension 1 on ``S/k_0``, …; ALL_GATHER runs
dimension 0 on the per-rank input ``S``, then dimension 1 on ``S·k_0``, …; ALL_REDUCE is
REDUCE_SCATTER up the dimensions followed by ALL_GATHER back down (``S/Πk`` gathered first over
the last dimension); ALL_TO_ALL runs each dimension on ``S``. With ``preferred-dataset-splits`` =
``c`` the buffer is cut into ``c`` chunks pipelined through the phases, one chunk per phase at a
time: ``T = Σ_p t_p(S/c) + (c − 1)·max_p t_p(S/c)``. A group that is not a full sub-grid of the
dimensions (or a network given as a link graph) runs as one logical ring over its members in
group order; a ring step lasts as long as its slowest neighbour-to-neighbour message
(``Network.send_time``). A send/recv takes ``send_time(src, dst, S)``: the first dimension in which
their coordinates differ carries it (ASTRA-sim's ``MultiDimTopology::send``). BROADCAST, REDUCE,
GATHER, SCATTER are timed as ALL_GATHER, REDUCE_SCATTER, ALL_GATHER and REDUCE_SCATTER of the same
buffer (an upper bound of their tree forms); BARRIER as an ALL_REDUCE of 1 byte.

ASTRA-sim's system layer, matched against its analytical build (exact to the ns on 1-D Ring/Switch
and 2-D Switch networks, ring/direct/halving-doubling): a collective phase of ``k`` message steps
also costs ``(k + 1)`` × ``endpoint-delay`` (10 ns if the system file has none), and each reducing
step (reduce-scatter, the reduce-scatter half of all-reduce) a local reduction of its message —
one write and two reads of ``m`` bytes, ``floor(m / local-mem-bw)`` ns each. ASTRA-sim's ring
ALL_TO_ALL sends ``n(n−1)/2`` ring messages of ``S/n`` one after another. Only a group of every NPU
of a network of several dimensions runs hierarchically; every other group (and everything on a
1-D network) runs as one logical ring over its members, its chunks one after another. A rank runs
one collective at a time (``scheduling-policy`` LIFO: the newest waiting one next; see
:mod:`.engine`). Not matched: doubleBinaryTree (ASTRA-sim runs an all-reduce whatever the type).

The inputs (ASTRA-sim's network YAML and system JSON) are read by :mod:`.netconfig`; flow-level
sharing of link bandwidth (``Network(..., congestion=True)`` or a link graph) is simulated by
:class:`.flownet.FlowNetwork` over this module's routes; a fitted network (``ettools calibrate
--network``) is :class:`.netfit.CommFit`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.graph import CollectiveType

from .devices import Hardware, presets

# re-exported: the API, serve, tests and the CLI import these from here
from .flownet import FlowNetwork  # noqa: F401
from .netconfig import (  # noqa: F401
    _ALGO_ALIASES,
    _TOPO_ALIASES,
    ALGORITHMS,
    GB,
    TOPOLOGIES,
    Dim,
    SystemConfig,
    coll_kind,
    load_system,
    parse_flat_yaml,
)
from .netfit import CommFit, is_network_fit, shipped_network_fit


class Network:
    """A multi-dimensional network (ASTRA-sim's analytical model) or an explicit link graph.

    ``dims``: the dimensions, dim 0 fastest. ``graph``: optional ``networkx.Graph`` whose nodes
    include the NPU ids ``0..N-1`` (other nodes are switches) and whose edges carry ``bandwidth``
    (GB/s per direction) and ``latency`` (ns); given a graph, collectives run as rings over their
    members and transfers follow shortest paths. ``congestion``: share link bandwidth between
    concurrent transfers (flow level) instead of the closed forms.
    """

    def __init__(self, dims: list[Dim] | None = None, system: SystemConfig | None = None,
                 graph: Any = None, congestion: bool = False, source: str = "") -> None:
        self.dims = list(dims or [])
        self.system = system or SystemConfig()
        self.graph = graph
        self.congestion = bool(congestion or graph is not None)
        self.source = source
        if graph is not None:
            npus = [n for n in graph.nodes if isinstance(n, (int, np.integer))]
            self.npus = (max(npus) + 1) if npus else 0
        else:
            self.npus = int(np.prod([d.npus for d in self.dims])) if self.dims else 0
        self._cache: dict[tuple, float] = {}
        self._paths: dict[tuple[int, int], list] = {}

    # ---- addressing ------------------------------------------------------------------------
    def coords(self, npu: int) -> tuple[int, ...]:
        """Per-dimension coordinates of an NPU (dim 0 = id % n0, ...)."""
        out = []
        for d in self.dims:
            out.append(npu % d.npus)
            npu //= d.npus
        return tuple(out)

    def check_ranks(self, world: int) -> None:
        """Raise ValueError if the network has fewer NPUs than the trace has ranks."""
        if self.npus and world > self.npus:
            raise ValueError(f"the network has {self.npus} NPUs but the trace has {world} ranks")

    # ---- point to point ----------------------------------------------------------------------
    def send_time(self, src: int, dst: int, nbytes: int) -> float:
        """ns for one message (ASTRA-sim ``MultiDimTopology::send``; a link graph: path latency + bytes/bottleneck)."""
        if src == dst:
            return 0.0
        if self.graph is not None:
            path = self.path(src, dst)
            lat = sum(self.graph.edges[a, b].get("latency", 0.0) for a, b in zip(path, path[1:]))
            bw = min(self.graph.edges[a, b]["bandwidth"] for a, b in zip(path, path[1:])) * GB / 1e9
            return float(math.floor(lat + max(nbytes, 0) / bw))
        cs, cd = self.coords(src), self.coords(dst)
        for k, d in enumerate(self.dims):
            if cs[k] != cd[k]:
                return d.delay(int(nbytes), d.hops(cs[k], cd[k]))
        return 0.0

    def path(self, src: int, dst: int) -> list:
        """Shortest path (by hops) of a link graph, cached."""
        key = (src, dst)
        p = self._paths.get(key)
        if p is None:
            import networkx as nx

            p = nx.shortest_path(self.graph, src, dst)
            self._paths[key] = p
        return p

    # ---- collectives (closed form) -----------------------------------------------------------
    def collective_time(self, comm_type: int, nbytes: int, members: tuple[int, ...]) -> float:
        """ns for one collective of ``nbytes`` (Chakra comm_size) over ``members`` (global ranks).

        ASTRA-sim's system layer cuts the buffer into chunks of ``nbytes // preferred-dataset-splits``
        (``ceil(nbytes / chunk)`` of them). A group that is not the whole network, or any group of a
        one-dimensional network, runs as one logical ring over its members and its chunks run one
        after another; the whole network of several dimensions runs each chunk through per-dimension
        phases, chunks pipelined across the dimensions.
        """
        n = len(members)
        if n <= 1:
            return 0.0
        kind = coll_kind(comm_type)
        if int(comm_type) == int(CollectiveType.BARRIER):
            nbytes = 1
        nbytes = max(int(nbytes), 0)
        key = (kind, nbytes, members)
        t = self._cache.get(key)
        if t is not None:
            return t
        c = self.system.splits
        chunk = nbytes // c if c > 1 else nbytes
        if chunk <= 0:  # fewer bytes than splits (ASTRA-sim itself loops forever): one chunk
            chunk, nchunks = nbytes, 1
        else:
            nchunks = -(-nbytes // chunk)
        phases = self._phases(kind, members) if self._whole_network(members) else None
        if phases is None:
            t = float(nchunks * self._logical_ring(kind, chunk, members))
        else:
            times = [self._dim_time(phase_kind, (chunk * num) // den, d, k) for d, k, phase_kind, num, den in phases]
            t = float(sum(times) + (nchunks - 1) * max(times)) if times else 0.0
        self._cache[key] = t
        return t

    def _whole_network(self, members: tuple[int, ...]) -> bool:
        """Whether ``members`` is every NPU of a network of several (non-trivial) dimensions: the only
        group ASTRA-sim runs hierarchically (others are one logical ring)."""
        if self.graph is not None or sum(1 for d in self.dims if d.npus > 1) < 2:
            return False
        return len(members) == self.npus and set(members) == set(range(self.npus))

    # ---- ASTRA-sim's system layer: per-message endpoint delay, local reduction -------------------
    def _system_ns(self, steps: int, reduced: int, msg: int) -> float:
        """System-layer time of one collective phase (measured against ASTRA-sim's analytical build):
        ``(steps + 1)`` endpoint delays, and per reducing step a local reduction of the received
        message, one write and two reads of ``msg`` bytes at ``local-mem-bw`` (whole ns each; 10 ns
        each without a memory bandwidth). Zero when no ASTRA-sim system file was given."""
        sysc = self.system
        if not sysc.from_file:
            return 0.0
        bw = sysc.local_mem_bw_gbps
        per = math.floor(msg / bw) if bw else 10.0  # GB/s = bytes per ns (10^9)
        return (steps + 1) * sysc.endpoint_delay_ns + reduced * 3.0 * per

    def _algo_time(self, kind: str, algo: str, size: int, n: int, ring_d: Any, direct_d: Any,
                   dist_d: Any) -> float:
        """One phase over ``n`` NPUs with ``algo``; ``ring_d(m)`` is a ring step's message time,
        ``direct_d(m)`` the slowest of one member's messages to all others, ``dist_d(k, m)`` a message
        to the member ``k`` places away (ns)."""
        part = size // n
        if algo == "direct":
            if kind == "all-reduce":  # reduce-scatter then all-gather of the part, one reduction
                return 2 * direct_d(part) + self._system_ns(2, 1, part)
            if kind == "reduce-scatter":
                return direct_d(part) + self._system_ns(1, 1, part)
            if kind == "all-gather":
                return direct_d(size) + self._system_ns(1, 0, 0)
            return direct_d(part) + self._system_ns(1, 0, 0)
        if algo == "halvingDoubling" and _pow2(n) and kind != "all-to-all":
            steps = int(math.log2(n))

            def rs(sz: int) -> float:
                return sum(dist_d(n >> s, sz >> s) for s in range(1, steps + 1))

            def ag(sz: int) -> float:
                return sum(dist_d(n >> s, sz << (s - 1)) for s in range(1, steps + 1))

            red = n // 2 - 1  # measured: ASTRA-sim reduces n/2 - 1 parts of size/n
            if kind == "all-reduce":
                return rs(size) + ag(part) + self._system_ns(2 * steps, red, part)
            if kind == "reduce-scatter":
                return rs(size) + self._system_ns(steps, red, part)
            return ag(size) + self._system_ns(steps, 0, 0)
        if algo == "doubleBinaryTree" and kind == "all-reduce":
            depth = math.ceil(math.log2(n))
            return 2 * depth * ring_d(size // 2) + self._system_ns(2 * depth, depth, size // 2)
        # ring (and fallbacks)
        if kind == "all-reduce":
            return 2 * (n - 1) * ring_d(part) + self._system_ns(2 * (n - 1), n - 1, part)
        if kind == "all-gather":
            return (n - 1) * ring_d(size) + self._system_ns(n - 1, 0, 0)
        if kind == "reduce-scatter":
            return (n - 1) * ring_d(part) + self._system_ns(n - 1, n - 1, part)
        # all-to-all on a ring: ASTRA-sim sends n(n-1)/2 ring messages of size/n one after another
        steps = n * (n - 1) // 2
        return steps * ring_d(part) + self._system_ns(steps, 0, 0)

    def _extent(self, members: tuple[int, ...]) -> list[tuple[int, int]] | None:
        """``[(dim, k)]`` for a group forming a full sub-grid of the dimensions; None otherwise."""
        if self.graph is not None or not self.dims:
            return None
        if max(members) >= self.npus:
            raise ValueError(f"rank {max(members)} is outside the network's {self.npus} NPUs")
        co = np.array([self.coords(m) for m in members])
        ext = []
        prod = 1
        for k in range(len(self.dims)):
            vals = np.unique(co[:, k])
            if len(vals) > 1:
                ext.append((k, len(vals)))
                prod *= len(vals)
        if prod != len(set(members)):
            return None
        # the members must be consecutive along each dimension for the per-dim algorithm's hops
        for k, kk in ext:
            vals = np.unique(co[:, k])
            if self.dims[k].topology == "Ring" and kk != self.dims[k].npus and (
                    vals[-1] - vals[0] + 1 != kk):
                return None
        return ext

    def _phases(self, kind: str, members: tuple[int, ...]) -> list[tuple[int, int, str, int, int]] | None:
        """Hierarchical phases ``(dim, k, kind, size numerator, size denominator)``."""
        ext = self._extent(members)
        if ext is None:
            return None
        out = []
        if kind == "reduce-scatter":
            den = 1
            for d, k in ext:
                out.append((d, k, "reduce-scatter", 1, den))
                den *= k
        elif kind == "all-gather":  # ASTRA-sim gathers the last dimension first
            num = 1
            for d, k in reversed(ext):
                out.append((d, k, "all-gather", num, 1))
                num *= k
        elif kind == "all-reduce":
            # ASTRA-sim's localBWAware: reduce-scatter up to the last dimension, all-reduce there,
            # all-gather back down
            den = 1
            for d, k in ext[:-1]:
                out.append((d, k, "reduce-scatter", 1, den))
                den *= k
            d, k = ext[-1]
            out.append((d, k, "all-reduce", 1, den))
            for d, k in reversed(ext[:-1]):
                den //= k
                out.append((d, k, "all-gather", 1, den * k))
        else:  # all-to-all
            for d, k in ext:
                out.append((d, k, "all-to-all", 1, 1))
        return out

    def _dim_time(self, kind: str, size: int, dim: int, n: int) -> float:
        """Closed-form time of one collective phase on dimension ``dim`` over ``n`` of its NPUs."""
        d = self.dims[dim]
        algo = self.system.algorithm(kind, dim)
        h1 = d.neighbour_hops()
        return self._algo_time(kind, algo, size, n, lambda m: d.delay(m, h1),
                               lambda m: max(d.delay(m, d.hops(0, k)) for k in range(1, n)),
                               lambda k, m: d.delay(m, d.hops(0, k)))

    def _logical_ring(self, kind: str, size: int, members: tuple[int, ...]) -> float:
        """A collective as one logical ring over ``members`` in group order (every group but the whole
        network of several dimensions), with the algorithm of dimension 0."""
        n = len(members)
        nxt = [(members[i], members[(i + 1) % n]) for i in range(n)]
        algo = self.system.algorithm(kind, 0)
        send = self.send_time
        return self._algo_time(
            kind, algo, size, n,
            lambda m: max(send(a, b, m) for a, b in nxt),
            lambda m: max(send(members[0], b, m) for b in members[1:]),
            lambda k, m: send(members[0], members[k % n], m))

    # ---- flow-level decomposition --------------------------------------------------------------
    def collective_steps(self, comm_type: int, nbytes: int, members: tuple[int, ...]) -> list[list[tuple[int, int, int]]]:
        """The collective as steps of concurrent messages ``(src, dst, bytes)`` (for flow-level replay).

        Ring algorithm over the members in group order (hierarchical groups: one ring per dimension
        phase, all rings of a phase concurrent), matching the closed forms' message sizes.
        """
        kind = coll_kind(comm_type)
        n = len(members)
        if n <= 1:
            return []
        nbytes = max(int(nbytes), 0)
        ext = self._extent(members)
        if ext is None or len(ext) <= 1:
            return _ring_steps(kind, nbytes, [list(members)])
        co = {m: self.coords(m) for m in members}
        steps: list[list[tuple[int, int, int]]] = []
        for d, _k, pkind, num, den in self._phases(kind, members):
            # rings along dimension d: members equal in every other coordinate
            rings: dict[tuple, list[int]] = {}
            for m in members:
                key = tuple(c for j, c in enumerate(co[m]) if j != d)
                rings.setdefault(key, []).append(m)
            for ring in rings.values():
                ring.sort(key=lambda m: co[m][d])
            steps += _ring_steps(pkind, (nbytes * num) // den, list(rings.values()))
        return steps

    def route(self, src: int, dst: int) -> list[tuple[Any, Any]]:
        """Directed links ``(a, b)`` a message from ``src`` to ``dst`` crosses."""
        if self.graph is not None:
            p = self.path(src, dst)
            return list(zip(p, p[1:]))
        cs, cd = self.coords(src), self.coords(dst)
        for k, d in enumerate(self.dims):
            if cs[k] == cd[k]:
                continue
            # the rest of the address is src's (ASTRA-sim moves along the first differing dim)
            base = src - cs[k] * _stride(self.dims, k)
            if d.topology == "Switch":
                return [(src, ("sw", k, base)), (("sw", k, base), dst)]
            if d.topology == "FullyConnected":
                return [(src, dst)]
            n = d.npus
            fwd = (cd[k] - cs[k]) % n
            step = 1 if fwd <= n - fwd else -1
            links, c = [], cs[k]
            stride = _stride(self.dims, k)
            while c != cd[k]:
                nxt = (c + step) % n
                links.append((base + c * stride, base + nxt * stride))
                c = nxt
            return links
        return []

    def link_bandwidth(self, link: tuple[Any, Any]) -> float:
        """Bytes per ns of a directed link."""
        if self.graph is not None:
            return self.graph.edges[link]["bandwidth"] * GB / 1e9
        a, b = link
        k = b[1] if isinstance(b, tuple) else (a[1] if isinstance(a, tuple) else self._link_dim(a, b))
        return self.dims[k].bytes_per_ns

    def link_latency(self, links: list[tuple[Any, Any]]) -> float:
        """Latency (ns) of a route: per-hop latency of its dimension (link graph: edge ``latency``)."""
        if self.graph is not None:
            return float(sum(self.graph.edges[lk].get("latency", 0.0) for lk in links))
        t = 0.0
        for a, b in links:
            k = b[1] if isinstance(b, tuple) else (a[1] if isinstance(a, tuple) else self._link_dim(a, b))
            t += self.dims[k].latency_ns
        return t

    def _link_dim(self, a: int, b: int) -> int:
        ca, cb = self.coords(a), self.coords(b)
        for k in range(len(self.dims)):
            if ca[k] != cb[k]:
                return k
        return 0


def _stride(dims: list[Dim], k: int) -> int:
    s = 1
    for d in dims[:k]:
        s *= d.npus
    return s


def _pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _ring_steps(kind: str, size: int, rings: list[list[int]]) -> list[list[tuple[int, int, int]]]:
    """Ring algorithm steps over several concurrent rings."""
    n = len(rings[0])
    if n <= 1:
        return []
    if kind == "all-gather":
        m, count = size, n - 1
    elif kind == "all-reduce":
        m, count = size // n, 2 * (n - 1)
    else:
        m, count = size // n, n - 1
    step = [(r[i], r[(i + 1) % n], m) for r in rings for i in range(n)]
    return [list(step) for _ in range(count)]


def load_network(source: str | Path | dict[str, Any] | None, system: SystemConfig | None = None,
                 congestion: bool = False) -> Network | None:
    """Read an ASTRA-sim network YAML (path or parsed dict) into a :class:`Network`; None stays None.

    A JSON file with ``nodes`` and ``links`` (``[{"src", "dst", "bandwidth", "latency"}]``, links
    bidirectional) gives an explicit link graph; a network fit (``ettools calibrate --network``,
    :mod:`.netfit`) gives a :class:`~.netfit.CommFit`, which answers the same questions.
    """
    if source is None:
        return None
    path: str | Path = "<network>"
    if isinstance(source, dict):
        raw = dict(source)
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise TraceError(path, "no such file") from None
        if text.lstrip().startswith("{"):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(path, f"not valid JSON: {e}") from None
        else:
            raw = parse_flat_yaml(text, path)
    if "links" in raw:
        return _link_graph_network(raw, path, system)
    if is_network_fit(raw):
        if congestion:
            raise TraceError(path, "a fitted network has no links to share: congestion needs a network YAML or link graph")
        return CommFit.from_dict(raw, path)
    for key in ("topology", "npus_count", "bandwidth", "latency"):
        if key not in raw:
            raise TraceError(path, f"network file lacks {key!r} (needs topology, npus_count, bandwidth, latency)")
        if not isinstance(raw[key], list):
            raw[key] = [raw[key]]
    lens = {len(raw[k]) for k in ("topology", "npus_count", "bandwidth", "latency")}
    if len(lens) != 1:
        raise TraceError(path, "topology, npus_count, bandwidth and latency must list one value per dimension")
    dims = []
    for k, (topo, n, bw, lat) in enumerate(zip(raw["topology"], raw["npus_count"], raw["bandwidth"], raw["latency"])):
        t = _TOPO_ALIASES.get(str(topo).lower())
        if t is None:
            raise TraceError(path, f"dimension {k}: unknown topology {topo!r} (known: {', '.join(TOPOLOGIES)})")
        try:
            n, bw, lat = int(n), float(bw), float(lat)
        except (TypeError, ValueError):
            raise TraceError(path, f"dimension {k}: npus_count, bandwidth and latency must be numbers") from None
        if n < 1 or bw <= 0 or lat < 0:
            raise TraceError(path, f"dimension {k}: needs npus_count >= 1, bandwidth > 0, latency >= 0")
        dims.append(Dim(t, n, bw, lat))
    return Network(dims, system, congestion=congestion, source=str(path))


def _link_graph_network(raw: dict[str, Any], path: str | Path, system: SystemConfig | None) -> Network:
    import networkx as nx

    g = nx.DiGraph()
    for i, lk in enumerate(raw["links"]):
        try:
            a, b, bw = lk["src"], lk["dst"], float(lk["bandwidth"])
        except (KeyError, TypeError, ValueError):
            raise TraceError(path, f"links[{i}] needs src, dst and a numeric bandwidth") from None
        lat = float(lk.get("latency", 0.0))
        for u, v in ((a, b), (b, a)):
            g.add_edge(u, v, bandwidth=bw, latency=lat)
    return Network([], system, graph=g, congestion=True, source=str(path))


def default_network(world: int, hardware: Hardware) -> Network:
    """The network a hardware preset implies: a Switch of ``gpus_per_node`` (scale-up) and a
    Switch across nodes (scale-out), bandwidths from the preset. A preset with measured NCCL
    tables (A100, H100: :func:`.netfit.shipped_network_fit`), or with the same network and GPU
    generation as one that has them, and its network unchanged gets the fit of those tables
    instead, the link model answering the group shapes it has no data for."""
    links = _link_network(world, hardware)
    key = hardware.preset
    table = presets()
    base = table.get(key, {})
    if base and base.get("network") == hardware.network and not hardware.preset_label:
        # collective time is a property of the fabric: a preset without tables of its own borrows
        # those of a preset with the same network and GPU generation (A100 40 GB and 80 GB sit on the
        # same NVLink3/NVSwitch DGX, H200 on the H100's NVLink4 HGX board)
        kin = [k for k in sorted(table) if k != key and table[k].get("network") == base.get("network")
               and table[k].get("match", {}).get("compute") == base.get("match", {}).get("compute")]
        for k in [key, *kin]:
            fit = shipped_network_fit(k)
            if fit is not None and fit.gpus_per_node == int(hardware.network.get("gpus_per_node", 8)):
                fit.fallback = links
                fit.npus = links.npus
                return fit  # type: ignore[return-value]
    return links


def _link_network(world: int, hardware: Hardware) -> Network:
    """:func:`default_network`'s link model (two Switch dimensions from the preset)."""
    net = hardware.network
    per_node = int(net.get("gpus_per_node", 8))
    up = Dim("Switch", max(1, min(per_node, world)), float(net.get("scale_up_gbps", 450.0)),
             float(net.get("scale_up_latency_ns", 500.0)))
    dims = [up]
    if world > up.npus:
        dims.append(Dim("Switch", math.ceil(world / up.npus), float(net.get("scale_out_gbps", 50.0)),
                        float(net.get("scale_out_latency_ns", 2000.0))))
    return Network(dims, source=f"default for {hardware.name or 'the hardware'}")

