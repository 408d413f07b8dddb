"""What a replay reports: step time per rank, the time breakdown, the critical path, MFU, memory,
a Chrome timeline, JSON, a short summary and a plot.

Breakdown of a rank's replayed span (all in µs; intervals are unions, so concurrent streams count once):

* ``compute_us`` — time some compute node of the rank runs on a device lane (ranks without device
  ops: on a host lane, host idle gaps excluded);
* ``comm_us`` — time a transfer of the rank is in flight (a collective from the moment its last member
  arrived to its end; a node replayed locally over its whole duration);
* ``overlap_us`` — compute and communication at once; ``exposed_comm_us = comm_us − overlap_us``;
* ``idle_us`` — the rest of the span (host work with an idle device, waiting for peers, bubbles).

``step_time_us``: the mean replayed ``ProfilerStep`` time when the trace has steps (each step from
its first host slice's start to its last one's end, as the profiler measures it), else the rank's
replayed span. The job's step time is the slowest rank's.

Critical path: from the node that ends last, each node's *cause* (the dependency that finished last,
the previous node of its lane, or the last member to reach its collective) back to a source. Each
node on it is credited ``end − end of the next older node``, so the credits add up to the makespan;
``by_class`` sums them per op class (:mod:`ettools.classify`) and communication.

MFU: FLOPs / (span × peak FLOP/s of the hardware description), where the FLOPs are the model
FLOPs of a synthesized rank (graph meta ``model_flops``: 3 × the forward matmul and attention
FLOPs, causal attention at the exact half — the 6·N·tokens + attention convention, no recompute,
no kernel tiles) and otherwise those of the rank's device compute nodes (``num_ops``, or derived
from shapes: hardware FLOPs). ``mfu_flops`` says which (``model`` or ``nodes``). Where the MFU
counts model FLOPs, ``hfu`` is the hardware FLOPs utilization too: the node FLOPs (recompute included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.classify import CLASSES, classify_names
from ettools.graph import COMM_NODE_TYPES, Trace
from ettools.intervals import merge_intervals
from ettools.io import atomic_write

from . import compute as cm
from .engine import COMPUTE, Schedule
from .program import Built

_GAP_NAMES = ("host_gap", "comm_dispatch")


def _union(s: np.ndarray, e: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Total length of the union of intervals and the merged intervals (empty or non-finite
    intervals left out)."""
    ok = np.isfinite(s) & np.isfinite(e) & (e > s)
    starts, ends = merge_intervals(s[ok], e[ok])
    return float((ends - starts).sum()), starts, ends


def _intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two sets of disjoint sorted intervals."""
    (s1, e1), (s2, e2) = a, b
    if not len(s1) or not len(s2):
        return 0.0
    pts = np.unique(np.concatenate((s1, e1, s2, e2)))
    mid = (pts[:-1] + pts[1:]) / 2
    in1 = np.searchsorted(s1, mid, side="right") - 1
    in1 = (in1 >= 0) & (mid < e1[np.maximum(in1, 0)])
    in2 = np.searchsorted(s2, mid, side="right") - 1
    in2 = (in2 >= 0) & (mid < e2[np.maximum(in2, 0)])
    return float((np.diff(pts) * (in1 & in2)).sum())


def _breakdown(st: np.ndarray, en: np.ndarray, cstart: np.ndarray, comp_mask: np.ndarray, comm: np.ndarray,
               lo: float = -np.inf, hi: float = np.inf) -> tuple[float, float, float, float]:
    """``(compute, comm, overlap, busy)`` µs of a rank within ``[lo, hi]`` (intervals clipped)."""
    def clip(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.clip(s, lo, hi), np.clip(e, lo, hi)

    a, b = clip(st[comp_mask], en[comp_mask])
    c, d = clip(cstart[comm], en[comm])
    c_len, cs, ce = _union(a, b)
    m_len, ms, me = _union(c, d)
    ov = _intersection((cs, ce), (ms, me))
    _, us, ue = _union(np.concatenate((a, c)), np.concatenate((b, d)))
    return c_len, m_len, ov, float((ue - us).sum())


SHARE_SOURCES = ("measured", "calibrated", "fitted", "transferred", "roofline", "network", "none")


def _replayed_steps(p: Any, st: np.ndarray, en: np.ndarray, measured: list[float]) -> list[float]:
    """Replayed time of each step of a rank: its measured ``ProfilerStep`` time scaled by how much
    the replay stretched the interval between its boundaries (replayed / measured) — a step's
    boundary being the later of its host end and the end of the device work it launched, so a
    GPU-bound step ends when its kernels do, not when the host, running ahead, closes its
    annotation. A self-replay gives the measured steps; halving every kernel of a GPU-bound step
    halves it."""
    out = []
    prev_m = prev_r = None
    for k, rows in enumerate(p.step_rows):
        if k >= len(p.step_bounds) or k >= len(p.step_device_rows):
            out.append(float(en[rows].max() - st[rows].min()))
            continue
        d = p.step_device_rows[k]
        host_end = float(en[rows].max())
        b_r = max(host_end, float(en[d].max())) if len(d) else host_end
        s_m, b_m = p.step_bounds[k]
        span_m = b_m - (s_m if prev_m is None else prev_m)
        span_r = b_r - (float(st[rows].min()) if prev_r is None else prev_r)
        out.append(measured[k] * span_r / span_m if span_m > 0 else float(en[rows].max() - st[rows].min()))
        prev_m, prev_r = b_m, b_r
    return out


def _device_bound_steps(p: Any, st: np.ndarray | None = None, en: np.ndarray | None = None) -> list[float]:
    """Each step's interval between device-activity boundaries (from the later of the step's host
    start and the previous step's boundary to its own; a boundary being the later of the host end
    and the end of the device work the step launched): measured, or replayed when the replayed
    ``st``/``en`` of the rank's nodes are given. Where the host runs ahead of the device
    (asynchronous launches, the sync in the next step) this is the period of a GPU-bound loop,
    which the ``ProfilerStep`` annotation understates."""
    out, prev = [], -np.inf
    for k, (s, b) in enumerate(p.step_bounds):
        if st is not None and en is not None and k < len(p.step_rows):
            rows, d = p.step_rows[k], p.step_device_rows[k]
            s = float(st[rows].min())
            b = max(float(en[rows].max()), float(en[d].max()) if len(d) else -np.inf)
        out.append(b - max(s, prev))
        prev = b
    return out


@dataclass
class RankReport:
    """Replayed figures of one rank."""

    rank: int
    simulated_as: int
    step_time_us: float
    span_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    exposed_comm_us: float
    idle_us: float
    steps_us: list[float] = field(default_factory=list)
    measured_step_time_us: float | None = None
    measured_steps_us: list[float] = field(default_factory=list)
    measured_span_us: float | None = None
    peak_memory_bytes: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    mfu: float | None = None
    flops: float | None = None
    mfu_flops: str = "nodes"  # the FLOPs the MFU counts: "model" (synth meta) or "nodes"
    hfu: float | None = None  # hardware FLOPs utilization (node FLOPs), where the MFU counts model FLOPs
    mfu_peak: str = ""  # the peak the MFU/HFU are quoted against ("bf16 dense 989.4 TFLOP/s")
    mfu_fp8_peak: float | None = None  # the MFU against the FP8 peak, where the trace runs FP8 GEMMs
    duration_sources: dict[str, int] = field(default_factory=dict)
    form: str = ""
    time_by_source_us: dict[str, float] = field(default_factory=dict)
    device_bound_steps_us: list[float] = field(default_factory=list)  # replayed (_device_bound_steps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = {
            "step_time_us": self.step_time_us, "compute_us": self.compute_us, "comm_us": self.comm_us,
            "exposed_comm_us": self.exposed_comm_us, "overlap_us": self.overlap_us, "idle_us": self.idle_us,
            "span_us": self.span_us, "peak_memory_bytes": int(self.peak_memory_bytes),
            "mfu": self.mfu, "mfu_flops": self.mfu_flops, "hfu": self.hfu, "mfu_peak": self.mfu_peak,
            "simulated_as": self.simulated_as, "form": self.form,
            "duration_sources": self.duration_sources, "time_by_source_us": self.time_by_source_us,
        }
        if self.steps_us:
            d["steps_us"] = self.steps_us
        if self.device_bound_steps_us:
            d["device_bound_steps_us"] = self.device_bound_steps_us
        if self.measured_step_time_us is not None:
            d["measured_step_time_us"] = self.measured_step_time_us
            d["measured_steps_us"] = self.measured_steps_us
        if self.measured_span_us is not None:
            d["measured_span_us"] = self.measured_span_us
        if self.memory:
            d["memory"] = self.memory
        if self.mfu_fp8_peak is not None:
            d["mfu_fp8_peak"] = self.mfu_fp8_peak
        return d


def mfu_peak(hw: dict[str, Any], dtype: str | None = None) -> tuple[str, float]:
    """``(dtype, FLOP/s)`` the MFU is quoted against: the dense BF16 (FP16 where that is faster) peak
    for 8- and 16-bit training, by convention (FP8 training included: its FP8 MFU is given beside); the
    dtype's own peak for 32- and 64-bit math."""
    d = str(dtype or hw.get("dtype") or "bf16").lower()
    tab = hw.get("peak_tflops", {})
    d = {"float32": "fp32", "float64": "fp64"}.get(d, d)
    if d in ("fp32", "tf32", "fp64") and tab.get(d):
        return d, cm.peak_flops(hw, d)
    # the 16-bit group's peak as the op models time it: the faster of the two (V100: fp16 tensor
    # cores; its bf16 is emulated)
    key = "bf16" if (tab.get("bf16") or 0) >= (tab.get("fp16") or 0) else "fp16"
    return key, cm.peak_flops(hw, key)


def _runs_fp8(g: Any, hw: dict[str, Any]) -> bool:
    """Whether the graph's GEMMs run FP8 math (a ``compute_dtype`` attribute, or an fp8 dtype)."""
    if str((getattr(g, "meta", None) or {}).get("dtype") or hw.get("dtype") or "").lower() in ("fp8", "float8"):
        return True
    attrs = getattr(g, "attrs", None) or {}
    c = attrs.get("compute_dtype")
    return c is not None and any(str(v).lower() == "fp8" for v in c.values)


class ReplayResult:
    """The outcome of :func:`ettools.replay.replay_trace` (see the module docstring)."""

    def __init__(self, trace: Trace, built: Built, schedule: Schedule, options: dict[str, Any],
                 hardware: dict[str, Any], timings: dict[str, float]) -> None:
        self.trace = trace
        self.built = built
        self.schedule = schedule
        self.options = options
        self.hardware = hardware
        self.timings = timings
        self.memory: dict[int, dict[str, Any]] = {}
        self._ranks: dict[int, RankReport] | None = None
        self._critical: dict[str, Any] | None = None

    # ---- per rank ---------------------------------------------------------------------------
    def rank_nodes(self, rank: int) -> tuple[int, int]:
        """``(first, stop)`` program indices of the nodes simulating ``rank``."""
        b = self.built
        j = b.sim_ranks.index(b.rep_of[rank])
        off = b.program.rank_offset
        return int(off[j]), int(off[j + 1])

    def replayed_times(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Replayed ``(start, end)`` of every node of ``rank``'s replayable graph (µs, job clock)."""
        a, z = self.rank_nodes(rank)
        return self.schedule.start[a:z], self.schedule.end[a:z]

    @property
    def ranks(self) -> dict[int, RankReport]:
        """Per-rank reports (every rank of the trace; symmetric ranks share their representative's)."""
        if self._ranks is None:
            self._ranks = {}
            cache: dict[int, RankReport] = {}
            for r in sorted(self.built.rep_of):
                rep = self.built.rep_of[r]
                if rep not in cache:
                    cache[rep] = self._rank_report(rep)
                base = cache[rep]
                rr = RankReport(**{**base.__dict__, "rank": r})
                if r != rep:
                    p = self.built.preps[r]
                    rr.measured_span_us = p.measured_span
                    rr.measured_steps_us = [e - s for _, s, e in p.steps]
                    rr.measured_step_time_us = float(np.mean(rr.measured_steps_us)) if rr.measured_steps_us else p.measured_span
                m = self.memory.get(r) or self.memory.get(rep)
                if m:
                    rr.peak_memory_bytes = int(m.get("peak_bytes", 0))
                    rr.memory = m
                self._ranks[r] = rr
        return self._ranks

    def _rank_report(self, rank: int) -> RankReport:
        p = self.built.preps[rank]
        g = p.graph
        a, z = self.rank_nodes(rank)
        st, en = self.schedule.start[a:z], self.schedule.end[a:z]
        prog = self.built.program
        j = self.built.sim_ranks.index(rank)
        # the rank's own start (a late orphan source may be its first node)
        release = (float(prog.rank_release[j]) if prog.rank_release is not None
                   else float(prog.release[a:z].min()) if z > a else 0.0)
        rows = p.span_rows if p.span_rows is not None else np.arange(len(g))
        span = float(en[rows].max() - release) if len(rows) else 0.0
        measured_steps = [e - s for _, s, e in p.steps]
        steps = _replayed_steps(p, st, en, measured_steps)
        comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
        synced = prog.kind[a:z] != COMPUTE
        cstart = st.copy()
        inst = prog.inst[a:z]
        if synced.any():
            cstart[synced] = np.fmax(st[synced], self.schedule.inst_start[inst[synced]])
        names = np.asarray(g.name)
        gap_ids = [g.strings.lookup(x) for x in _GAP_NAMES]
        is_gap = np.isin(names, [i for i in gap_ids if i >= 0])
        hold_id = g.strings.lookup("device_hold")  # a measured wait, not compute
        # (a bare ~False is the int -1: it would turn the mask into 0/1 indices)
        dev = (g.is_cpu_op != 1) & ~comm & ~((names == hold_id) if hold_id >= 0 else np.zeros(len(g), bool))
        comp_mask = dev if dev.any() else ((g.is_cpu_op == 1) & ~comm & ~is_gap)
        c_len, m_len, ov, busy = _breakdown(st, en, cstart, comp_mask, comm)
        flops = p.features[0]
        fsel = dev & (flops > 0)
        total_flops = float(flops[fsel].sum()) if fsel.any() else None
        mfu = None
        model_flops = float((getattr(g, "meta", None) or {}).get("model_flops") or 0)
        mfu_flops = "model" if model_flops > 0 else "nodes"
        hfu = None
        peak_dtype, peak = mfu_peak(self.hardware, (getattr(g, "meta", None) or {}).get("dtype"))
        fp8 = _runs_fp8(g, self.hardware)
        mfu_fp8 = None
        if (model_flops or total_flops) and span > 0:
            mfu = (model_flops or total_flops) / (span * 1e-6 * peak)
            # the node FLOPs too where they differ from the model's: recompute and elementwise work
            # count (published training throughput is often quoted this way, e.g. Megatron-LM's)
            if model_flops and total_flops:
                hfu = total_flops / (span * 1e-6 * peak)
            if fp8:
                mfu_fp8 = (model_flops or total_flops) / (span * 1e-6 * cm.peak_flops(self.hardware, "fp8"))
        srcs = {}
        tgt = cm.is_model_target(g)
        for code, name in enumerate(cm.SOURCES):
            k = int(((p.dur_src == code) & tgt).sum())
            if k:
                srcs[name] = k
        return RankReport(
            rank=rank, simulated_as=rank, step_time_us=float(np.mean(steps)) if steps else span, span_us=span,
            compute_us=c_len, comm_us=m_len, overlap_us=ov, exposed_comm_us=m_len - ov, idle_us=max(span - busy, 0.0),
            steps_us=steps, device_bound_steps_us=_device_bound_steps(p, st, en), measured_step_time_us=(float(np.mean(measured_steps)) if measured_steps else p.measured_span),
            measured_steps_us=measured_steps, measured_span_us=p.measured_span, mfu=mfu, flops=total_flops,
            mfu_flops=mfu_flops, hfu=hfu, mfu_peak=f"{peak_dtype} dense {peak / 1e12:,.1f} TFLOP/s",
            mfu_fp8_peak=mfu_fp8,
            duration_sources=srcs, form=p.form, time_by_source_us=self._time_by_source(rank),
        )

    def _inst_measured(self) -> np.ndarray:
        """Per comm instance: whether its transfer time came from measured member durations."""
        if getattr(self, "_inst_meas", None) is not None:
            return self._inst_meas
        prog = self.built.program
        meas = np.zeros(len(prog.instances), bool)
        if self.options.get("network_source") is None and not self.options.get("congestion"):
            for r in self.built.sim_ranks:
                a, z = self.rank_nodes(r)
                g = self.built.preps[r].graph
                inst = prog.inst[a:z]
                ok = (inst >= 0) & np.isfinite(g.dur) & (g.dur >= 0)
                meas[inst[ok]] = True
        self._inst_meas = meas
        return meas

    def _time_by_source(self, rank: int) -> dict[str, float]:
        """µs of modelled node time of ``rank`` per source: ``measured``, ``calibrated``, ``roofline``
        (compute and host nodes by their duration source), ``network`` (transfers the network model
        timed) and ``none`` (nodes nothing could time: counted as 0 µs)."""
        p = self.built.preps[rank]
        g = p.graph
        a, z = self.rank_nodes(rank)
        prog = self.built.program
        comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
        inst = prog.inst[a:z]
        out = {k: 0.0 for k in SHARE_SOURCES}
        dur = prog.dur[a:z]
        for code, name in enumerate(cm.SOURCES):
            sel = ~comm & (p.dur_src == code)
            out[name] += float(np.nansum(dur[sel]))
        meas = self._inst_measured()
        has = comm & (inst >= 0)
        idur = np.nan_to_num(prog.inst_dur, nan=0.0)
        if len(prog.instances) and has.any():
            # flow-simulated instances have no closed form: their replayed transfer time
            t = np.where(np.isfinite(prog.inst_dur[inst[has]]), idur[inst[has]],
                         self.schedule.end[a:z][has] - np.fmax(self.schedule.start[a:z][has],
                                                               self.schedule.inst_start[inst[has]]))
            m = meas[inst[has]]
            out["measured"] += float(t[m].sum())
            out["network"] += float(t[~m].sum())
        loc = comm & (inst < 0)
        if loc.any():
            mloc = loc & np.isfinite(g.dur) & (g.dur >= 0)
            out["measured"] += float(dur[mloc].sum())
            out["network"] += float(dur[loc & ~mloc].sum())
        return {k: v for k, v in out.items() if v > 0 or k == "none" and ((p.dur_src == cm.NONE) & ~comm).any()}

    # ---- whole job --------------------------------------------------------------------------
    @property
    def step_time_us(self) -> float:
        """The slowest rank's step time."""
        return max((r.step_time_us for r in self.ranks.values()), default=0.0)

    @property
    def rank_releases_us(self) -> dict[int, float]:
        """When each rank started in the replay (µs on the job clock; symmetric ranks share their
        representative's)."""
        b = self.built
        rr = b.program.rank_release
        if rr is None:
            return {r: 0.0 for r in b.rep_of}
        idx = {r: j for j, r in enumerate(b.sim_ranks)}
        return {r: float(rr[idx[b.rep_of[r]]]) for r in sorted(b.rep_of)}

    @property
    def rank_skew_us(self) -> float:
        """The rank skew replayed: the largest difference between two ranks' start times (µs); 0
        with ``align_ranks``."""
        v = list(self.rank_releases_us.values())
        return float(max(v) - min(v)) if v else 0.0

    @property
    def span_us(self) -> float:
        """The job's replayed span: from the first rank's start to the last end of a row that ends
        a rank's span (µs). The critical path is a path inside it, so never longer."""
        ends, starts = [], []
        for r in self.built.sim_ranks:
            rr = self.ranks[r]
            st, en = self.replayed_times(r)
            p = self.built.preps[r]
            rows = p.span_rows if p.span_rows is not None else np.arange(len(p.graph))
            if len(rows):
                e = float(np.nanmax(en[rows]))
                ends.append(e)
                starts.append(e - rr.span_us)
        return max(ends) - min(starts) if ends else 0.0

    @property
    def rewritten(self) -> bool:
        """Whether the trace is a rewrite (``scale``): durations derived from another plan's
        measurements, so its "measured" step is the source plan's."""
        return any(str(g.meta.get("durations", "")) == "rewritten" for g in self.trace.graphs.values())

    @property
    def modelled(self) -> str | None:
        """The GPU an emulated capture modelled the trace's times for (``ettools capture --emulate``):
        its "measured" step is a model's, nothing was measured."""
        for g in self.trace.graphs.values():
            if str(g.meta.get("durations", "")) == "modelled":
                return str(g.meta.get("emulated_gpu") or "?")
        return None

    @property
    def measured_step_time_us(self) -> float | None:
        """The slowest rank's measured step time, when the trace has measured times."""
        vals = [r.measured_step_time_us for r in self.ranks.values() if r.measured_step_time_us is not None]
        return max(vals) if vals else None

    def critical_path(self, top: int = 10) -> dict[str, Any]:
        """The critical path (see the module docstring)."""
        if self._critical is not None:
            return self._critical
        s = self.schedule
        prog = self.built.program
        if not len(s.end):
            return {"length_us": 0.0, "nodes": 0}
        # the path ends where the replayed span ends: the last of the rows that end a rank's span
        # (not, e.g., a watchdog's polling past the step), and starts at its source's start
        cand = np.concatenate([self.rank_nodes(r)[0] + (self.built.preps[r].span_rows
                                                          if self.built.preps[r].span_rows is not None
                                                          else np.arange(len(self.built.preps[r].graph)))
                               for r in self.built.sim_ranks])
        cand = cand[np.isfinite(s.end[cand])] if len(cand) else cand
        u = int(cand[np.argmax(s.end[cand])]) if len(cand) else int(np.nanargmax(s.end))
        path = []
        seen = set()
        while u >= 0 and u not in seen:
            seen.add(u)
            path.append(u)
            u = int(s.cause[u])
        path = np.asarray(path[::-1], np.int64)
        ends = s.end[path]
        t0 = float(s.start[path[0]]) if len(path) else 0.0
        # each node is credited with how far it pushed the path's running end (a node released by
        # its cause's start — the launch queue — may end before its cause); capped at the path's
        # end, so the credits add up to the path's length
        reach = np.minimum(np.maximum.accumulate(np.concatenate(([t0], ends))), ends[-1] if len(ends) else t0)
        credit = np.maximum(np.diff(reach), 0.0)
        by_class: dict[str, float] = {}
        top_nodes = []
        for j in np.argsort(-credit)[: max(top, 0)].tolist():
            u = int(path[j])
            ri = int(prog.rank_of[u])
            r = self.built.sim_ranks[ri]
            row = int(prog.node_row[u])
            g = self.built.preps[r].graph
            top_nodes.append({"rank": r, "node_id": int(g.id[row]), "name": g.name_of(row), "us": float(credit[j])})
        for ri in np.unique(prog.rank_of[path]).tolist():
            r = self.built.sim_ranks[ri]
            g = self.built.preps[r].graph
            sel = prog.rank_of[path] == ri
            rows = prog.node_row[path[sel]]
            codes = classify_names(g.name[rows], g.strings)
            comm = np.isin(g.type[rows], [int(t) for t in COMM_NODE_TYPES])
            host = g.is_cpu_op[rows] == 1
            for c, h, m, cr in zip(codes.tolist(), host.tolist(), comm.tolist(), credit[sel].tolist()):
                key = "Communication" if m else ("Host" if h else CLASSES[c])
                by_class[key] = by_class.get(key, 0.0) + cr
        self._critical = {
            "length_us": float(ends[-1] - t0) if len(ends) else 0.0, "nodes": int(len(path)),
            "ranks": sorted({self.built.sim_ranks[int(ri)] for ri in np.unique(prog.rank_of[path])}),
            "by_class_us": {k: round(v, 3) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "top_nodes": top_nodes,
        }
        return self._critical

    def measured_kept(self) -> dict[str, Any]:
        """What the replay keeps as measured because the trace cannot say more (simulated ranks):
        ``collectives_peers_absent`` — comm nodes whose group members or peer are not in the trace
        (one rank of a larger job: the kernel time includes waiting for them, so it is replayed
        as measured, not as a network estimate); ``device_holds`` / ``device_hold_us`` — device
        ops held back by something the trace does not record (see
        :func:`ettools.converters.kineto_sync.device_holds`), replayed as a measured delay."""
        holds, hold_us = 0, 0.0
        for r in self.built.sim_ranks:
            g = self.built.preps[r].graph
            hid = g.strings.lookup("device_hold")
            if hid >= 0:
                sel = g.name == hid
                holds += int(sel.sum())
                hold_us += float(np.nansum(g.dur[sel]))
        span = sum(self.ranks[r].span_us for r in self.built.sim_ranks)
        # how much of the replayed time is a measured delay rather than a modelled one: what a
        # self-replay's agreement with the measured step does not prove
        return {"collectives_peers_absent": int(self.built.local_comm), "device_holds": holds,
                "device_hold_us": hold_us, "device_hold_share_of_span": (hold_us / span if span > 0 else 0.0)}

    @property
    def time_by_source_us(self) -> dict[str, float]:
        """Node time summed over the simulated ranks per source that timed it (see
        :meth:`_time_by_source`): which model timed what share of the replay. Device ops of a
        measured trace re-timed for another GPU (:mod:`.retime`) count as ``retimed``, not measured."""
        out: dict[str, float] = {}
        for r in self.built.sim_ranks:
            for k, v in self.ranks[r].time_by_source_us.items():
                out[k] = out.get(k, 0.0) + v
        rt = self.retimed
        if rt:
            moved = float(rt.get("retimed_us", 0.0))
            out["retimed"] = moved
            out["measured"] = max(out.get("measured", 0.0) - moved, 0.0)
        return out

    @property
    def retimed(self) -> dict[str, Any] | None:
        """The re-timing of a measured trace for another GPU (:func:`.api._retime_for_system`),
        None when none was done."""
        rt = self.options.get("retiming")
        return rt if rt and rt.get("from") and "note" not in rt else None

    def _network_label(self) -> str:
        """The network option as the summary states it ("measured" only when a transfer was)."""
        if self.options.get("network_source"):
            return str(self.options["network_source"])
        if self._inst_measured().any() or any(
                np.isfinite(self.built.preps[r].graph.dur[np.isin(self.built.preps[r].graph.type,
                                                                  [int(t) for t in COMM_NODE_TYPES])]).any()
                for r in self.built.sim_ranks):
            return "traced transfer times where the trace has them, else the hardware's default"
        return f"the default of {cm.hardware_label(self.hardware)}"

    def _retiming_lines(self) -> list[str]:
        """What re-timing for another GPU did (or why it did nothing)."""
        rt = self.options.get("retiming")
        if not rt:
            return []
        if "note" in rt:
            return [f"note: {rt['note']}"]
        sh = rt["share_of_device_time"]
        # an emulated capture's source times are the model's, not measurements
        src = "modelled" if self.modelled else "measured"
        out = [f"device ops re-timed {rt['from']} -> {rt['to']}: {rt['device_us_measured'] / 1000:.2f} -> "
               f"{rt['device_us_retimed'] / 1000:.2f} ms over {rt['device_ops']:,} ops; of the {src} device "
               f"time {100 * sh['by shape']:.1f} % by shape, {100 * sh['by class transfer']:.1f} % by class "
               f"transfer, {100 * sh['kept as measured']:.1f} % kept as {src}",
               f"host work {rt['host']}" if not self.modelled else
               "host work kept as the emulated capture laid it out (its host-cost table or this machine's time)"]
        out += [f"op model of {gpu}: {how}" for gpu, how in (rt.get("op_models") or {}).items() if how != "its own fit"]
        if rt.get("kept_ops"):
            out.append("kept as measured (no model of their class): " + ", ".join(
                f"{k[:60]} {v:.0f} us" for k, v in list(rt["kept_ops"].items())[:5]))
        return out

    def _sources_line(self) -> str:
        """``timed by: measured 80.0 %, roofline 15.0 %, network 5.0 %`` (and untimed nodes)."""
        tb = self.time_by_source_us
        tot = sum(tb.values())
        label = {"measured": f"modelled by the emulated capture ({self.modelled})"} if self.modelled else {}
        parts = [f"{label.get(k, k)} {100 * v / tot:.1f} %" for k, v in tb.items() if v > 0 and tot > 0]
        untimed = sum(self.ranks[r].duration_sources.get("none", 0) for r in self.built.sim_ranks)
        opt = self.options.get("timing")
        # the default option is not a claim that anything was measured: name it only when chosen
        line = (f"time by model (--timing {opt}): " if opt != "measured" else "time by model: ") + (
            ", ".join(parts) or "nothing timed")
        if untimed:
            line += f"; {untimed:,} compute nodes nothing could time (0 µs)"
        return line

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (see the issue's contract; extra keys are documented here)."""
        ranks = self.ranks
        out: dict[str, Any] = {"step_time_us": self.step_time_us}
        m = self.measured_step_time_us
        if m is not None and (self.retimed or self.rewritten or self.modelled):
            # the measured step is the source GPU's, or the source plan's, or an emulated capture's
            # modelled one: no error against it here
            out["source_measured_step_time_us" if not self.modelled else "source_modelled_step_time_us"] = m
            if self.rewritten:
                out["durations"] = "rewritten"
            elif self.modelled:
                out["durations"] = "modelled"
                out["emulated_gpu"] = self.modelled
        elif m is not None:
            out["measured_step_time_us"] = m
            out["error_pct"] = 100.0 * (self.step_time_us - m) / m if m else None
        if self.options.get("retiming"):
            out["retiming"] = self.options["retiming"]
        eff = self.what_if_effect()
        if eff is not None:
            out["what_if"] = eff
        d = self.device_bound_step_us()
        if d is not None:
            # the same steps between device-activity boundaries (see _device_bound_steps): measured
            # (on the source GPU, when re-timed) and replayed
            out["measured_device_bound_step_time_us"] = d
            out["device_bound_step_time_us"] = self.device_bound_step_us(replayed=True)
        out.update({
            "timing": self.options.get("timing"),
            "time_by_source_us": self.time_by_source_us,
            # compute time contention with transfers added (modelled ops only; simulated ranks)
            "contention_us": float(getattr(self.schedule, "contention_us", 0.0)),
            "span_us": self.span_us,
            "hardware": cm.hardware_label(self.hardware),
            "hardware_detected": self.hardware.get("detected"),
            "network": self.options.get("network_source"),
            "symmetric": bool(self.options.get("symmetric")),
            "simulated_ranks": len(self.built.sim_ranks),
            "nodes_simulated": int(self.built.program.n),
            "comm_instances": len(self.built.program.instances),
            "comm_local": int(self.built.local_comm),
            "kept_measured": self.measured_kept(),
            "rank_skew_us": self.rank_skew_us,
            "align_ranks": bool(self.options.get("align_ranks")),
            "rank_clock": self.trace.meta.extra.get("rank_clock"),
            "seconds": {k: round(v, 4) for k, v in self.timings.items()},
            "ranks": {str(r): rr.to_dict() for r, rr in ranks.items()},
            "critical_path": self.critical_path(),
        })
        return out

    def json_bytes(self) -> bytes:
        """:meth:`to_json` serialized (deterministic key order, NaN as null)."""
        return orjson.dumps(_clean(self.to_json()), option=orjson.OPT_INDENT_2)

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_json` atomically."""
        path = Path(path)
        with atomic_write(path) as f:
            f.write(self.json_bytes())
        return path

    def summary_text(self) -> str:
        """A short human summary."""
        ranks = self.ranks
        lines = []
        m = self.measured_step_time_us
        rt = self.retimed
        if rt:
            head = (f"predicted step time {self.step_time_us / 1000:.3f} ms on {rt['to']}"
                    + ((f" (the emulated {rt['from']} capture modelled {m / 1000:.3f} ms)" if self.modelled else
                        f" (the {rt['from']} trace measured {m / 1000:.3f} ms)") if m else ""))
        else:
            head = f"replayed step time {self.step_time_us / 1000:.3f} ms"
            if m and self.modelled:
                head += (f" (the emulated capture's times, modelled for {self.modelled}: "
                         "nothing was measured)")
            elif m and self.rewritten:
                head += (f" (estimated: a rewrite of a capture that measured {m / 1000:.3f} ms under its own "
                         "plan; this plan was not measured)")
            elif m:
                head += f" (measured {m / 1000:.3f} ms, {100 * (self.step_time_us - m) / m:+.2f} %)"
        lines.append(head)
        lines.extend(self._retiming_lines())
        lines.append(f"hardware {cm.hardware_label(self.hardware)} ({self.hardware.get('detected') or 'preset'}), "
                     f"network {self._network_label()}; "
                     f"{len(ranks)} ranks ({len(self.built.sim_ranks)} simulated), {self.built.program.n:,} nodes, "
                     f"{sum(self.timings.values()):.2f} s")
        lines.append(self._sources_line())
        cont = float(getattr(self.schedule, "contention_us", 0.0))
        if cont > 0:
            lines.append(f"contention with transfers: +{cont / 1000:.2f} ms of modelled compute time over "
                         f"{self.schedule.contended:,} ops that ran beside a collective or send/recv of their rank "
                         "(simulated ranks; --no-contention for none)")
        if len(ranks) > 1:
            if self.options.get("align_ranks"):
                lines.append("rank skew replayed: 0 µs (--align-ranks: every rank starts together)")
            else:
                skew = self.rank_skew_us
                clock = self.trace.meta.extra.get("rank_clock")
                how = ("the rank files share no clock: ranks start together" if clock == "none"
                       else "each rank starts at its first traced event on the job's clock; --align-ranks for none"
                       if skew > 0 else "ranks start together")
                lines.append(f"rank skew replayed: {skew:,.0f} µs ({how})")
        worst = sorted(ranks.values(), key=lambda r: -r.step_time_us)[:8]
        with_hfu = any(r.hfu is not None for r in worst)
        lines.append(f"{'rank':>5} {'step ms':>10} {'compute':>8} {'comm':>8} {'exposed':>8} {'idle':>8} {'peak mem':>10} {'MFU':>6}"
                     + (f" {'HFU':>6}" if with_hfu else ""))
        for r in worst:
            span = r.span_us or 1.0
            mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-"
            hfu = (f" {100 * r.hfu:.1f}%" if r.hfu is not None else f" {'-':>6}") if with_hfu else ""
            lines.append(f"{r.rank:>5} {r.step_time_us / 1000:>10.3f} {100 * r.compute_us / span:>7.1f}% "
                         f"{100 * r.comm_us / span:>7.1f}% {100 * r.exposed_comm_us / span:>7.1f}% "
                         f"{100 * r.idle_us / span:>7.1f}% {_fmt_bytes(r.peak_memory_bytes):>10} {mfu:>6}{hfu}")
        if len(ranks) > len(worst):
            lines.append(f"  ({len(ranks) - len(worst)} more ranks)")
        if any(r.mfu is not None for r in worst):
            conv = {r.mfu_flops for r in worst if r.mfu is not None}
            lines.append("MFU counts " + " / ".join(
                {"model": "model FLOPs (3 x forward matmuls + attention at the causal half: 6·N·tokens + attention)",
                 "nodes": "the FLOPs of the device compute nodes (hardware FLOPs: recompute, kernel tiles)"}[c]
                for c in sorted(conv)))
            if with_hfu:
                lines.append("HFU counts the FLOPs of the device compute nodes (recompute, elementwise ops, kernel "
                             "tiles: the convention of throughput quoted with recompute, e.g. Megatron-LM's)")
            peaks = sorted({r.mfu_peak for r in worst if r.mfu is not None and r.mfu_peak})
            if peaks:
                line = "MFU" + ("/HFU" if with_hfu else "") + " against the " + " / ".join(peaks) + " peak"
                fp8 = [r.mfu_fp8_peak for r in worst if r.mfu_fp8_peak is not None]
                if fp8:
                    line += (f"; the FP8 GEMMs' peak is {cm.peak_flops(self.hardware, 'fp8') / 1e12:,.1f} TFLOP/s: "
                             f"MFU against it {100 * min(fp8):.1f}" + (f"-{100 * max(fp8):.1f}" if max(fp8) > min(fp8) else "")
                             + " %")
                lines.append(line)
        kept = self.measured_kept()
        parts = []
        if kept["collectives_peers_absent"]:
            parts.append(f"{kept['collectives_peers_absent']:,} collectives whose peers are absent from the trace "
                         "(their time includes waiting for them)")
        if kept["device_holds"]:
            parts.append(f"{kept['device_holds']:,} device holds the trace does not explain "
                         f"({kept['device_hold_us'] / 1000:.2f} ms, {100 * kept['device_hold_share_of_span']:.1f} % "
                         "of the replayed span: a measured delay, not modelled)")
        if parts:
            lines.append("kept as measured: " + "; ".join(parts))
        lines.extend(self._device_bound_lines())
        lines.extend(self._what_if_lines())
        cp = self.critical_path()
        if cp.get("by_class_us"):
            parts = ", ".join(f"{k} {v / 1000:.2f} ms" for k, v in list(cp["by_class_us"].items())[:5])
            lines.append(f"critical path {cp['length_us'] / 1000:.3f} ms over ranks {cp['ranks'][:8]}: {parts}")
        oom = [r for r, m in self.memory.items() if m.get("oom")]
        if oom:
            lines.append(f"OUT OF MEMORY on ranks {oom[:16]}")
        return "\n".join(lines)

    def what_if_effect(self) -> dict[str, Any] | None:
        """The what-if factors and how far they moved the step from the measured one (or, without
        one, from the same replay without the what-if); None without a what-if."""
        wi = self.options.get("what_if")
        m = self.measured_step_time_us
        base = "measured step"
        if m is None:
            m, base = self.options.get("what_if_baseline_us"), "the same replay without the what-if"
        if not wi or not m or self.retimed:
            return None
        return {"factors": wi, "step_change_pct": 100.0 * (self.step_time_us - m) / m, "against": base}

    def _what_if_lines(self) -> list[str]:
        """A warning when a what-if barely moved the step: say what bounds it."""
        eff = self.what_if_effect()
        if eff is None or abs(eff["step_change_pct"]) >= 0.5:
            return []
        cp = self.critical_path().get("by_class_us") or {}
        top = next(iter(cp.items()), None)
        what = (f"its critical path is mostly {top[0]} ({top[1] / 1000:.2f} ms)" if top else "nothing it scaled is on the critical path")
        return [f"warning: the what-if moved the step by {eff['step_change_pct']:+.2f} % only: {what}; "
                "host calls that wait for the device keep their measured durations"]

    def device_bound_step_us(self, replayed: bool = False) -> float | None:
        """Mean step between device-activity boundaries over the simulated ranks
        (:func:`_device_bound_steps`), measured or ``replayed``; None without steps."""
        if replayed:
            vals = [v for r in self.built.sim_ranks for v in self.ranks[r].device_bound_steps_us]
        else:
            vals = [v for r in self.built.sim_ranks for v in _device_bound_steps(self.built.preps[r])]
        return float(np.mean(vals)) if vals else None

    def _device_bound_lines(self) -> list[str]:
        """A warning when the device ran well past the step annotations (the host ran ahead), with
        the replayed (predicted) step between the same boundaries."""
        m, d = self.measured_step_time_us, self.device_bound_step_us()
        if not m or d is None or d <= 1.05 * m:
            return []
        r = self.device_bound_step_us(replayed=True)
        what = "predicted" if self.retimed else "replayed"
        return [f"warning: the device ran past the step annotations: measured between device-activity "
                f"boundaries a step is {d / 1000:.3f} ms, the ProfilerStep annotations {m / 1000:.3f} ms "
                "(the host launched ahead of the device; in a GPU-bound loop the first is the period); "
                f"{what} between the same boundaries: {r / 1000:.3f} ms"]

    def write_timeline(self, path: str | Path) -> Path:
        """Per-rank replayed timeline as Chrome trace JSON (Perfetto), one process per simulated rank."""
        from ettools.converters.chrome import write_chrome

        graphs = {}
        for r in self.built.sim_ranks:
            g = self.built.preps[r].graph
            st, en = self.replayed_times(r)
            graphs[r] = g.replace(start=st, dur=en - st)
        tr = Trace(self.trace.meta, graphs, self.trace.strings)
        return write_chrome(tr, Path(path), flows=True)

    def step_breakdown(self, rank: int) -> dict[str, Any]:
        """Compute, comm, overlap and idle µs of one replayed step of ``rank`` (its last step, the
        steadiest), or of its whole span when the trace has no steps (``step`` None)."""
        rep = self.built.rep_of[rank]
        p = self.built.preps[rep]
        rr = self.ranks[rank]
        if not p.step_rows:
            return {"step": None, "compute_us": rr.compute_us, "comm_us": rr.comm_us,
                    "overlap_us": rr.overlap_us, "idle_us": rr.idle_us, "span_us": rr.span_us}
        g = p.graph
        a, z = self.rank_nodes(rep)
        st, en = self.schedule.start[a:z], self.schedule.end[a:z]
        prog = self.built.program
        comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
        synced = prog.kind[a:z] != COMPUTE
        cstart = st.copy()
        if synced.any():
            cstart[synced] = np.fmax(st[synced], self.schedule.inst_start[prog.inst[a:z][synced]])
        gap_ids = [i for i in (g.strings.lookup(x) for x in _GAP_NAMES) if i >= 0]
        dev = (g.is_cpu_op != 1) & ~comm
        comp_mask = dev if dev.any() else ((g.is_cpu_op == 1) & ~comm & ~np.isin(g.name, gap_ids))
        k = len(p.step_rows) - 1
        rows = p.step_rows[k]
        lo, hi = float(st[rows].min()), float(en[rows].max())
        c, m, ov, busy = _breakdown(st, en, cstart, comp_mask, comm, lo, hi)
        return {"step": p.steps[k][0], "compute_us": c, "comm_us": m, "overlap_us": ov,
                "idle_us": max(hi - lo - busy, 0.0), "span_us": hi - lo}

    def plot(self, path: str | Path) -> Path:
        """A stacked bar chart of each rank's breakdown over one replayed step (the whole span when
        the trace has no steps; matplotlib, imported here)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ranks = self.ranks
        keys = sorted(ranks)
        if len(keys) > 64:  # one bar per distinct replay is enough
            keys = sorted(self.built.sim_ranks)
        parts = {r: self.step_breakdown(r) for r in keys}
        comp_only = np.array([parts[r]["compute_us"] - parts[r]["overlap_us"] for r in keys]) / 1000
        overlap = np.array([parts[r]["overlap_us"] for r in keys]) / 1000
        exposed = np.array([parts[r]["comm_us"] - parts[r]["overlap_us"] for r in keys]) / 1000
        idle = np.array([parts[r]["idle_us"] for r in keys]) / 1000
        step_names = {parts[r]["step"] for r in keys}
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(keys) + 3), 4))
        x = np.arange(len(keys))
        bottom = np.zeros(len(keys))
        for vals, label, color in ((comp_only, "compute", "#4c72b0"), (overlap, "compute ∥ comm", "#8172b2"),
                                   (exposed, "exposed comm", "#dd8452"), (idle, "idle / host", "#cccccc")):
            ax.bar(x, vals, bottom=bottom, label=label, color=color)
            bottom += vals
        ax.set_xticks(x)
        ax.set_xticklabels([str(r) for r in keys], fontsize=7)
        ax.set_xlabel("rank")
        ax.set_ylabel("ms")
        what = (f"replayed {', '.join(sorted(str(n) for n in step_names))}" if None not in step_names
                else "replayed span")
        ax.set_title(f"{what} breakdown ({self.options.get('timing')})", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
        fig.savefig(tmp, dpi=120, metadata={"Software": None} if path.suffix == ".png" else None)
        plt.close(fig)
        tmp.replace(path)
        return path


def _fmt_bytes(b: int) -> str:
    if not b:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return str(b)


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x
