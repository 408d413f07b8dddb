"""What a replay reports: step time per rank, the time breakdown, the critical path, MFU, memory,
a Chrome timeline, JSON, a short summary and a plot.

``step_time_us``: the mean replayed ``ProfilerStep`` time when the trace has steps (each step from
its first host slice's start to its last one's end, as the profiler measures it), else the rank's
replayed span. The job's step time is the slowest rank's.

Critical path: from the node that ends last, each node's *cause* (the dependency that finished last,
the previous node of its lane, or the last member to reach its collective) back to a source. Each
node on it is credited ``end − end of the next older node``, so the credits add up to the makespan;
``by_class`` sums them per op class (:mod:`ettools.classify`) and communication.

The per-rank measures (the breakdown, MFU) are :mod:`.breakdown`'s; the summary and plot are
rendered by :mod:`.report_text`, the JSON and the timeline by :mod:`.report_json`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.classify import CLASSES, classify_names
from ettools.graph import COMM_NODE_TYPES, Trace

from . import compute as cm
from .breakdown import (
    _GAP_NAMES,
    SHARE_SOURCES,
    RankReport,
    _breakdown,
    _device_bound_steps,
    _replayed_steps,
    _runs_fp8,
    mfu_peak,
)
from .devices import Hardware
from .engine import COMPUTE, Schedule
from .program import Built
from .report_json import ReplayJson
from .report_text import ReplayText


class ReplayResult(ReplayText, ReplayJson):
    """The outcome of :func:`ettools.replay.replay_trace` (see the module docstring)."""

    def __init__(self, trace: Trace, built: Built, schedule: Schedule, options: dict[str, Any],
                 hardware: Hardware, timings: dict[str, float]) -> None:
        self.trace = trace
        self.built = built
        self.schedule = schedule
        self.options = options
        self.hardware = hardware
        self.timings = timings
        self.memory: dict[int, dict[str, Any]] = {}
        self._ranks: dict[int, RankReport] | None = None
        self._critical: dict[str, Any] | None = None

    def contention_totals(self) -> tuple[float, int]:
        """Compute time (µs) added by contention with transfers and the ops it slowed, over every rank
        of the trace: a simulated rank counts once for each rank of its class."""
        s, b = self.schedule, self.built
        if not s.contention_by_rank:
            return float(s.contention_us), int(s.contended)
        size: dict[int, int] = {}
        for r in b.rep_of.values():
            size[r] = size.get(r, 0) + 1
        us = sum(x * size.get(r, 1) for r, x in zip(b.sim_ranks, s.contention_by_rank))
        ops = sum(k * size.get(r, 1) for r, k in zip(b.sim_ranks, s.contended_by_rank))
        return float(us), int(ops)

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
    def kernel_gap(self) -> dict[str, Any] | None:
        """The GPU's kernel-to-kernel gap the replay added to its predicted kernels (simulated
        ranks), with where the gap comes from; None when none was added."""
        n = sum(int(self.built.preps[self.built.rep_of[r]].notes.get("kernel_gap_nodes", 0))
                for r in self.built.sim_ranks)
        if not n:
            return None
        return {"us_per_kernel": float(self.hardware.kernel_gap_us or 0.0), "kernels": n,
                "source": self.hardware.kernel_gap_source}

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

    def device_bound_step_us(self, replayed: bool = False) -> float | None:
        """Mean step between device-activity boundaries over the simulated ranks
        (:func:`_device_bound_steps`), measured or ``replayed``; None without steps."""
        if replayed:
            vals = [v for r in self.built.sim_ranks for v in self.ranks[r].device_bound_steps_us]
        else:
            vals = [v for r in self.built.sim_ranks for v in _device_bound_steps(self.built.preps[r])]
        return float(np.mean(vals)) if vals else None

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
