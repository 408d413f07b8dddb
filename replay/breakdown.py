"""Per-rank measures of a replay: the time breakdown, replayed steps, MFU's peak, :class:`RankReport`.

Breakdown of a rank's replayed span (all in µs; intervals are unions, so concurrent streams count once):

* ``compute_us`` — time some compute node of the rank runs on a device lane (ranks without device
  ops: on a host lane, host idle gaps excluded);
* ``comm_us`` — time a transfer of the rank is in flight (a collective from the moment its last member
  arrived to its end; a node replayed locally over its whole duration);
* ``overlap_us`` — compute and communication at once; ``exposed_comm_us = comm_us − overlap_us``;
* ``idle_us`` — the rest of the span (host work with an idle device, waiting for peers, bubbles).

MFU: FLOPs / (span × peak FLOP/s of the hardware description), where the FLOPs are the model
FLOPs of a synthesized rank (graph meta ``model_flops``: 3 × the forward matmul and attention
FLOPs, causal attention at the exact half — the 6·N·tokens + attention convention, no recompute,
no kernel tiles) and otherwise those of the rank's device compute nodes (``num_ops``, or derived
from shapes: hardware FLOPs). ``mfu_flops`` says which (``model`` or ``nodes``). Where the MFU
counts model FLOPs, ``hfu`` is the hardware FLOPs utilization too: the node FLOPs (recompute included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.intervals import merge_intervals

from . import compute as cm
from .devices import Hardware

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


def mfu_peak(hw: Hardware, dtype: str | None = None) -> tuple[str, float]:
    """``(dtype, FLOP/s)`` the MFU is quoted against: the dense BF16 (FP16 where that is faster) peak
    for 8- and 16-bit training, by convention (FP8 training included: its FP8 MFU is given beside); the
    dtype's own peak for 32- and 64-bit math."""
    d = str(dtype or hw.dtype or "bf16").lower()
    tab = hw.peak_tflops
    d = {"float32": "fp32", "float64": "fp64"}.get(d, d)
    if d in ("fp32", "tf32", "fp64") and tab.get(d):
        return d, cm.peak_flops(hw, d)
    # the 16-bit group's peak as the op models time it: the faster of the two (V100: fp16 tensor
    # cores; its bf16 is emulated)
    key = "bf16" if (tab.get("bf16") or 0) >= (tab.get("fp16") or 0) else "fp16"
    return key, cm.peak_flops(hw, key)


def _runs_fp8(g: Any, hw: Hardware) -> bool:
    """Whether the graph's GEMMs run FP8 math (a ``compute_dtype`` attribute, or an fp8 dtype)."""
    if str((getattr(g, "meta", None) or {}).get("dtype") or hw.dtype or "").lower() in ("fp8", "float8"):
        return True
    attrs = getattr(g, "attrs", None) or {}
    c = attrs.get("compute_dtype")
    return c is not None and any(str(v).lower() == "fp8" for v in c.values)
