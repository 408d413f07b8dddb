"""Entry point of the replay: :func:`replay_trace`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.gcpause import no_gc
from ettools.graph import NodeType, Trace

from . import compute as cm
from .devices import Hardware
from .engine import ReplayDeadlock, simulate
from .flownet import FlowNetwork
from .network import load_network, load_system
from .prepare import prepare_rank
from .program import build_program, comm_times, rank_releases
from .report import ReplayResult
from .symmetry import symmetry_classes


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


def _retime_for_system(trace: Trace, hw: Hardware, system: str,
                       op_models: tuple[Any, Any] | None) -> tuple[Trace, dict[str, Any] | None]:
    """``trace`` with its measured device ops re-timed for ``hw`` when the trace was measured on
    another GPU (:mod:`.retime`), and what was done; a measured trace on its own GPU stays as it is
    (the summary says so)."""
    from .retime import BY_CLASS, BY_SHAPE, HOW, KEPT, retime_graph, with_fallback

    if any(cm.estimated(g) for g in trace.graphs.values()):
        return trace, None  # a compute model times these on ``hw`` anyway
    measured = [g for g in trace.graphs.values() if bool(((g.is_cpu_op != 1) & np.isfinite(g.dur)).any())]
    if not measured and any(bool((cm.is_model_target(g) & ~np.isfinite(g.dur)).any()) for g in trace.graphs.values()):
        return trace, None  # nothing measured on the device: the compute model times it on ``hw``
    # (a trace with some unmeasured ops: the measured device ops are re-timed, the others modelled)
    if not measured:
        raise ValueError(f"--system {system} changes nothing: the trace has no device op to re-time "
                         "(its times are measured host work)")
    found = cm.hardware_from_trace(trace)
    if not trace.meta.device_properties and str(found.detected or "").startswith("default"):
        return trace, {"from": None, "to": hw.label, "note":
                       "the trace names no GPU it was measured on: its device times are kept as measured"}
    src = cm.load_hardware(found, trace.meta.world_size)
    target = hw.label
    source = src.label
    if op_models is None and source == target and src.peak_tflops == hw.peak_tflops \
            and src.hbm_gbps == hw.hbm_gbps:
        return trace, {"from": source, "to": target, "note":
                       f"--system {system} is the GPU the trace was measured on: device times kept as measured"}
    if op_models is not None:
        src_models, dst_models = (op_models[0], None), (op_models[1], None)
    else:
        src_models, dst_models = cm.op_models_for(src), cm.op_models_for(hw)
    # a class one GPU has no fit of: the other GPU's own fit moved to it
    src_models, dst_models = (with_fallback(src_models, dst_models[0], src, source),
                              with_fallback(dst_models, src_models[0], hw, target))
    dtype = str(hw.dtype or "bf16")
    dtype = {"bf16": "half", "fp16": "half"}.get(dtype, dtype)
    graphs = {}
    total: dict[str, Any] = {}
    for r, g in trace.graphs.items():
        if cm.estimated(g):
            graphs[r] = g
            continue
        rt = retime_graph(g, source, target, src_models, dst_models, dtype)
        graphs[r] = g.replace(dur=np.where(rt.how != 0, rt.dur, g.dur))
        s = rt.summary()
        if not total:
            total = {"from": source, "to": target, "device_ops": 0, "device_us_measured": 0.0,
                     "device_us_retimed": 0.0, "retimed_us": 0.0, "us": {HOW[h]: 0.0 for h in (BY_SHAPE, BY_CLASS, KEPT)},
                     "ops": {HOW[h]: 0 for h in (BY_SHAPE, BY_CLASS, KEPT)}, "kept_ops": {}}
        total["device_ops"] += s["device_ops"]
        total["device_us_measured"] += s["device_us_measured"]
        total["device_us_retimed"] += s["device_us_retimed"]
        moved = (rt.how == BY_SHAPE) | (rt.how == BY_CLASS)
        total["retimed_us"] += float(rt.dur[moved].sum())
        for k, v in s["share_of_device_time"].items():
            total["us"][k] += v * s["device_us_measured"]
        for k, v in s["ops"].items():
            total["ops"][k] += v
        for k, v in s["kept_ops"].items():
            total["kept_ops"][k] = total["kept_ops"].get(k, 0.0) + v
    if not total or not total["device_ops"]:
        raise ValueError(f"--system {system} changes nothing: the trace has no measured device op to re-time")
    tm = total["device_us_measured"]
    total["share_of_device_time"] = {k: (v / tm if tm else 0.0) for k, v in total.pop("us").items()}
    total["kept_ops"] = dict(sorted(total["kept_ops"].items(), key=lambda kv: (-kv[1], kv[0]))[:20])
    total["host"] = "kept as measured (the same program's host work; the target machine's CPU is not modelled)"
    # which op model timed each GPU: its own fit, or another GPU's moved to it (a borrowed model)
    total["op_models"] = {source: op_model_origin(src_models, source), target: op_model_origin(dst_models, target)}
    if not trace.meta.device_properties and found.detected:
        total["source_detected"] = str(found.detected)  # inferred (kernel names, synthesizer): say how
    return Trace(trace.meta, graphs, trace.strings), total


def op_model_origin(models: tuple[Any, ...], gpu: str) -> str:
    """How ``gpu``'s op model came about: its own fit, another GPU's fit moved to it, or its own
    fit with some classes borrowed (lacking, or fitted on too few sizes) from other GPUs' fits."""
    live = [m for m in models if m is not None]
    if not live:
        return "none"

    def borrowed(m: Any, but: str | None) -> str:
        by: dict[str, list[str]] = {}
        for k, c in m.classes.items():
            name = k.removesuffix("_shaped")
            if c.transferred_from and c.transferred_from != but and name not in by.get(c.transferred_from, []):
                by.setdefault(c.transferred_from, []).append(name)
        return "; ".join(f"{', '.join(v)} from the {d} fit moved to it" for d, v in sorted(by.items()))

    moved = next((s["transferred_from"] for s in live[0].sources if "transferred_from" in s), None)
    if moved and moved != gpu:
        rest = borrowed(live[0], moved)
        return (f"no fit of its own: the {moved} fit moved to it by the data sheet (memory-bound "
                "kernels by the closed memory loop where both GPUs share an architecture)"
                + (f"; {rest} (classes the {moved} fit lacks or fitted on too few sizes)" if rest else ""))
    lent = borrowed(live[0], None)  # classes the shipped fit itself took from another GPU's (decode attention)
    rest = borrowed(live[1], None) if len(live) > 1 and live[1].gpu == gpu else ""
    return ("its own fit" + (f"; {lent} (its kernels measured none)" if lent else "")
            + (f"; {rest} (classes it lacks or fitted on too few sizes)" if rest else ""))


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
    op_models: tuple[Any, Any] | None = None,
) -> ReplayResult:
    """Replay ``trace`` on a described cluster and return a :class:`~.report.ReplayResult`.

    ``system``: hardware preset name (A100, H100, H200, B200, MI300X), JSON file or dict (see
    :func:`.devices.load_hardware`; default: the preset the trace's device properties name, with
    their memory size, else H100). ``network``: ASTRA-sim network YAML (or a link
    graph JSON); None keeps measured communication times and models the rest with the hardware's
    default network. ``collectives``: ASTRA-sim system JSON (algorithms per dimension, dataset
    splits, ``peak-perf``/``local-mem-bw`` for roofline). ``timing``: ``measured``,
    ``calibrated:PATH`` or ``roofline`` (first choice per node, then the fallback chain).
    ``symmetric``: simulate one representative of each class of provably symmetric ranks (not with
    a congestion-aware network, whose shared links couple every rank's traffic); None (default) and
    True: on (the classes are proven on exactly what the simulation reads: a measured trace keeps
    every rank, a synthesized plan collapses to its distinct positions). A deadlock is reported from
    the same replay with every rank simulated.
    ``congestion``: flow-level bandwidth sharing instead of closed-form collective times.
    ``overlap_slowdown``: device compute progresses at ``1/(1 + overlap_slowdown)`` of its rate while a
    transfer of its rank is in flight (the contention rule of :mod:`.engine` with this slope, added to
    a fitted one); host ops are not slowed.
    ``memory_trace``: a graph with tensors (e.g. the PyTorch ET of the same run) to model memory
    from when ``trace`` has none. ``what_if``: factors on modelled durations — ``device`` (device
    compute ops), ``host`` (host nodes), ``host_gap`` (host idle gaps), ``comm`` (transfer times),
    e.g. ``{"device": 0.5}`` for kernels twice as fast. ``align_ranks``: release every rank at time
    0 — the answer without rank skew — instead of at its first traced event on the job's clock
    (ranks that entered the step late then hold their peers in collectives, as they did in the
    run); the report states the skew replayed (``rank_skew_us``). ``contention``: an op timed by a
    fitted model runs slower while a transfer of its rank is in flight, by its class's fitted slope
    (see :mod:`.engine`; never measured durations); off in ASTRA-sim mode (``network`` and
    ``collectives``: ASTRA-sim has no such model) and with ``contention=False``. ``op_models``:
    ``(source GPU's, target GPU's)`` :class:`~.opmodel.OpModel` to re-time a measured trace for
    ``system`` with, instead of the shipped fits (a benchmark's held-out fits). Raises
    :class:`~.engine.ReplayDeadlock` if the job cannot finish; ``ValueError`` for a what-if that
    would change nothing (a factor of 1, ``system`` on a trace with no measured device op).
    """
    t0 = time.perf_counter()
    again = dict(trace=trace, system=system, network=network, collectives=collectives, timing=timing,
                 congestion=congestion, overlap_slowdown=overlap_slowdown, memory=memory, memory_trace=memory_trace,
                 what_if=what_if, align_ranks=align_ranks, contention=contention, op_models=op_models)
    unknown = set(what_if or {}) - {"device", "host", "host_gap", "comm"}
    if unknown:
        raise ValueError(f"unknown what_if keys {sorted(unknown)} (device, host, host_gap, comm)")
    for k, v in (what_if or {}).items():
        if not (np.isfinite(float(v)) and 0.0 <= float(v) <= 1e6):
            raise ValueError(f"what-if {k}={v} is out of range: a finite factor from 0 to 1e6")
    same = sorted(k for k, v in (what_if or {}).items() if float(v) == 1.0)
    if same:
        raise ValueError(f"what-if {', '.join(f'{k}=1' for k in same)} changes nothing: give a factor other than 1")
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
    retiming: dict[str, Any] | None = None
    if system is not None:
        hw = hw.replace(detected=f"--system {system}")
        trace, retiming = _retime_for_system(trace, hw, str(system), op_models)
    net = load_network(network, sysconf, congestion=congestion)
    world = max(trace.meta.world_size, max(trace.graphs) + 1)
    if net is not None:
        try:
            net.check_ranks(world)
        except ValueError as e:
            raise TraceError(str(network), str(e)) from None
    astra = None
    if sysconf.roofline_enabled and sysconf.peak_tflops:
        bw = (sysconf.local_mem_bw_gbps or hw.hbm_gbps) * 1e9
        astra = (sysconf.peak_tflops * 1e12, bw)
        if mode == "measured":
            mode = "roofline"
    slow = float(overlap_slowdown if overlap_slowdown is not None else hw.overlap_slowdown or 0.0)
    preps = {}
    cache: dict[tuple, Any] = {}
    for r in trace.ranks:
        g = trace.graphs[r]
        preps[r] = prepare_rank(g, mode, hw, fit, astra, cache, what_if)
    t1 = time.perf_counter()
    ctimes = comm_times(trace, preps, net, hw)
    # on by default: the classes are a proof (:mod:`.symmetry`), and a plan of thousands of ranks has
    # a handful; flows of one representative would see only its class's traffic on shared links
    if symmetric is None:
        symmetric = True
    use_sym = bool(symmetric) and not (net is not None and net.congestion)
    rep_of = symmetry_classes(trace, preps, ctimes, rank_releases(preps, None, align_ranks)) if use_sym else None
    with no_gc():
        built = build_program(trace, preps, net, hw, rep_of, ctimes, align_ranks=align_ranks)
    del ctimes  # 8 bytes a node the program has taken what it needs from: not kept through the loop
    if what_if and "comm" in what_if:
        built.program.inst_dur = built.program.inst_dur * float(what_if["comm"])
        loc = (built.program.kind == 0) & np.isin(built.program.inst, [-1])
        comm_rows = np.concatenate([np.isin(built.preps[r].graph.type, [5, 6, 7]) for r in built.sim_ranks])
        built.program.dur = np.where(loc & comm_rows, built.program.dur * float(what_if["comm"]), built.program.dur)
    # ASTRA-sim (network YAML + system JSON) has no contention model: agree with it there
    contention = contention and not (network is not None and collectives is not None)
    if not contention:
        built.program.contention = None
    if slow > 0:  # the user's slowdown of device compute beside a transfer: one more contention slope
        prog = built.program
        device = np.concatenate([(built.preps[r].graph.is_cpu_op == 0) & (built.preps[r].graph.type == NodeType.COMP_NODE)
                                 for r in built.sim_ranks] or [np.zeros(0, bool)]) & (prog.kind == 0)
        prog.contention = (prog.contention if prog.contention is not None else 0.0) + np.where(device, slow, 0.0)
    t2 = time.perf_counter()
    flow = FlowNetwork(net) if net is not None and net.congestion else None
    try:
        with no_gc():
            schedule = simulate(built.program, flow)
    except ReplayDeadlock:
        if len(built.sim_ranks) == len(preps):
            raise
        # the report names every rank that waits: the same replay with every rank simulated says it
        return replay_trace(symmetric=False, **again)
    t3 = time.perf_counter()
    options = {"timing": timing, "symmetric": use_sym, "retiming": retiming, "network_source": net.source if net else None,
               "network_fitted_on": getattr(net, "fitted_on", "") or None,
               "congestion": bool(flow), "overlap_slowdown": slow, "align_ranks": bool(align_ranks),
               "contention": built.program.contention is not None, "what_if": dict(what_if or {})}
    res = ReplayResult(trace, built, schedule, options, hw,
                       {"prepare_s": t1 - t0, "build_s": t2 - t1, "simulate_s": t3 - t2})
    if memory:
        from .memory import rank_memory

        t4 = time.perf_counter()
        res.memory = rank_memory(res, memory_trace)
        res.timings["memory_s"] = time.perf_counter() - t4
    if what_if and res.measured_step_time_us is None:
        # no measured step to compare with: the same replay without the what-if is the baseline
        base = replay_trace(trace, system, network, collectives, timing, symmetric, congestion, overlap_slowdown,
                            False, None, None, align_ranks, contention, op_models)
        options["what_if_baseline_us"] = base.step_time_us
    return res
