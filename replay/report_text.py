"""A replay's report for people: the summary :meth:`ReplayText.summary_text` prints and the
breakdown plot :meth:`ReplayText.plot` draws (mixed into :class:`.report.ReplayResult`, whose
measures they read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ettools.graph import COMM_NODE_TYPES

from . import compute as cm


class ReplayText:
    """The human-readable outputs of :class:`.report.ReplayResult` (a mixin: every measure it
    prints is the result's own)."""

    def _network_label(self) -> str:
        """The network option as the summary states it ("measured" only when a transfer was)."""
        if self.options.get("network_source"):
            on = self.options.get("network_fitted_on")
            return str(self.options["network_source"]) + (f" (fitted on {on})" if on else "")
        if self._inst_measured().any() or any(
                np.isfinite(self.built.preps[r].graph.dur[np.isin(self.built.preps[r].graph.type,
                                                                  [int(t) for t in COMM_NODE_TYPES])]).any()
                for r in self.built.sim_ranks):
            return "traced transfer times where the trace has them, else the hardware's default"
        from .network import default_network

        world = max(self.trace.meta.world_size, max(self.trace.graphs, default=-1) + 1)
        if world < 2:
            return f"the default of {self.hardware.label}"
        # a fit of measured tables names them and what it left to the preset's links
        src = str(getattr(default_network(world, self.hardware), "fitted_on", "") or "")
        return f"the default of {self.hardware.label}" + (f": NCCL tables {src}" if src else "")

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
        if rt.get("source_detected"):
            out.append(f"measured on {rt['from']}: {rt['source_detected']}")
        out += [f"op model of {gpu}: {how}" for gpu, how in (rt.get("op_models") or {}).items() if how != "its own fit"]
        if rt.get("kept_ops"):
            out.append("kept as measured (no model of their class): " + ", ".join(
                f"{k[:60]} {v:.0f} us" for k, v in list(rt["kept_ops"].items())[:5]))
        return out

    def _from_headers_note(self) -> str:
        """How many rank files were built from their headers (``read_chakra(trust_structure=...)``)."""
        n = int(self.trace.meta.extra.get("ranks_from_headers", 0) or 0)
        return (f"; {n:,} rank files built from their header's structure digest and a file read in full, "
                "their bodies not read" if n else "")

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
        kg = self.kernel_gap
        if kg:
            line += (f"; each of {kg['kernels']:,} predicted kernels + {kg['us_per_kernel']:.2f} µs stream gap "
                     f"({kg['source']})")
        return line

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
        lines.append(f"hardware {self.hardware.label} ({self.hardware.detected or 'preset'}), "
                     f"network {self._network_label()}; "
                     f"{len(ranks)} ranks ({len(self.built.sim_ranks)} simulated{self._from_headers_note()}), "
                     f"{self.built.program.n:,} nodes, {sum(self.timings.values()):.2f} s")
        lines.append(self._sources_line())
        cont, slowed = self.contention_totals()
        if cont > 0:
            lines.append(f"contention with transfers: +{cont / 1000:.2f} ms of modelled compute time over "
                         f"{slowed:,} ops that ran beside a collective or send/recv of their rank "
                         "(all ranks; --no-contention for none)")
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
