"""Entry point of the replay: :func:`replay_trace`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.graph import Trace

from . import compute as cm
from .engine import simulate
from .network import FlowNetwork, load_network, load_system
from .prepare import build_program, comm_times, prepare_rank, rank_releases, symmetry_classes
from .report import ReplayResult


def _timing(timing: str) -> tuple[str, Any]:
    """``(mode, fit)`` from ``measured`` | ``calibrated:PATH`` | ``roofline``."""
    if timing in ("measured", "roofline"):
        return timing, None
    if timing.startswith("calibrated:"):
        from .calibrate import load_fit

        return "calibrated", load_fit(timing.split(":", 1)[1])
    if timing == "calibrated":
        raise ValueError("timing 'calibrated' needs a fit file: calibrated:PATH (make one with ettools calibrate)")
    raise ValueError(f"unknown timing {timing!r}: use measured, calibrated:PATH or roofline")


def _without_stream_gap(trace: Trace) -> Trace:
    """``trace`` with the Chakra reader's ``chakra_stream_gap_us`` dropped from every rank's meta."""
    if not any("chakra_stream_gap_us" in g.meta for g in trace.graphs.values()):
        return trace
    graphs = {}
    for r, g in trace.graphs.items():
        if "chakra_stream_gap_us" in g.meta:
            g = g.replace()
            g.meta.pop("chakra_stream_gap_us")
        graphs[r] = g
    return Trace(trace.meta, graphs, trace.strings)


def replay_trace(
    trace: Trace,
    system: str | Path | dict[str, Any] | None = None,
    network: str | Path | dict[str, Any] | None = None,
    collectives: str | Path | dict[str, Any] | None = None,
    timing: str = "measured",
    symmetric: bool | None = None,
    congestion: bool = False,
    overlap_slowdown: float | None = None,
    memory: bool = True,
    memory_trace: Trace | None = None,
    what_if: dict[str, float] | None = None,
    align_ranks: bool = False,
    contention: bool = True,
) -> ReplayResult:
    """Replay ``trace`` on a described cluster and return a :class:`~.report.ReplayResult`.

    ``system``: hardware preset name (A100, H100, H200, B200, MI300X), JSON file or dict (see
    :func:`.compute.load_hardware`; default: the preset the trace's device properties name, with
    their memory size, else H100). ``network``: ASTRA-sim network YAML (or a link
    graph JSON); None keeps measured communication times and models the rest with the hardware's
    default network. ``collectives``: ASTRA-sim system JSON (algorithms per dimension, dataset
    splits, ``peak-perf``/``local-mem-bw`` for roofline). ``timing``: ``measured``,
    ``calibrated:PATH`` or ``roofline`` (first choice per node, then the fallback chain).
    ``symmetric``: simulate one representative of each class of provably symmetric ranks (not with
    a congestion-aware network, whose shared links couple every rank's traffic); None (default):
    on in ASTRA-sim mode (``network`` and ``collectives``, compute from the files' durations), where
    the classes are proven on exactly what the simulation reads, off otherwise.
    ``congestion``: flow-level bandwidth sharing instead of closed-form collective times.
    ``overlap_slowdown``: compute runs this fraction slower while its rank communicates.
    ``memory_trace``: a graph with tensors (e.g. the PyTorch ET of the same run) to model memory
    from when ``trace`` has none. ``what_if``: factors on modelled durations — ``device`` (device
    compute ops), ``host`` (host nodes), ``host_gap`` (host idle gaps), ``comm`` (transfer times),
    e.g. ``{"device": 0.5}`` for kernels twice as fast. ``align_ranks``: release every rank at time
    0 — the answer without rank skew — instead of at its first traced event on the job's clock
    (ranks that entered the step late then hold their peers in collectives, as they did in the
    run); the report states the skew replayed (``rank_skew_us``). ``contention``: an op timed by a
    fitted model runs slower while a transfer of its rank is in flight, by its class's fitted slope
    (see :mod:`.engine`; never measured durations); off in ASTRA-sim mode (``network`` and
    ``collectives``: ASTRA-sim has no such model) and with ``contention=False``. Raises :class:`~.engine.ReplayDeadlock` if the job cannot finish.
    """
    t0 = time.perf_counter()
    unknown = set(what_if or {}) - {"device", "host", "host_gap", "comm"}
    if unknown:
        raise ValueError(f"unknown what_if keys {sorted(unknown)} (device, host, host_gap, comm)")
    if not trace.graphs:
        raise TraceError(trace.meta.source or "<trace>", "the trace has no ranks to replay")
    mode, fit = _timing(timing)
    sysconf = load_system(collectives)
    # synthesized durations are estimates, re-timed for the chosen system — except in ASTRA-sim mode
    # (an ASTRA-sim system file, no --system, roofline off), where compute nodes take the file's
    # duration_micros as ASTRA-sim does
    astra_durations = collectives is not None and system is None and not sysconf.roofline_enabled
    if not astra_durations:
        trace = cm.without_estimates(trace)
    else:
        # nor the device's per-op stream gap an ettools Chakra file keeps beside duration_micros
        # (ASTRA-sim reads duration_micros alone)
        trace = _without_stream_gap(trace)
    hw = cm.load_hardware(system if system is not None else cm.hardware_from_trace(trace), trace.meta.world_size)
    if system is not None:
        hw["detected"] = f"--system {system}"
    net = load_network(network, sysconf, congestion=congestion)
    world = max(trace.meta.world_size, max(trace.graphs) + 1)
    if net is not None:
        try:
            net.check_ranks(world)
        except ValueError as e:
            raise TraceError(str(network), str(e)) from None
    astra = None
    if sysconf.roofline_enabled and sysconf.peak_tflops:
        bw = (sysconf.local_mem_bw_gbps or hw["hbm_gbps"]) * 1e9
        astra = (sysconf.peak_tflops * 1e12, bw)
        if mode == "measured":
            mode = "roofline"
    slow = float(overlap_slowdown if overlap_slowdown is not None else hw.get("overlap_slowdown", 0.0))
    preps = {}
    cache: dict[tuple, Any] = {}
    for r in trace.ranks:
        g = trace.graphs[r]
        preps[r] = prepare_rank(g, mode, hw, fit, astra, cache, what_if)
    t1 = time.perf_counter()
    ctimes = comm_times(trace, preps, net, hw)
    # flows of one representative would see only its class's traffic on shared links: no symmetry
    if symmetric is None:
        symmetric = astra_durations and network is not None
    use_sym = bool(symmetric) and not (net is not None and net.congestion)
    rep_of = symmetry_classes(trace, preps, ctimes, rank_releases(preps, None, align_ranks)) if use_sym else None
    built = build_program(trace, preps, net, hw, rep_of, ctimes, slow, align_ranks=align_ranks)
    if what_if and "comm" in what_if:
        built.program.inst_dur = built.program.inst_dur * float(what_if["comm"])
        loc = (built.program.kind == 0) & np.isin(built.program.inst, [-1])
        comm_rows = np.concatenate([np.isin(built.preps[r].graph.type, [5, 6, 7]) for r in built.sim_ranks])
        built.program.dur = np.where(loc & comm_rows, built.program.dur * float(what_if["comm"]), built.program.dur)
    # ASTRA-sim (network YAML + system JSON) has no contention model: agree with it there
    contention = contention and not (network is not None and collectives is not None)
    if not contention:
        built.program.contention = None
    t2 = time.perf_counter()
    flow = FlowNetwork(net) if net is not None and net.congestion else None
    schedule = simulate(built.program, flow)
    t3 = time.perf_counter()
    options = {"timing": timing, "symmetric": use_sym, "network_source": net.source if net else None,
               "congestion": bool(flow), "overlap_slowdown": slow, "align_ranks": bool(align_ranks),
               "contention": built.program.contention is not None}
    res = ReplayResult(trace, built, schedule, options, hw,
                       {"prepare_s": t1 - t0, "build_s": t2 - t1, "simulate_s": t3 - t2})
    if memory:
        from .memory import rank_memory

        t4 = time.perf_counter()
        res.memory = rank_memory(res, memory_trace)
        res.timings["memory_s"] = time.perf_counter() - t4
    return res
