"""Compute time of each node: measured, calibrated or roofline, chosen per node with a fallback chain.

Sources (``SOURCES``; the order is the fallback chain after the requested source):

* ``measured`` — the node's own duration, when the trace has one (Kineto, PyTorch ET + Kineto,
  Chakra ``duration_micros``, synthesized estimates);
* ``calibrated`` — a :class:`~.calibrate.Fit` (per op class, time as a function of FLOPs and bytes,
  fitted on a real trace and stored as a small JSON file);
* ``fitted`` — the shipped op cost model of the replay's GPU (:mod:`.opmodel`, fitted on real
  kernels of that GPU by ``python -m ettools.replay.data.make_op_models``; ``data/op_models/``);
* ``transferred`` — another GPU's fitted op model scaled by the hardware ratios (peak FLOP/s per
  dtype, memory bandwidth, SM count), for GPUs (or op classes) without their own fit;
* ``roofline`` — ``max(FLOPs / peak, bytes / memory bandwidth)`` from ``num_ops``/``tensor_size`` and
  a hardware description (ASTRA-sim's ``num_ops / min(peak, bw · num_ops / tensor_size)``);
* ``none`` — nothing known: 0 µs (counted, reported).

Host nodes (``is_cpu_op`` 1: framework ops, runtime calls, host gaps) always replay their measured
duration; the models apply to device ops and nodes of unknown placement.

FLOPs and bytes of a node come from :mod:`.features`; the hardware descriptions (presets, peaks,
the roofline) from :mod:`.devices`; the op models a GPU is timed with from :mod:`.opregistry`.
This module only chooses, per node, which source's time to use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph, Trace

# re-exported: callers (scaler, serve, tests, the CLI) import these from here
from .devices import (  # noqa: F401
    DEFAULT_HARDWARE,
    Hardware,
    hardware_from_trace,
    hardware_label,
    identify_device,
    load_hardware,
    peak_flops,
    presets,
    roofline_us,
)
from .features import is_model_target, node_features  # noqa: F401
from .opcols import graph_cols
from .opmodel import OpModel
from .opregistry import op_models_for, shipped_op_models  # noqa: F401

SOURCES = ("measured", "calibrated", "roofline", "none", "fitted", "transferred")
MEASURED, CALIBRATED, ROOFLINE, NONE, FITTED, TRANSFERRED = range(6)
# fallback order after the requested source: the GPU's own fitted op model, then another GPU's
# moved by hardware ratios, and the roofline only where neither can say
_FALLBACK = (MEASURED, CALIBRATED, FITTED, TRANSFERRED, ROOFLINE)


def _is_op_model(fit: Any) -> bool:
    return isinstance(fit, OpModel)


def _candidates(g: RankGraph, hw: Hardware, fit: Any, features: tuple[np.ndarray, np.ndarray],
                astra_roofline: tuple[float, float] | None,
                contention: dict[int, np.ndarray] | None = None) -> dict[int, np.ndarray]:
    """Per source code, each node's time under that source (NaN where it cannot say).

    ``contention``: filled with each op-model source's per-node contention slope (0 elsewhere)."""
    flops, nbytes = features
    measured = np.where(np.isfinite(g.dur) & (g.dur >= 0), g.dur, np.nan)
    cand: dict[int, np.ndarray] = {MEASURED: measured}
    cols_once: list[Any] = []

    def by_model(model: Any, code: int) -> np.ndarray:
        # the model targets' columns are built once for every op model of this graph
        if not cols_once:
            cols_once.append(graph_cols(g, flops, nbytes, hw))
        rows, cols = cols_once[0]
        out = np.full(len(g), np.nan)
        if len(rows):
            out[rows] = model.predict(cols)
        if contention is not None:
            c = np.zeros(len(g))
            if len(rows):
                c[rows] = model.contention(cols)
            contention[code] = c
        return out

    if fit is not None:
        cand[CALIBRATED] = by_model(fit, CALIBRATED) if _is_op_model(fit) \
            else fit.predict_graph(g, flops, nbytes)
    if astra_roofline is None:  # an ASTRA-sim system file asks for its own roofline
        own, moved = op_models_for(hw)
        if own is not None:
            cand[FITTED] = by_model(own, FITTED)
        if moved is not None:
            cand[TRANSFERRED] = by_model(moved, TRANSFERRED)
    if astra_roofline is not None:
        peak, bw = astra_roofline
        tf = np.where(flops >= 0, flops / peak, np.nan)
        tb = np.where(nbytes >= 0, nbytes / bw, np.nan)
        cand[ROOFLINE] = np.fmax(tf, tb) * 1e6
    else:
        gdt = (getattr(g, "meta", None) or {}).get("dtype")  # the graph's own math dtype (synthesized fp32)
        cand[ROOFLINE] = roofline_us(flops, nbytes, hw.replace(dtype=gdt) if gdt else hw)
        cdt = (getattr(g, "attrs", None) or {}).get("compute_dtype")
        if cdt is not None and len(cdt.rows):  # ops whose math runs another dtype (FP8 GEMMs)
            for d in sorted({str(v).lower() for v in cdt.values}):
                if not hw.peak_tflops.get(d):
                    raise ValueError(f"the trace has {d.upper()} GEMMs but {hw.label} has no {d.upper()} "
                                     f"tensor cores (its peak_tflops lists no {d})")
                rows = cdt.rows[np.array([str(v).lower() == d for v in cdt.values])]
                cand[ROOFLINE][rows] = roofline_us(flops[rows], nbytes[rows], hw.replace(dtype=d))
    return cand


def _chain(cand: dict[int, np.ndarray], timing: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first source of the fallback chain that knows each node's time."""
    first = {"measured": MEASURED, "calibrated": CALIBRATED, "roofline": ROOFLINE, "fitted": FITTED}[timing]
    chain = [first] + [s for s in _FALLBACK if s != first]
    tdur = np.full(n, np.nan)
    tsrc = np.full(n, NONE, np.int8)
    for s in reversed(chain):
        c = cand.get(s)
        if c is None:
            continue
        ok = np.isfinite(c) & (c >= 0)
        tdur = np.where(ok, c, tdur)
        tsrc = np.where(ok, s, tsrc)
    return tdur, tsrc


def nested_durations(source: RankGraph, timing: str, hw: Hardware, fit: Any = None,
                     astra_roofline: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(dur µs, source code)`` of each top-level op of a nested graph without measured times: the
    sum of the modelled times of its innermost ops (the ones that do the work: ``aten::linear``
    is its ``aten::addmm``), each timed by the fallback chain from its shapes. Rows that are not
    top-level get NaN; a top-level op whose innermost ops are all unknown gets ``NONE``."""
    n = len(source)
    src, dst, kind = source.edge_rows()
    nest = (kind == EdgeKind.NEST) & (src >= 0)
    parent = np.arange(n, dtype=np.int64)
    parent[dst[nest]] = src[nest]
    has_child = np.zeros(n, bool)
    has_child[src[nest]] = True
    root = parent.copy()
    for _ in range(64):  # pointer jumping: log2(depth) rounds
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    comm = np.isin(source.type, [int(x) for x in COMM_NODE_TYPES])
    leaf = ~has_child & ~comm & (source.type != NodeType.METADATA_NODE)
    cand = _candidates(source, hw, fit, node_features(source), astra_roofline)
    tdur, tsrc = _chain(cand, timing, n)
    ok = leaf & np.isfinite(tdur)
    total = np.bincount(root[ok], weights=tdur[ok], minlength=n)
    # the source that timed most of each top-level op's time
    code = np.full(n, NONE, np.int8)
    best = np.zeros(n)
    for c in _FALLBACK:
        sel = ok & (tsrc == c)
        t = np.bincount(root[sel], weights=tdur[sel], minlength=n)
        cnt = np.bincount(root[sel], minlength=n)
        take = (cnt > 0) & ((t > best) | (code == NONE))
        code[take] = c
        best = np.where(take, t, best)
    top = root == np.arange(n)
    out = np.where(top & (code != NONE), total, np.nan)
    return out, np.where(top, code, NONE).astype(np.int8)


def node_timing(g: RankGraph, timing: str, hw: Hardware, fit: Any = None,
                features: tuple[np.ndarray, np.ndarray] | None = None,
                astra_roofline: tuple[float, float] | None = None,
                source: RankGraph | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dur µs, source code, contention)`` per node for ``timing`` in
    ``measured``/``calibrated``/``roofline``.

    The requested source is tried first, then the rest of :data:`SOURCES` in order. Comm nodes get
    their measured duration (or NaN): the network decides their transfer time.
    ``astra_roofline``: ``(peak FLOP/s, bytes/s)`` from an ASTRA-sim system file, overriding ``hw``.
    ``source``: the nested graph ``g`` keeps only the top-level ops of (the fallback form); its
    unmeasured top-level ops then take :func:`nested_durations`.

    ``contention``: the slope ``c`` of the op-model class fit that timed the node (a kernel beside a
    collective kernel of its GPU runs ``1 + c`` times slower: :attr:`.opclass.ClassFit.contention`;
    the engine applies it while a transfer of the rank is in flight); 0 for every node whose time
    is measured (a captured kernel already ran beside the transfers it overlapped), timed by a
    calibration without a contention term, by the roofline, or by the summed nested ops of the
    fallback form.
    """
    n = len(g)
    cont = np.zeros(n)
    measured = np.where(np.isfinite(g.dur) & (g.dur >= 0), g.dur, np.nan)
    target = is_model_target(g)
    dur = measured.copy()
    src = np.where(np.isnan(measured), NONE, MEASURED).astype(np.int8)
    if not target.any():
        return (np.nan_to_num(dur, nan=0.0) if n else dur), src, cont
    if features is None:
        features = node_features(g)
    ccand: dict[int, np.ndarray] = {}
    cand = _candidates(g, hw, fit, features, astra_roofline, ccand)
    tdur, tsrc = _chain(cand, timing, n)
    own = np.ones(n, bool)  # timed by their own features (not by summed nested ops)
    if source is not None and source is not g and (source.dep_kind == EdgeKind.NEST).any():
        ndur, nsrc = nested_durations(source, timing, hw, fit, astra_roofline)
        rows = source.rows_of(g.id)
        okr = rows >= 0
        nd = np.full(n, np.nan)
        ns = np.full(n, NONE, np.int8)
        nd[okr] = ndur[rows[okr]]
        ns[okr] = nsrc[rows[okr]]
        # an unmeasured op with nested ops: their summed time (its own shapes would count its
        # children's work again, or miss it when it is a module-level op)
        use = target & np.isnan(measured) & np.isfinite(nd)
        tdur = np.where(use, nd, tdur)
        tsrc = np.where(use, ns, tsrc)
        own = ~use
    dur = np.where(target, tdur, dur)
    src = np.where(target, tsrc, src).astype(np.int8)
    for code, c in ccand.items():
        cont = np.where(target & own & (src == code), c, cont)
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    dur = np.where(comm, measured, np.nan_to_num(dur, nan=0.0))
    return dur, src, cont


def node_durations(g: RankGraph, timing: str, hw: Hardware, fit: Any = None,
                   features: tuple[np.ndarray, np.ndarray] | None = None,
                   astra_roofline: tuple[float, float] | None = None,
                   source: RankGraph | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(dur µs, source code)`` per node: :func:`node_timing` without the contention slopes."""
    dur, src, _ = node_timing(g, timing, hw, fit, features, astra_roofline, source)
    return dur, src


def estimated(g: RankGraph) -> bool:
    """Whether ``g``'s durations are a synthesizer's estimates (``meta["durations"] == "estimated"``,
    kept in a Chakra file's GlobalMetadata), not measurements."""
    return str(g.meta.get("durations", "")) == "estimated"


def without_estimates(trace: Trace) -> Trace:
    """``trace`` with estimated durations dropped: a node without a measured duration is timed by
    the compute model on the hardware of the replay (``--system``), a transfer by the network.
    Ranks that shared a duration array share its replacement (stamped ranks stay cheap)."""
    if not any(estimated(g) for g in trace.graphs.values()):
        return trace
    blank: dict[int, np.ndarray] = {}
    graphs = {}
    for r, g in trace.graphs.items():
        if estimated(g):
            d = g.dur
            nan = blank.get(id(d))
            if nan is None:
                nan = blank[id(d)] = np.full(len(g), np.nan)
            g = g.replace(dur=nan)
        graphs[r] = g
    return Trace(trace.meta, graphs, trace.strings)
