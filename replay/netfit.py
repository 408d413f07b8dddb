"""A network model fitted on the collectives of a measured multi-rank trace
(``ettools calibrate --network TRACE -o NET.json``; ``ettools replay --network NET.json``).

ASTRA-sim's network files describe links; a machine whose communication cost is not a link
property — gloo over loopback on a shared CPU, where a collective's time is mostly thread
hand-offs and waits for a core — is better described by what its collectives were seen to cost.
This module fits that cost and answers the replay's two questions (``collective_time`` and
``send_time``, in ns, like :class:`~.network.Network`).

Samples
-------
Every collective instance of the trace (the k-th collective of a group on each member, in issue
order, as the replay matches them) whose members all carry a measured duration gives one sample:
its *transfer time* is the shortest member span (as :func:`.program.measured_transfer`: the last
member to arrive waited least). Every send/recv pair (the i-th send and the i-th recv of a
channel) gives one sample: the shorter of the two spans.

Model, per kind (``ALL_REDUCE``, ``ALL_GATHER``, ``REDUCE_SCATTER``, ``ALL_TO_ALL``, ``SEND_RECV``,
other collective types timed as the family :func:`.netconfig.coll_kind` names)
-----------------------------------------------------------------------------------------------------
``t = α·steps + β·volume`` (µs), the ring algorithm's shape on a group of ``n`` with per-rank
buffer ``S`` (Chakra ``comm_size``): ALL_REDUCE ``2(n−1)`` steps, ``2(n−1)/n·S`` bytes;
ALL_GATHER ``n−1``, ``(n−1)·S``; REDUCE_SCATTER and ALL_TO_ALL ``n−1``, ``(n−1)/n·S``; a
send/recv ``1``, ``S``. ``α, β ≥ 0`` by non-negative least squares on the absolute error, so the
fit predicts the *mean* cost, waits included: a step time is a sum of such costs, and on a
contended host the mean is what it sees. A kind with fewer than :data:`MIN_SAMPLES` samples, or
whose samples all move the same volume, keeps the β of the fit over every kind and fits its own α
(the mean residual per step; where that would be negative, α = 0 and β = its mean time per byte,
so the kind's mean is met at the size it was seen at); a kind without samples uses the fit over every kind. The shape makes
the fit usable for group sizes the trace did not have, as far as the ring shape holds.

Measured tables (``vidur_profiling/network``: NCCL all-reduce and send/recv times per size on
``n`` GPUs over ``nodes`` machines) add two things (:func:`fit_nccl_tables`): a *curve* per
measured group shape ``(kind, n, nodes)`` — log time piecewise linear in log size over knots a
factor of 2 apart, fitted by least squares (NCCL's protocol switches make time vs size far from
one α + β·S line) and made non-decreasing in size (:func:`fit_curve`) — and ring-shape α, β for groups that span nodes (``by_kind_inter``), fitted
on relative error. A group with a curve of its shape takes the curve (beyond its largest size:
the last knot's time plus the bytes at the last segment's bandwidth); else the ring fit of its
tier; a tier without a fit asks ``fallback`` (the hardware's link model) when one is set.

File (deterministic JSON)::

    {"format": "ettools-network-fit", "version": 1, "source": "...", "samples": 31,
     "global": {"alpha_us": .., "beta_us_per_byte": .., "n": ..},
     "by_kind": {"ALL_GATHER": {"alpha_us": .., "beta_us_per_byte": .., "n": .., "mean_us": ..}, ...}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ettools.collate import group_members, group_sequences
from ettools.errors import TraceError
from ettools.graph import CollectiveType, NodeType, Trace
from ettools.io import atomic_write

from .commorder import issue_order
from .netconfig import coll_kind

FORMAT = "ettools-network-fit"
MIN_SAMPLES = 3
SEND_RECV = "SEND_RECV"
_FAMILY = {"all-reduce": "ALL_REDUCE", "all-gather": "ALL_GATHER", "reduce-scatter": "REDUCE_SCATTER",
           "all-to-all": "ALL_TO_ALL"}


def kind_of(comm_type: int) -> str:
    """The fitted kind a Chakra collective type is timed as."""
    return _FAMILY[coll_kind(comm_type)]


def ring_shape(kind: str, n: int, nbytes: float) -> tuple[float, float]:
    """``(steps, bytes moved per rank)`` of the ring algorithm for ``kind`` on ``n`` members."""
    if kind == SEND_RECV:
        return 1.0, float(nbytes)
    if n <= 1:
        return 0.0, 0.0
    if kind == "ALL_REDUCE":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes
    if kind == "ALL_GATHER":
        return float(n - 1), float(n - 1) * nbytes
    return float(n - 1), (n - 1) / n * nbytes  # REDUCE_SCATTER, ALL_TO_ALL


@dataclass
class CommSamples:
    """One row per collective instance or send/recv pair: kind, steps, volume, transfer time (µs)."""

    kinds: list[str] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    volume: list[float] = field(default_factory=list)
    time_us: list[float] = field(default_factory=list)

    def add(self, kind: str, n: int, nbytes: float, t: float) -> None:
        """Record one sample."""
        s, v = ring_shape(kind, n, nbytes)
        if s <= 0 or not np.isfinite(t) or t < 0:
            return
        self.kinds.append(kind)
        self.steps.append(s)
        self.volume.append(v)
        self.time_us.append(float(t))

    def __len__(self) -> int:
        return len(self.time_us)


def comm_samples(trace: Trace) -> CommSamples:
    """Transfer-time samples of every fully measured collective instance and send/recv pair."""
    out = CommSamples()
    seqs = group_sequences(trace, issue_order)
    p2p: dict[tuple[int, int, int, int], list[float]] = {}  # (src, dst, tag, is_recv) -> durations
    for r in trace.ranks:
        g = trace.graphs[r]
        prow = np.flatnonzero((g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE))
        if len(prow):
            prow = prow[np.argsort(issue_order(g, prow), kind="stable")]
            for row in prow.tolist():
                recv = int(g.type[row] == NodeType.COMM_RECV_NODE)
                peer = int(g.comm_peer[row])
                src, dst = (peer, r) if recv else (r, peer)
                p2p.setdefault((src, dst, int(g.comm_tag[row]), recv), []).append(
                    (float(g.dur[row]), int(g.comm_bytes[row])))
    for name in sorted(seqs):
        members = group_members(trace, name)
        by_rank = seqs[name]
        if members is None or any(m not in by_rank for m in members):
            continue
        g0 = trace.graphs[members[0]]
        k = min(len(by_rank[m]) for m in members)
        # members × instances: the transfer of an instance is its shortest member span
        durs = np.stack([trace.graphs[m].dur[by_rank[m][:k]] for m in members])
        rows0 = by_rank[members[0]][:k]
        ct, nb = g0.comm_type[rows0].astype(np.int64), g0.comm_bytes[rows0].astype(np.int64)
        ok = (np.isfinite(durs) & (durs >= 0)).all(axis=0) & (ct >= 0) & (nb >= 0)
        transfer = durs.min(axis=0) if k else np.zeros(0)
        for j in np.flatnonzero(ok).tolist():
            out.add(kind_of(int(ct[j])), len(members), int(nb[j]), float(transfer[j]))
    for (src, dst, tag, recv), sends in sorted(p2p.items()):
        if recv:
            continue
        recvs = p2p.get((src, dst, tag, 1), [])
        for (ds, nb), (dr, _) in zip(sends, recvs):
            if np.isfinite(ds) and np.isfinite(dr) and nb >= 0:
                out.add(SEND_RECV, 2, nb, min(ds, dr))
    return out


def _nnls(steps: np.ndarray, vol: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """``(α, β) ≥ 0`` minimizing ``Σ (α·steps + β·vol − t)²``."""
    from scipy.optimize import nnls

    X = np.column_stack([steps, vol])
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(X / scale, t)
    coef = coef / scale
    return float(coef[0]), float(coef[1])


@dataclass
class CommFit:
    """Fitted collective and send/recv costs (see the module docstring); a replay network."""

    alpha_us: float
    beta_us_per_byte: float
    samples: int
    by_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = ""
    # groups spanning machines (measured tables), and per measured group shape a size curve
    by_kind_inter: dict[str, dict[str, float]] = field(default_factory=dict)
    curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # "KIND n nodes" -> knots
    gpus_per_node: int = 0
    fallback: Any = None  # a Network answering what the fit has no data for (not saved)
    _send_memo: dict[tuple[int, int], float] = field(default_factory=dict, repr=False, compare=False)
    fitted_on: str = ""  # what a fit read from a file was fitted on (its recorded source)
    # the replay's Network interface
    npus: int = 0
    congestion: bool = False

    @classmethod
    def from_samples(cls, s: CommSamples, source: str = "") -> CommFit:
        """Fit on ``s`` (raises ValueError without samples)."""
        if not len(s):
            raise ValueError("no measured collective or send/recv whose every side has a duration "
                             "(a network fit needs a multi-rank capture)")
        kinds = np.asarray(s.kinds)
        steps, vol, t = (np.asarray(x, np.float64) for x in (s.steps, s.volume, s.time_us))
        a, b = _nnls(steps, vol, t)
        if len(np.unique(vol)) < 2:  # no size signal anywhere: latency only
            a, b = float(np.sum(t) / np.sum(steps)), 0.0
        fit = cls(a, b, len(s), source=source)
        for k in sorted(set(s.kinds)):
            m = kinds == k
            ks, kv, kt = steps[m], vol[m], t[m]
            if m.sum() >= MIN_SAMPLES and len(np.unique(kv)) >= 2:
                ka, kb = _nnls(ks, kv, kt)
            else:
                kb = b
                ka = float(np.sum(kt - kb * kv) / np.sum(ks))
                if ka < 0:  # the shared β overshoots this kind: bandwidth alone, matching its mean
                    ka, kb = 0.0, float(np.sum(kt) / np.sum(kv))
            fit.by_kind[k] = {"alpha_us": ka, "beta_us_per_byte": kb, "n": int(m.sum()),
                              "mean_us": float(kt.mean())}
        return fit

    def predict_us(self, kind: str, n: int, nbytes: float, nodes: int = 1) -> float:
        """Mean cost (µs) of one ``kind`` on ``n`` members over ``nodes`` machines with per-rank
        buffer ``nbytes`` (NaN where the fit has no data for the group's tier)."""
        c = self.curves.get(f"{kind} {n} {nodes}")
        if c is not None and nbytes > 0:
            return _curve_us(c, float(nbytes))
        if self.gpus_per_node:  # fitted on measured tables: the tier of the group
            tier = self.by_kind_inter if nodes > 1 else self.by_kind
            # a collective kind the tables lack runs the all-reduce's ring on the same links
            p = tier.get(kind) or (tier.get("ALL_REDUCE") if kind != SEND_RECV else None)
            if p is None:
                return float("nan")
            s, v = ring_shape(kind, n, max(float(nbytes), 0.0))
            return p["alpha_us"] * s + p["beta_us_per_byte"] * v
        p = self.by_kind.get(kind)
        a, b = (p["alpha_us"], p["beta_us_per_byte"]) if p else (self.alpha_us, self.beta_us_per_byte)
        s, v = ring_shape(kind, n, max(float(nbytes), 0.0))
        return a * s + b * v

    # ---- Network interface (ns) ----------------------------------------------------------------
    def _nodes(self, ranks: tuple[int, ...]) -> int:
        return _machines(tuple(ranks), self.gpus_per_node) if self.gpus_per_node else 1

    def collective_time(self, comm_type: int, nbytes: int, members: tuple[int, ...]) -> float:
        """ns for one collective of ``members``."""
        if int(comm_type) == int(CollectiveType.BARRIER):
            nbytes = 1
        t = self.predict_us(kind_of(comm_type), len(members), nbytes, self._nodes(members))
        if not np.isfinite(t) and self.fallback is not None:
            return float(self.fallback.collective_time(comm_type, nbytes, members))
        return 1000.0 * t

    def send_time(self, src: int, dst: int, nbytes: int) -> float:
        """ns for one message."""
        if src == dst:
            return 0.0
        nodes = self._nodes((src, dst))
        hit = self._send_memo.get((nodes, nbytes))
        if hit is not None:  # a message's cost depends on its bytes and whether it leaves the machine
            return hit
        t = self.predict_us(SEND_RECV, 2, nbytes, nodes)
        if not np.isfinite(t) and self.fallback is not None:
            return float(self.fallback.send_time(src, dst, nbytes))  # the links may tell the pairs apart
        self._send_memo[(nodes, nbytes)] = 1000.0 * t
        return 1000.0 * t

    def check_ranks(self, world: int) -> None:
        """A fitted network serves any number of ranks."""

    # ---- file ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the fit file."""
        d = {"format": FORMAT, "version": 1, "source": self.source, "samples": self.samples,
             "global": {"alpha_us": self.alpha_us, "beta_us_per_byte": self.beta_us_per_byte,
                        "n": self.samples},
             "by_kind": {k: self.by_kind[k] for k in sorted(self.by_kind)}}
        if self.gpus_per_node:
            d["gpus_per_node"] = self.gpus_per_node
        if self.by_kind_inter:
            d["by_kind_inter"] = {k: self.by_kind_inter[k] for k in sorted(self.by_kind_inter)}
        if self.curves:
            d["curves"] = {k: self.curves[k] for k in sorted(self.curves)}
        return d

    def save(self, path: str | Path) -> Path:
        """Write the fit (atomically)."""
        text = json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"
        with atomic_write(path, "w") as f:
            f.write(text)
        return Path(path)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: str | Path = "<network fit>") -> CommFit:
        """Read a fit object (raises :class:`TraceError` naming ``path`` on a malformed one)."""
        try:
            glob = raw["global"]
            fit = cls(float(glob["alpha_us"]), float(glob["beta_us_per_byte"]), int(raw.get("samples", 0)),
                      source=str(path), fitted_on=str(raw.get("source") or ""))
            for k, p in dict(raw.get("by_kind", {})).items():
                fit.by_kind[str(k)] = {"alpha_us": float(p["alpha_us"]),
                                       "beta_us_per_byte": float(p["beta_us_per_byte"]),
                                       "n": int(p.get("n", 0)), "mean_us": float(p.get("mean_us", 0.0))}
            fit.gpus_per_node = int(raw.get("gpus_per_node", 0))
            for k, p in dict(raw.get("by_kind_inter", {})).items():
                fit.by_kind_inter[str(k)] = {"alpha_us": float(p["alpha_us"]),
                                             "beta_us_per_byte": float(p["beta_us_per_byte"]), "n": int(p.get("n", 0))}
            for k, c in dict(raw.get("curves", {})).items():
                kind, n, nodes = str(k).split()
                xs, ys = [float(x) for x in c["log2_bytes"]], [float(y) for y in c["log2_us"]]
                if len(xs) != len(ys) or len(xs) < 2 or int(n) < 1 or int(nodes) < 1:
                    raise ValueError(f"curve {k!r}: knots and times differ in length or are fewer than 2")
                fit.curves[f"{kind} {int(n)} {int(nodes)}"] = {"log2_bytes": xs, "log2_us": ys}
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(path, f"malformed network fit: {type(e).__name__}: {e}") from None
        known = {*_FAMILY.values(), SEND_RECV}
        bad = sorted((set(fit.by_kind) | set(fit.by_kind_inter) | {k.split()[0] for k in fit.curves}) - known)
        if bad:
            raise TraceError(path, f"network fit names unknown kinds {bad} (known: {', '.join(sorted(known))})")
        return fit


def fit_network(trace: Trace, source: str | None = None) -> CommFit:
    """Fit a :class:`CommFit` on the measured communication of ``trace`` (``source``: what to
    record as its origin, default the trace's own)."""
    return CommFit.from_samples(comm_samples(trace), source if source is not None else trace.meta.source)


def is_network_fit(raw: dict[str, Any]) -> bool:
    """True for the object of a network fit file."""
    return raw.get("format") == FORMAT


# ---- measured NCCL tables --------------------------------------------------------------------------

_KNOT_STEP = 1.0  # knots a factor of 2 apart in size


@lru_cache(maxsize=1 << 16)
def _machines(ranks: tuple[int, ...], per_node: int) -> int:
    """Machines a group of ``ranks`` spans at ``per_node`` GPUs each (cached: a replay asks it once
    per collective, and the groups of a plan are few)."""
    return int(np.unique(np.asarray(ranks, np.int64) // per_node).size)


def _curve_us(c: dict[str, list[float]], nbytes: float) -> float:
    """Time (µs) of a fitted size curve at ``nbytes`` (see the module doc)."""
    xs, ys = c["log2_bytes"], c["log2_us"]
    x = float(np.log2(max(nbytes, 1.0)))
    if x <= xs[-1]:
        return float(2.0 ** np.interp(x, xs, ys))
    t_last = 2.0 ** ys[-1]
    bw = (2.0 ** xs[-1] - 2.0 ** xs[-2]) / max(t_last - 2.0 ** ys[-2], 1e-9)  # bytes per µs
    return float(t_last + (nbytes - 2.0 ** xs[-1]) / bw)


def fit_curve(nbytes: np.ndarray, t_us: np.ndarray) -> dict[str, list[float]]:
    """Least-squares log-log piecewise-linear curve (knots a factor of 2 apart over the sizes
    seen), made non-decreasing in size: a collective over the same GPUs never takes less time for
    more bytes (the smaller message could run the larger one's algorithm and protocol), so a dip is
    measurement noise — Vidur's tables hold three bimodal samples per size (e.g. H100, 2 GPUs: 7 µs
    at 16 KB and at 128 KB, 40 µs between) — and the knots are replaced by their weighted isotonic
    regression (``scipy.optimize.isotonic_regression``, each knot weighted by the samples that
    shape it)."""
    from scipy.optimize import isotonic_regression

    x, y = np.log2(np.maximum(nbytes, 1.0)), np.log2(np.maximum(t_us, 1e-3))
    knots = np.arange(np.floor(x.min()), np.ceil(x.max()) + _KNOT_STEP / 2, _KNOT_STEP)
    if len(knots) < 2:
        knots = np.array([x.min(), x.min() + 1.0])
    # hat-function basis: the value at each knot, linear between
    A = np.stack([np.interp(x, knots, np.eye(len(knots))[j]) for j in range(len(knots))], axis=1)
    used = A.sum(axis=0) > 0
    coef = np.full(len(knots), np.nan)
    coef[used] = np.linalg.lstsq(A[:, used], y, rcond=None)[0]
    ok = np.isfinite(coef)
    mono = isotonic_regression(coef[ok], weights=A[:, ok].sum(axis=0), increasing=True).x
    return {"log2_bytes": knots[ok].round(6).tolist(), "log2_us": np.asarray(mono).round(6).tolist()}


@dataclass
class NcclTable:
    """Rows of measured NCCL tables: kind, group size, machines it spans, bytes, median µs."""

    kind: np.ndarray
    n: np.ndarray
    nodes: np.ndarray
    nbytes: np.ndarray
    t_us: np.ndarray
    gpus_per_node: int


STATISTICS = ("median", "min", "mean")


def read_nccl_tables(folder: str | Path, statistic: str = "median") -> NcclTable:
    """Read Vidur's ``all_reduce.csv``/``send_recv.csv`` of ``folder`` (size in bytes, times in ms;
    ``num_workers`` GPUs over ``num_workers / devices_per_node`` machines), and ``all_gather.csv``,
    ``reduce_scatter.csv``, ``all_to_all.csv`` in the same layout where present (as
    :mod:`ettools.collbench` writes them; size with Chakra's ``comm_size`` meaning).

    ``statistic``: which of a row's repetitions stands for its size (``time_stats.<op>.<statistic>``).
    ``median`` (default) keeps what the operation itself varies by (gloo on a contended CPU).
    ``min`` is a GPU collective's own time: a harness timing repeated NCCL calls also catches the
    ranks' launch skew (Vidur's DGX H100 2-GPU rows: a second mode ~30 µs above the first at every
    size from 2 KB to 1 MB, which moving bytes cannot explain), and the replay adds skew itself —
    each rank arrives when its own work is done."""
    import csv

    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, not {statistic!r}")
    folder = Path(folder)
    cols: dict[str, list] = {"kind": [], "n": [], "nodes": [], "nbytes": [], "t_us": []}
    per_node = 0
    for fname, kind in (("all_reduce.csv", "ALL_REDUCE"), ("all_gather.csv", "ALL_GATHER"),
                        ("reduce_scatter.csv", "REDUCE_SCATTER"), ("all_to_all.csv", "ALL_TO_ALL"),
                        ("send_recv.csv", SEND_RECV)):
        f = folder / fname
        if not f.is_file():
            continue
        op = fname[:-4]
        try:
            for r in csv.DictReader(f.open()):
                n, d = int(r["num_workers"]), int(r["devices_per_node"])
                t = float(r[f"time_stats.{op}.{statistic}"])
                if n < 1 or d < 1 or not np.isfinite(t) or t <= 0:
                    continue
                per_node = max(per_node, int(r.get("max_devices_per_node") or d))
                cols["kind"].append(kind)
                cols["n"].append(n)
                cols["nodes"].append(max(1, -(-n // d)))
                cols["nbytes"].append(float(r["size"]))
                cols["t_us"].append(t * 1e3)
        except (KeyError, ValueError) as e:
            raise TraceError(f, f"not a Vidur NCCL table: {type(e).__name__}: {e}") from None
    if not cols["kind"]:
        raise TraceError(folder, "no all_reduce.csv/all_gather.csv/reduce_scatter.csv/all_to_all.csv/send_recv.csv rows")
    return NcclTable(np.asarray(cols["kind"]), np.asarray(cols["n"], np.int64), np.asarray(cols["nodes"], np.int64),
                     np.asarray(cols["nbytes"], np.float64), np.asarray(cols["t_us"], np.float64), per_node)


def _nnls_rel(steps: np.ndarray, vol: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """``(α, β) ≥ 0`` minimizing the squared *relative* error (sizes over five decades weigh alike)."""
    w = 1.0 / np.maximum(t, 1e-9)
    return _nnls(steps * w, vol * w, np.ones_like(t))


def fit_nccl_tables(tab: NcclTable, source: str = "", keep: np.ndarray | None = None) -> CommFit:
    """A :class:`CommFit` from measured NCCL tables (rows ``keep`` only, default all): a size curve
    per measured group shape, ring α, β per kind for one machine (``by_kind``) and across machines
    (``by_kind_inter``)."""
    m = np.ones(len(tab.t_us), bool) if keep is None else np.asarray(keep, bool)
    kind, n, nodes, nb, t = tab.kind[m], tab.n[m], tab.nodes[m], tab.nbytes[m], tab.t_us[m]
    shape = [ring_shape(k, int(x), float(b)) for k, x, b in zip(kind.tolist(), n.tolist(), nb.tolist())]
    steps = np.array([s for s, _ in shape])
    vol = np.array([v for _, v in shape])
    a, b = _nnls_rel(steps, vol, t)
    fit = CommFit(a, b, int(m.sum()), source=source, gpus_per_node=int(tab.gpus_per_node))
    for k in sorted(set(kind.tolist())):
        for inter in (False, True):
            sel = (kind == k) & ((nodes > 1) == inter)
            if sel.sum() < MIN_SAMPLES:
                continue
            ka, kb = _nnls_rel(steps[sel], vol[sel], t[sel])
            d = {"alpha_us": ka, "beta_us_per_byte": kb, "n": int(sel.sum())}
            if inter:
                fit.by_kind_inter[k] = d
            else:
                fit.by_kind[k] = dict(d, mean_us=float(t[sel].mean()))
    for key in sorted(set(zip(kind.tolist(), n.tolist(), nodes.tolist()))):
        sel = (kind == key[0]) & (n == key[1]) & (nodes == key[2])
        if sel.sum() >= MIN_SAMPLES and len(np.unique(nb[sel])) >= 2:
            fit.curves[f"{key[0]} {key[1]} {key[2]}"] = fit_curve(nb[sel], t[sel])
    return fit


_NET_DIR = Path(__file__).with_name("data") / "network"


def shipped_network_fit(preset: str) -> CommFit | None:
    """The shipped fit of measured NCCL tables for a hardware preset (``data/network/<preset>.json``)."""
    f = _NET_DIR / f"{preset}.json"
    if not preset or not f.is_file():
        return None
    return CommFit.from_dict(json.loads(f.read_text()), f)
